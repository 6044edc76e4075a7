"""The server in memory with the SDK's `Client(server)`: schemas, annotations, envelope, eras."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client import Client
from mcp.shared.exceptions import MCPError
from mcp_helpers import call, call_error, payload

from convmem_engine.domain import limits
from convmem_engine.domain.errors import ValidationError
from convmem_engine.domain.message import MEMORY_KINDS, RELATION_TYPES, ROLES
from convmem_engine.mcp import build_server
from convmem_engine.service import MemoryService
from convmem_engine.tools import INSTRUCTIONS, MEMORY_TOOLS, validate_arguments

TOOLS_BY_NAME = {tool.name: tool for tool in MEMORY_TOOLS}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[MemoryService]:
    svc = MemoryService.open(tmp_path / "data")
    try:
        yield svc
    finally:
        svc.close()


def prop(tool: str, name: str) -> dict[str, Any]:
    schema: dict[str, Any] = TOOLS_BY_NAME[tool].input_schema["properties"][name]
    return schema


def test_every_schema_is_strict() -> None:
    assert [t.name for t in MEMORY_TOOLS] == [
        "write_message",
        "update_message",
        "read_messages",
        "search_messages",
        "delete_message",
        "rebuild_index",
        "get_system_health",
    ]
    for tool in MEMORY_TOOLS:
        schema = tool.input_schema
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        assert set(schema.get("required", ())) <= set(schema["properties"])
        for name, spec in schema["properties"].items():
            assert spec["type"] in ("string", "integer"), (tool.name, name)
            assert spec["description"], (tool.name, name)
        assert len(tool.description) > 200, tool.name


def test_bounds_are_the_limits_of_the_tool_reference() -> None:
    assert TOOLS_BY_NAME["write_message"].input_schema["required"] == [
        "session_id",
        "role",
        "content",
    ]
    assert prop("write_message", "role")["enum"] == list(ROLES)
    assert prop("write_message", "content")["maxLength"] == limits.CONTENT_MAX_BYTES
    assert prop("write_message", "session_id")["maxLength"] == limits.SESSION_ID_MAX_BYTES
    assert prop("update_message", "expected_revision")["minimum"] == limits.EXPECTED_REVISION_MIN
    limit = prop("read_messages", "limit")
    assert (limit["minimum"], limit["maximum"], limit["default"]) == (1, 1000, 100)
    piece = prop("read_messages", "content_limit")
    assert (piece["minimum"], piece["maximum"], piece["default"]) == (1, 65536, 4096)
    assert prop("read_messages", "view")["enum"] == ["history", "content", "context", "sessions"]
    assert prop("read_messages", "before")["maximum"] == limits.CONTEXT_NEIGHBOURS_MAX
    assert prop("read_messages", "relation_depth")["maximum"] == limits.RELATION_DEPTH_MAX
    assert prop("search_messages", "query")["maxLength"] == limits.QUERY_MAX_BYTES
    assert prop("search_messages", "context_size")["maximum"] == limits.SEARCH_CONTEXT_MAX
    search_limit = prop("search_messages", "limit")
    assert (search_limit["maximum"], search_limit["default"]) == (100, 20)
    assert prop("delete_message", "message_id")["maxLength"] == limits.ULID_LENGTH
    assert TOOLS_BY_NAME["rebuild_index"].input_schema["properties"] == {}
    for kind in MEMORY_KINDS:
        assert kind in TOOLS_BY_NAME["write_message"].description
    for relation in RELATION_TYPES:
        assert relation in prop("read_messages", "relation_types_json")["description"]


def test_annotations_and_instructions(service: MemoryService) -> None:
    async def scenario() -> None:
        async with Client(build_server(service), mode="legacy") as client:
            assert client.instructions == INSTRUCTIONS
            tools = {t.name: t for t in (await client.list_tools()).tools}
        for name in ("read_messages", "search_messages", "get_system_health"):
            hints = tools[name].annotations
            assert hints is not None and hints.read_only_hint is True
        for name in ("update_message", "delete_message", "rebuild_index"):
            hints = tools[name].annotations
            assert hints is not None and hints.destructive_hint is True
            assert hints.read_only_hint is False and hints.idempotent_hint is True
        write = tools["write_message"].annotations
        assert write is not None and write.destructive_hint is False
        assert write.idempotent_hint is False and write.read_only_hint is False
        assert all(t.annotations and t.annotations.open_world_hint is False for t in tools.values())

    anyio.run(scenario)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_both_eras_in_memory(service: MemoryService, mode: str) -> None:
    async def scenario() -> None:
        async with Client(build_server(service), mode=mode) as client:
            written = await call(
                client, "write_message", session_id="s", role="system", content="c"
            )
            mid = written["message"]["message_id"]
            result = await client.call_tool("delete_message", {"message_id": mid})
            assert result.is_error is False and payload(result) == {"status": "OK"}
            again = await client.call_tool("delete_message", {"message_id": mid})
            assert again.is_error is False and payload(again) == {"status": "NOT_FOUND"}
            with pytest.raises(MCPError):
                await client.call_tool("no_such_tool", {})

    anyio.run(scenario)


def test_text_is_the_exact_service_result(service: MemoryService) -> None:
    async def scenario() -> None:
        async with Client(build_server(service)) as client:
            result = await client.call_tool("get_system_health", {})
            block = result.content[0]
            assert block.type == "text"
            assert json.loads(block.text) == service.get_system_health()
            assert result.structured_content is None

    anyio.run(scenario)


def test_unexpected_failure_is_internal_error_without_details(
    service: MemoryService, caplog: pytest.LogCaptureFixture
) -> None:
    """A service that has been closed under the server: INTERNAL_ERROR, nothing leaked."""
    server = build_server(service)
    service.close()

    async def scenario() -> None:
        async with Client(server) as client:
            error = await call_error(
                client, "write_message", session_id="s", role="user", content="private words"
            )
            assert error["code"] == "INTERNAL_ERROR"
            assert "private words" not in error["message"]

    anyio.run(scenario)
    assert "private words" not in caplog.text


def test_validation_messages_name_field_and_rule_never_the_value() -> None:
    secret = "TOPSECRET"
    cases: list[tuple[str, dict[str, Any], str]] = [
        (
            "write_message",
            {"session_id": "s", "role": "user"},
            "content: required",
        ),
        (
            "write_message",
            {"session_id": secret, "role": secret, "content": "x"},
            "role: must be one of user, assistant, system",
        ),
        (
            "write_message",
            {"session_id": "", "role": "user", "content": "x"},
            "session_id: must not be empty",
        ),
        (
            "write_message",
            {"session_id": "s" * 257, "role": "user", "content": "x"},
            "session_id: must be at most 256 UTF-8 bytes",
        ),
        (
            "update_message",
            {"message_id": secret},
            "message_id: must be a canonical 26-character ULID",
        ),
        (
            "update_message",
            {"message_id": "0" * 26, "expected_revision": 0},
            "expected_revision: must be at least 1",
        ),
        (
            "search_messages",
            {"query": "q", "min_importance": 101},
            "min_importance: must be between 0 and 100",
        ),
        (
            "search_messages",
            {"query": 5},
            "query: must be a string",
        ),
        (
            "write_message",
            {"session_id": "s", "role": "user", "content": "c", "metadata_json": None},
            "metadata_json: must be a string (omit the argument to use its default)",
        ),
        (
            "read_messages",
            {"before": -1},
            "before: must be between 0 and 10",
        ),
        (
            "rebuild_index",
            {"force": True},
            "unknown argument force: not accepted (allowed arguments: none)",
        ),
        (
            "get_system_health",
            {secret * 20: 1},
            "unknown argument: not accepted",
        ),
        (
            "write_message",
            {"session_id": "s", "role": "user", "content": "bad \ud800"},
            "content: must be valid UTF-8 text",
        ),
    ]
    for tool, arguments, expected in cases:
        with pytest.raises(ValidationError) as caught:
            validate_arguments(TOOLS_BY_NAME[tool], arguments)
        assert expected in caught.value.message, (tool, caught.value.message)
        assert secret not in caught.value.message
        assert caught.value.code == "VALIDATION_ERROR"


def test_many_problems_are_reported_together_but_bounded() -> None:
    arguments = {f"x{i}": i for i in range(50)} | {"query": 1, "limit": "a"}
    with pytest.raises(ValidationError) as caught:
        validate_arguments(TOOLS_BY_NAME["search_messages"], arguments)
    message = caught.value.message
    assert "query: must be a string" in message and "limit: must be an integer" in message
    assert message.count(";") <= 5


def test_no_tracing_middleware_without_a_tracer_provider(service: MemoryService) -> None:
    """With no OpenTelemetry SDK configured the SDK's span per request records nothing; the
    server leaves that middleware out (it cost ~4% of the CPU of a write) and still serves."""
    server = build_server(service)
    assert not [m for m in server.middleware if type(m).__name__ == "OpenTelemetryMiddleware"]

    async def run() -> None:
        async with Client(server) as client:
            data = await call(client, "get_system_health")
            assert data["status"] == "OK"

    anyio.run(run)
