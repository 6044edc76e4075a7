"""Each parameter's two faces agree: the JSON Schema generated from its kind and the kind's
check (seed 000 tables, bound +-1).

Every tool parameter is declared once (`convmem_engine.tools.memory`); its kind yields both the
schema fragment a host sees and the check the registry runs. For every parameter of every tool,
a set of boundary and wrong-type values is judged by the generated schema (`check_schema`) and
by the kind's check alone. Both must accept or both must reject, except for the rules JSON
Schema cannot express, each listed in `_inherent`. Then the same values go through the real
server with the SDK's in-memory client: the answer is the registry's in-process verdict
(`ToolRegistry.call`: schema, checks, the MemoryService operation).
Error messages never contain the value (hypothesis fuzz at the end).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.client import Client
from mcp_helpers import payload

from convmem_engine.domain.errors import ConvMemError, ValidationError
from convmem_engine.mcp import build_server
from convmem_engine.service import MemoryService
from convmem_engine.tools import MEMORY_TOOLS, ToolRegistry
from convmem_engine.tools.arguments import check_schema

MISSING_ID = "7ZZZZZZZZZZZZZZZZZZZZZZZZZ"

TOOLS_BY_NAME = {tool.name: tool for tool in MEMORY_TOOLS}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[MemoryService]:
    svc = MemoryService.open(tmp_path / "data")
    try:
        yield svc
    finally:
        svc.close()


def _base(mid: str) -> dict[str, dict[str, Any]]:
    """Valid arguments for each tool that change nothing durable (read_messages uses the
    sessions view, which validates every argument and needs none)."""
    return {
        "write_message": {"session_id": "s", "role": "user", "content": "x"},
        "update_message": {"message_id": mid, "content": "hello"},
        "read_messages": {"view": "sessions"},
        "search_messages": {"query": "hello"},
        "delete_message": {"message_id": MISSING_ID},
        "rebuild_index": {},
        "get_system_health": {},
    }


def _values(spec: dict[str, Any], mid: str) -> list[Any]:
    out: list[Any] = [True, False, 1.5, 1.0, [], {}, None]
    if spec["type"] == "integer":
        lo, hi = spec["minimum"], spec.get("maximum")
        out += ["1", lo - 1, lo, lo + 1, 10**20, -(10**20)]
        if hi is not None:
            out += [hi - 1, hi, hi + 1]
        return out
    out += [0, "", " ", "a", "é", "\x00", "[]", "{}", "null", "\ud800"]
    top = spec.get("maxLength")
    if top is not None:
        out += ["a" * (top - 1), "a" * top, "a" * (top + 1), "é" * (top // 2), "é" * top]
    if "enum" in spec:
        out += [*spec["enum"], spec["enum"][0].upper(), spec["enum"][0] + " "]
    if "pattern" in spec:
        out += [mid, mid.lower(), "8" + mid[1:], "I" * 26, mid[:-1], mid + "0"]
    return out


def _inherent(name: str, value: Any, message: str) -> bool:
    """Rules the checks apply that a flat JSON Schema cannot state."""
    if isinstance(value, str) and "UTF-8 bytes" in message:
        return len(value.encode("utf-8", "surrogatepass")) > len(value)  # bytes, not chars
    return name.endswith("_json") and "JSON" in message  # what the JSON inside the string says


def _schema_verdict(tool: str, args: dict[str, Any]) -> bool:
    try:
        check_schema(TOOLS_BY_NAME[tool].validator, args)
    except ValidationError:
        return False
    return True


def _kind_verdict(tool: str, args: dict[str, Any]) -> str:
    """The declared checks alone: required parameters present, each value its kind's check."""
    spec = TOOLS_BY_NAME[tool]
    for param in spec.params:
        if param.required and param.name not in args:
            return f"VALIDATION_ERROR: {param.name}: required"
    try:
        for name, value in args.items():
            spec.param(name).check(value)
    except ValidationError as exc:
        return "VALIDATION_ERROR: " + exc.message
    return "OK"


def _call_verdict(registry: ToolRegistry, tool: str, args: dict[str, Any]) -> str:
    """In-process, everything a call runs: schema, checks, the operation."""
    try:
        registry.call(tool, args)
    except ValidationError as exc:
        return "VALIDATION_ERROR: " + exc.message
    except ConvMemError as exc:
        return exc.code  # e.g. NOT_FOUND: valid arguments
    return "OK"


def _cases(service: MemoryService) -> list[tuple[str, str, dict[str, Any]]]:
    """(tool, parameter under test, arguments)."""
    mid = service.write_message(session_id="s", role="user", content="hello")["message"][
        "message_id"
    ]
    base = _base(mid)
    cases: list[tuple[str, str, dict[str, Any]]] = []
    for tool, spec in TOOLS_BY_NAME.items():
        required = spec.input_schema.get("required", ())
        for name, prop in spec.input_schema["properties"].items():
            for value in _values(prop, mid):
                args = dict(base[tool])
                if value is None:
                    if name in required:
                        args.pop(name)
                    else:
                        continue
                else:
                    args[name] = value
                cases.append((tool, name, args))
    return cases


