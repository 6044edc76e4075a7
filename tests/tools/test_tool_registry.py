"""The tool registry with a real MemoryService: lookup, in-process calls, results in both
styles, more tools with their own context, and an MCP server built from it (SDK client)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client import Client

from convmem_engine.domain.errors import NotFoundError, ValidationError
from convmem_engine.mcp import build_server
from convmem_engine.service import MemoryService
from convmem_engine.tools import (
    INSTRUCTIONS,
    MEMORY_TOOLS,
    Annotations,
    Custom,
    Integer,
    Param,
    Text,
    ToolRegistry,
    ToolResult,
    ToolSpec,
    UnknownToolError,
)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[MemoryService]:
    svc = MemoryService.open(tmp_path / "data")
    try:
        yield svc
    finally:
        svc.close()


class Counter:
    """A context of another kind than the service, as the agent's tools will have."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def bump(self, args: dict[str, Any]) -> str:
        self.calls.append(args)
        return f"count: {len(self.calls)}\nnote: {args.get('note', '')}"


def _bump(counter: Counter, args: dict[str, Any]) -> str:
    return counter.bump(args)


def _missing(counter: Counter, args: dict[str, Any]) -> str:
    raise NotFoundError("task_id: no such task")


def _broken(counter: Counter, args: dict[str, Any]) -> str:
    raise RuntimeError(args["note"])  # a message quoting the input


def _not_text(counter: Counter, args: dict[str, Any]) -> Any:
    return {"not": "text"}


def _text_tool(name: str, handler: Any) -> ToolSpec[Counter]:
    return ToolSpec(
        name=name,
        title=name.title(),
        description=f"A text tool ({name}).",
        params=(
            Param("note", Text(16, min_bytes=1), "A short note.", required=True),
            Param("times", Integer(1, 3), "How often.", default=1),
        ),
        annotations=Annotations(read_only=False, destructive=False, idempotent=False),
        handler=handler,
        result_style="text",
    )


def test_the_memory_registry(service: MemoryService) -> None:
    registry = ToolRegistry.for_service(service)
    assert registry.names == tuple(t.name for t in MEMORY_TOOLS)
    assert len(registry) == 7 and registry.specs == MEMORY_TOOLS
    assert "read_messages" in registry and "nope" not in registry
    spec = registry.get("search_messages")
    assert spec is not None and spec.annotations.read_only and spec.result_style == "json"
    assert registry.get("nope") is None
    assert registry.instructions == INSTRUCTIONS


def test_call_in_process_runs_the_service_and_raises_domain_errors(
    service: MemoryService,
) -> None:
    registry = ToolRegistry.for_service(service)
    written = registry.call("write_message", {"session_id": "s", "role": "user", "content": "hi"})
    mid = written["message"]["message_id"]
    assert registry.call("read_messages", {"session_id": "s"}) == service.read_messages(
        session_id="s"
    )
    with pytest.raises(ValidationError) as caught:
        registry.call("write_message", {"session_id": "s", "role": "robot", "content": "x"})
    assert caught.value.message == "role: must be one of user, assistant, system"
    with pytest.raises(NotFoundError):
        registry.call("update_message", {"message_id": "7" * 26, "content": "x"})
    with pytest.raises(UnknownToolError) as unknown:
        registry.call("no_such_tool", {})
    assert unknown.value.message.startswith("unknown tool: name must be one of write_message")
    assert registry.call("delete_message", {"message_id": mid}) == {"status": "OK"}


def test_results_are_one_json_text_block(service: MemoryService) -> None:
    registry = ToolRegistry.for_service(service)
    ok = registry.result("get_system_health", {})
    assert ok.is_error is False and json.loads(ok.text)["status"] == "OK"
    bad = registry.result("search_messages", {"query": ""})
    assert bad == ToolResult(
        json.dumps(
            {
                "status": "ERROR",
                "error": {"code": "VALIDATION_ERROR", "message": "query: must not be empty"},
            },
            separators=(",", ":"),
            ensure_ascii=False,
        ),
        is_error=True,
    )