def test_schema_and_checks_agree_on_every_boundary(service: MemoryService) -> None:
    disagreements = []
    cases = _cases(service)
    for tool, name, args in cases:
        schema_ok = _schema_verdict(tool, args)
        verdict = _kind_verdict(tool, args)
        checks_ok = not verdict.startswith("VALIDATION_ERROR")
        if schema_ok == checks_ok:
            continue
        message = verdict.removeprefix("VALIDATION_ERROR: ")
        if not schema_ok or not _inherent(name, args.get(name), message):
            shown = {k: (v[:40] if isinstance(v, str) else v) for k, v in args.items()}
            disagreements.append((tool, shown, schema_ok, verdict[:120]))
    assert disagreements == []
    assert len(cases) > 300


def test_the_server_answers_with_the_in_process_verdict(service: MemoryService) -> None:
    """Through the real server (SDK in-memory client): a rejected value is the seed's
    VALIDATION_ERROR envelope; an accepted one reaches the service."""
    registry = ToolRegistry.for_service(service)
    server = build_server(registry)
    cases = [
        (tool, args)
        for tool, _name, args in _cases(service)
        if tool not in ("write_message", "update_message", "rebuild_index")  # keep state
        and not any(isinstance(v, str) and len(v) > 5000 for v in args.values())
    ]
    assert len(cases) > 150

    async def scenario() -> None:
        async with Client(server) as client:
            for tool, args in cases:
                expected = _call_verdict(registry, tool, args)
                result = await client.call_tool(tool, args)
                data = payload(result)
                if expected.startswith("VALIDATION_ERROR"):
                    assert result.is_error is True, (tool, args)
                    assert data["status"] == "ERROR"
                    assert data["error"]["code"] == "VALIDATION_ERROR", (tool, args)
                elif expected == "OK":
                    assert result.is_error is False, (tool, args, data)
                else:
                    assert data["error"]["code"] == expected

    anyio.run(scenario)


# -- error messages never echo the value -----------------------------------------------------

MARK = "\u2063Qz"  # an invisible separator + letters no error message contains


def _marked(s: str) -> str:
    return MARK + s + MARK


def _fields_to_fuzz(mid: str, value: str) -> list[tuple[str, dict[str, Any]]]:
    """(tool, arguments) with `value` (wrong in some way) in one place each."""
    md = [
        {"tool_call_id": value * 300},
        {"tags": [value * 200]},
        {"tags": [value, 5]},
        {"memory_tier": value},
        {"memory_kind": value},
        {"importance": value},
        {"summary": value * 5000},
        {"relations": [{"type": value, "message_id": mid}]},
        {"relations": [{"type": "related_to", "message_id": value}]},
        {"source_message_ids": [value]},
    ]
    write = {"session_id": "s", "role": "user", "content": "c"}
    cases: list[tuple[str, dict[str, Any]]] = [
        ("write_message", {**write, "metadata_json": json.dumps(m)}) for m in md
    ]
    cases += [
        ("write_message", {**write, "session_id": value * 300}),
        ("write_message", {**write, "role": value}),
        ("write_message", {**write, "metadata_json": value}),
        ("write_message", {**write, "metadata_json": json.dumps([value])}),
        ("update_message", {"message_id": value, "content": "c"}),
        ("update_message", {"message_id": mid, "metadata_json": "{" + value}),
        ("read_messages", {"view": value}),
        ("read_messages", {"cursor": value, "session_id": "s"}),
        ("read_messages", {"view": "context", "message_id": mid, "relation_types_json": value}),
        (
            "read_messages",
            {"view": "context", "message_id": mid, "relation_types_json": json.dumps([value])},
        ),
        ("search_messages", {"query": value * 5000}),
        ("search_messages", {"query": "q", "filters_json": json.dumps({"kinds": [value]})}),
        ("search_messages", {"query": "q", "filters_json": json.dumps({"tags": [value * 200]})}),
        ("search_messages", {"query": "q", "filters_json": value}),
        ("delete_message", {"message_id": value}),
        ("delete_message", {"message_id": mid, "session_id": value * 300}),
    ]
    return cases


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.text(min_size=0, max_size=12))
def test_error_messages_never_contain_the_input(service: MemoryService, raw: str) -> None:
    value = _marked(raw)
    mid = MISSING_ID
    registry = ToolRegistry.for_service(service)
    for tool, args in _fields_to_fuzz(mid, value):
        messages = []
        try:
            check_schema(TOOLS_BY_NAME[tool].validator, args)
        except ValidationError as exc:
            messages.append(exc.message)
        verdict = _kind_verdict(tool, args)
        if verdict != "OK":
            messages.append(verdict)
        try:
            registry.call(tool, args)
        except ConvMemError as exc:
            messages.append(exc.message)
        assert messages, (tool, args)  # every case is wrong somehow
        for message in messages:
            assert MARK not in message, (tool, message)
            assert value not in message