def test_more_tools_with_their_own_context_and_text_results(service: MemoryService) -> None:
    memory = ToolRegistry.for_service(service)
    counter = Counter()
    registry = memory.with_tools(
        [
            _text_tool("bump", _bump),
            _text_tool("missing", _missing),
            _text_tool("broken", _broken),
            _text_tool("not_text", _not_text),
        ],
        counter,
    )
    assert len(memory) == 7 and "bump" not in memory  # the original is unchanged
    assert registry.names[:7] == memory.names and registry.names[7] == "bump"
    assert registry.instructions == INSTRUCTIONS
    assert registry.result("bump", {"note": "a"}) == ToolResult("count: 1\nnote: a", False)
    assert counter.calls == [{"note": "a"}]
    assert registry.result("bump", {"note": "a", "times": 9}) == ToolResult(
        "error: VALIDATION_ERROR\nmessage: times: must be between 1 and 3", True
    )
    assert registry.result("missing", {"note": "a"}) == ToolResult(
        "error: NOT_FOUND\nmessage: task_id: no such task", True
    )
    assert registry.call("search_messages", {"query": "x"}) == {"results": []}
    with pytest.raises(ValueError, match="registered twice"):
        registry.with_tools([_text_tool("bump", _bump)], counter)
    with pytest.raises(ValueError, match="declared twice"):
        ToolSpec(
            name="twice",
            title="Twice",
            description="",
            params=(Param("a", Integer(0), "a"), Param("a", Integer(0), "a")),
            annotations=Annotations(read_only=True, destructive=False, idempotent=True),
            handler=_bump,
        )
    renamed = memory.with_tools([], None, instructions="other")
    assert renamed.instructions == "other" and renamed.names == memory.names


def test_unexpected_failures_are_internal_errors_logged_without_message(
    service: MemoryService, caplog: pytest.LogCaptureFixture
) -> None:
    registry = ToolRegistry.for_service(service).with_tools(
        [_text_tool("broken", _broken), _text_tool("not_text", _not_text)], Counter()
    )
    with caplog.at_level(logging.ERROR):
        for name in ("broken", "not_text"):
            result = registry.result(name, {"note": "secret words"})
            assert result == ToolResult(
                f"error: INTERNAL_ERROR\nmessage: {name} failed unexpectedly; see the log", True
            )
    assert "RuntimeError" in caplog.text and "TypeError" in caplog.text
    assert "secret words" not in caplog.text


def test_an_mcp_server_built_from_a_registry_serves_every_tool(service: MemoryService) -> None:
    counter = Counter()
    registry = ToolRegistry.for_service(service).with_tools([_text_tool("bump", _bump)], counter)

    async def scenario() -> None:
        async with Client(build_server(registry)) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            assert list(listed) == list(registry.names)
            bump = listed["bump"]
            assert bump.input_schema == registry.get("bump").input_schema  # type: ignore[union-attr]
            assert bump.annotations is not None and bump.annotations.destructive_hint is False
            result = await client.call_tool("bump", {"note": "hello"})
            assert result.is_error is False
            assert [(b.type, b.text) for b in result.content] == [  # type: ignore[union-attr]
                ("text", "count: 1\nnote: hello")
            ]
            failed = await client.call_tool("bump", {})
            assert failed.is_error is True
            assert failed.content[0].text == (  # type: ignore[union-attr]
                "error: VALIDATION_ERROR\nmessage: note: required"
            )
            health = await client.call_tool("get_system_health", {})
            assert json.loads(health.content[0].text)["status"] == "OK"  # type: ignore[union-attr]

    anyio.run(scenario)


def _check_uuid(value: object, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) != 36:
        raise ValidationError(f"{name}: must be a UUID")
    return value


def test_a_custom_kind_gives_its_schema_and_its_check(service: MemoryService) -> None:
    """An argument no built-in kind describes (seed 002's nullable UUID): the fragment goes into
    the schema as given, the check runs after the schema's."""
    spec = ToolSpec(
        name="status",
        title="Status",
        description="A text tool with a nullable UUID.",
        params=(
            Param(
                "task_id",
                Custom({"type": ["string", "null"], "format": "uuid"}, _check_uuid),
                "Task UUID.",
                required=True,
            ),
        ),
        annotations=Annotations(read_only=True, destructive=False, idempotent=True),
        handler=lambda _ctx, args: f"task_id: {args['task_id']}",
        result_style="text",
    )
    assert spec.input_schema["properties"]["task_id"] == {
        "description": "Task UUID.",
        "type": ["string", "null"],
        "format": "uuid",
    }
    registry = ToolRegistry.for_service(service).with_tools([spec], None)
    uuid = "2a8105cc-84f9-4d37-a5bd-e48e04654eb7"
    assert registry.call("status", {"task_id": uuid}) == f"task_id: {uuid}"
    assert registry.call("status", {"task_id": None}) == "task_id: None"
    with pytest.raises(ValidationError) as caught:
        registry.call("status", {"task_id": 5})
    assert caught.value.message == "task_id: must be a string or null"
    with pytest.raises(ValidationError) as caught:
        registry.call("status", {"task_id": "x"})
    assert caught.value.message == "task_id: must be a UUID"
