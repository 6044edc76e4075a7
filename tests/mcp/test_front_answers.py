"""`convmem serve`'s stdio front answers `tools/list`, `ping` and the memory tools' calls before
the SDK is imported, byte for byte as the SDK answers them (issue 13: the first tool reply).

- Differential, with real `convmem serve` subprocesses on copies of one store: the same script
  (every memory tool with valid and invalid arguments, escapes and non-ASCII text, ids of both
  kinds, a repeated id, cancellations, `tools/list`, `ping`; then requests only the SDK serves:
  an unknown tool, odd ids, malformed params) is answered once by a server whose open is held
  back (agent.yaml a FIFO) so that the front answers everything it may, and once with the front
  kept to the handshake (`CONVMEM_FRONT_CALLS=0`: the SDK answers every request, one at a time).
  The answer lines must be the same bytes once message ids (renamed in order) and the clock's
  timestamps are masked; the front must have answered every request before the SDK-only ones,
  and every write must be in the store exactly once afterwards (none replayed to the SDK).
- The JSON text of a result is what the SDK's serialiser writes, for every code point.
- The official SDK client, in both eras, is answered by the front and sees the same results.
- The path to the first tool reply (the front, the store, the registry) loads neither the SDK
  nor pydantic, anyio or jsonschema.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp_helpers import ERAS, child_env, serve_args
from test_fast_call import normalised
from test_mcp_serve_front import CAPABILITIES_KEY, INFO_KEY, VERSION_KEY, discover, initialize

from convmem_engine.runtime.front import ENV_SWITCH
from convmem_engine.runtime.front_plan import LOG_LEVEL_KEY, _json_text, answer_for
from convmem_engine.service import MemoryService
from convmem_engine.storage import Store
from convmem_engine.tools import ToolRegistry

pytestmark = pytest.mark.posix  # FIFOs

ROOT = Path(__file__).resolve().parent.parent.parent
MODERN_META = {
    VERSION_KEY: "2026-07-28",
    INFO_KEY: {"name": "front-test", "version": "1"},
    CAPABILITIES_KEY: {},
}
TIMESTAMP = re.compile(r"(?<![0-9])1[0-9]{12}(?![0-9])")
INITIALIZED = b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'

Step = tuple[bytes, int]
"""Bytes to send and how many answer lines they get."""


def rpc(request_id: object, method: str, params: Any = None) -> bytes:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        body["params"] = params
    return json.dumps(body).encode() + b"\n"  # ASCII: every non-ASCII character escaped


def cancel(request_id: object) -> bytes:
    params = {"requestId": request_id, "reason": "test"}
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params})


class Script:
    def __init__(self, modern: bool) -> None:
        self.modern = modern

    def params(self, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
        if not self.modern:
            return params
        return {**(params or {}), "_meta": MODERN_META}

    def call(self, request_id: object, name: str, arguments: Any = None) -> bytes:
        params: dict[str, Any] = {"name": name}
        if arguments is not None:
            params["arguments"] = arguments
        return rpc(request_id, "tools/call", self.params(params))


def scripts(modern: bool, ids: list[str]) -> tuple[list[Step], list[Step]]:
    """(what the front answers, what only the SDK answers) on the store `prepared` made."""
    s = Script(modern)
    c = s.call
    first, second, third = ids
    write = {"session_id": "s", "role": "user", "content": "héllo wörld ✓ \U0001f600"}
    metadata = json.dumps({"tags": ["a", "b"], "importance": 5, "summary": "ß"})
    # 2026-07-28: a log level for the request in the envelope (the MCP Inspector sends one)
    leveled = {"_meta": {**MODERN_META, LOG_LEVEL_KEY: "debug"}}
    search = {"name": "search_messages", "arguments": {"query": "needle"}}
    logged: list[Step] = [
        (rpc("inspector-ext-1", "tools/list", leveled), 1),
        (rpc(39, "tools/call", search | leveled), 1),
        (rpc(40, "tools/call", {"name": "write_message", "arguments": write} | leveled), 1),
    ]
    front: list[Step] = [
        *([] if modern else [(INITIALIZED, 0)]),
        (rpc("l-1", "tools/list", s.params()), 1),
        (rpc(0, "ping", s.params()), 1),
        *([] if modern else [(rpc("l-2", "tools/list", {}), 1), (rpc(-1, "ping", {}), 1)]),
        (c(10, "write_message", write), 1),
        (c("w-2", "write_message", write | {"content": 'say "hi"\n\t\\ \u0000 end'}), 1),
        (c("7", "write_message", write | {"metadata_json": metadata}), 1),
        (c(2**53 - 1, "write_message", write | {"content": "x" * 5000}), 1),
        (c(-3, "write_message", write | {"content": "needle in a haystack"}), 1),
        (c("req-1.2:3_x", "write_message", write | {"role": "assistant"}), 1),
        (c(11, "write_message", {"session_id": "s", "role": "user"}), 1),
        (c(12, "write_message", write | {"role": "robot"}), 1),
        (c(13, "write_message", write | {"content": 5}), 1),
        (c(14, "write_message", write | {"extra": True}), 1),
        (c(15, "write_message", write | {"metadata_json": "{not json"}), 1),
        (c(16, "write_message", {}), 1),
        (c(17, "write_message"), 1),  # no arguments at all
        (c(18, "read_messages", {"view": "sessions"}), 1),
        (c(19, "read_messages", {"view": "history", "session_id": "s", "limit": 50}), 1),
        (c(20, "read_messages", {"view": "history", "session_id": "s", "limit": 0}), 1),
        (c(21, "read_messages", {"view": "nonsense"}), 1),
        (c(22, "search_messages", {"query": "needle"}), 1),
        (c(23, "search_messages", {"query": "wörld", "limit": 2, "context_size": 1}), 1),
        (c(24, "search_messages", {"query": ""}), 1),
        (c(25, "search_messages", {"query": "x", "filters_json": "[1]"}), 1),
        (c(26, "update_message", {"message_id": first, "content": "new ✓"}), 1),
        (c(27, "update_message", {"message_id": first, "content": "x", "expected_revision": 1}), 1),
        (c(28, "update_message", {"message_id": "not-a-ulid", "content": "x"}), 1),
        (c(29, "read_messages", {"message_id": third}), 1),
        (c(30, "delete_message", {"message_id": second}), 1),
        (c(31, "delete_message", {"message_id": second}), 1),
        (c(32, "delete_message", {"message_id": 12}), 1),
        (c(33, "get_system_health", {"verbose": True}), 1),
        (c(34, "get_system_health", {}), 1),
        (c(35, "rebuild_index", {"force": 1}), 1),
        (c(36, "rebuild_index", {}), 1),
        (c(37, "read_messages", {"view": "context", "message_id": third}), 1),
        # cancelled in the same breath: never answered (the ping after it is)
        (
            c(44, "read_messages", {"view": "sessions"})
            + cancel(44).encode()
            + b"\n"
            + rpc(45, "ping", s.params()),
            1,
        ),
        (
            c("46", "read_messages", {"view": "history", "session_id": "s"})
            + cancel(46).encode()
            + b"\n"
            + rpc(47, "ping", s.params()),
            1,
        ),
        (cancel(999).encode() + b"\n" + rpc(48, "ping", s.params()), 1),
        (c(10, "read_messages", {"view": "sessions"}), 1),  # an id seen before
        (c(49, "read_messages", {"view": "sessions"}), 1),
        *(logged if modern else []),
    ]
    badly_leveled = {"_meta": {**MODERN_META, LOG_LEVEL_KEY: "verbose"}}
    not_a_level = {"_meta": {**MODERN_META, LOG_LEVEL_KEY: {"level": "debug"}}}
    sdk_only: list[Step] = [
        *([(rpc(42, "tools/list", not_a_level), 1)] if modern else []),  # (the first left)
        *([(rpc(41, "tools/list", badly_leveled), 1)] if modern else []),
        (c(50, "no_such_tool", {}), 1),
        (c(51, "write_message", [1, 2]), 1),
        (rpc(52, "tools/call", s.params({"name": 5, "arguments": {}})), 1),
        (c("a b", "read_messages", {"view": "sessions"}), 1),
        (c(2**60, "read_messages", {"view": "sessions"}), 1),
        (rpc(53, "tools/list", s.params({"cursor": "x"})), 1),
        (c(54, "write_message", write | {"content": "after the hand-over"}), 1),
    ]
    return front, sdk_only


def prepared(folder: Path) -> list[str]:
    """A store with three messages (one with metadata); their ids."""
    with MemoryService.open(folder) as service:
        registry = ToolRegistry.for_service(service)
        ids = []
        for i, content in enumerate(["alpha", "beta needle", "gamma"]):
            arguments = {"session_id": "pre", "role": "user", "content": content}
            if i == 2:
                arguments["metadata_json"] = json.dumps({"tags": ["t"]})
            result = registry.result("write_message", arguments)
            assert not result.is_error, result
            ids.append(json.loads(result.text)["message"]["message_id"])
    return ids


class Served:
    """`convmem serve --log-level INFO` on `data_dir`, driven by raw lines."""

    def __init__(self, data_dir: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *serve_args(data_dir, "--log-level", "INFO")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def lines(self, n: int) -> list[bytes]:
        assert self.proc.stdout is not None
        out = []
        for _ in range(n):
            line = self.proc.stdout.readline()
            assert line, f"the server ended its output (exit {self.proc.poll()})"
            out.append(line)
        return out

    def finish(self) -> tuple[bytes, str, int]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        assert self.proc.stderr is not None
        self.proc.stdin.close()
        rest, err = self.proc.stdout.read(), self.proc.stderr.read()
        status = self.proc.wait(120)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return rest, err.decode(), status


def answered_by_front(err: str) -> int:
    found = re.findall(r"front: answered (\d+) request\(s\)", err)
    return int(found[0]) if found else 0


def run_front(data_dir: Path, first: bytes, front: list[Step], sdk_only: list[Step]) -> tuple:
    """Everything written while the open is held: the front answers all it may, in order."""
    fifo = data_dir / "agent.yaml"
    os.mkfifo(fifo, 0o600)
    server = Served(data_dir, child_env())
    server.send(first + b"\n")
    found = answer_for(first)
    assert found is not None
    assert server.lines(1) == [found[1]]
    server.send(b"".join(data for data, _ in front + sdk_only))
    fd = os.open(fifo, os.O_WRONLY)  # the open goes on: the front gets the service
    try:
        os.write(fd, b"enabled: false\n")
    finally:
        os.close(fd)
    head = server.lines(sum(n for _, n in front))
    tail = server.lines(sum(n for _, n in sdk_only))
    rest, err, status = server.finish()
    assert status == 0, err
    assert rest == b"", rest
    return head, tail, err


def run_sdk(data_dir: Path, first: bytes, front: list[Step], sdk_only: list[Step]) -> tuple:
    """The same, the SDK answering every request after the handshake, one step at a time."""
    server = Served(data_dir, child_env() | {ENV_SWITCH: "0"})
    server.send(first + b"\n")
    assert server.lines(1) == [answer_for(first)[1]]  # type: ignore[index]
    head = []
    for data, n in front:
        server.send(data)
        head.extend(server.lines(n))
    server.send(b"".join(data for data, _ in sdk_only))
    tail = server.lines(sum(n for _, n in sdk_only))
    rest, err, status = server.finish()
    assert status == 0, err
    assert rest == b"", rest
    return head, tail, err


def comparable(head: list[bytes], tail: list[bytes]) -> list[str]:
    """Message ids renamed in order (the tail's answers in id order: the SDK serves them
    concurrently), the clock's timestamps masked."""
    tail = sorted(tail, key=lambda line: json.dumps(json.loads(line)["id"]))
    return [TIMESTAMP.sub("TS", text) for text in normalised(head + tail)]


@pytest.mark.parametrize("era", ["handshake", "2026-07-28"])
def test_the_front_answers_byte_for_byte_what_the_sdk_answers(tmp_path: Path, era: str) -> None:
    modern = era != "handshake"
    ids = prepared(tmp_path / "store")
    front, sdk_only = scripts(modern, ids)
    first = discover(request_id="d-1") if modern else initialize(request_id="i-1")
    for name in ("front", "sdk"):
        shutil.copytree(tmp_path / "store", tmp_path / name)
    ours = run_front(tmp_path / "front", first, front, sdk_only)
    theirs = run_sdk(tmp_path / "sdk", first, front, sdk_only)
    assert answered_by_front(theirs[2]) == 0
    # the front answered every request before the SDK-only ones (the two cancelled calls
    # never answered), the SDK the rest
    assert answered_by_front(ours[2]) == sum(n for _, n in front), ours[2]
    assert "answering failed" not in ours[2]  # each line left to the SDK by plan, none by error
    mine, sdk = comparable(ours[0], ours[1]), comparable(theirs[0], theirs[1])
    assert len(mine) == len(sdk)
    for a, b in zip(mine, sdk, strict=True):
        assert a == b
    # each acknowledged write is stored once: nothing the front answered reached the SDK
    for name in ("front", "sdk"):
        with Store.open(tmp_path / name) as store:
            contents = [m.content for m in store.messages.values()]
        assert contents.count("after the hand-over") == 1
        assert contents.count("x" * 5000) == 1
        assert contents.count("needle in a haystack") == 1
        writes = 6 if era == "handshake" else 7  # (2026-07-28: the write with a log level)
        assert len(contents) == 3 - 1 + writes + 1, contents


def test_the_json_text_of_a_result_is_the_sdk_serialisers_for_every_code_point() -> None:
    import pydantic_core

    for code in [*range(0xD800), *range(0xE000, 0x110000, 7), 0x10FFFF]:
        text = "a" + chr(code) + '\\"z'
        assert _json_text(text) == pydantic_core.to_json(text), hex(code)
    assert _json_text("\ud800") == b'"\\ud800"'  # a lone surrogate: escaped, as the fallback


def test_the_path_to_the_first_tool_reply_loads_no_sdk(tmp_path: Path) -> None:
    """The front, the store, the agent part and the registry: a handshake and a tool call are
    answered with neither the MCP SDK nor pydantic, anyio or jsonschema loaded."""
    code = f"""
import json, os, sys
from pathlib import Path
from convmem_engine.runtime.front import StdioFront
from convmem_engine.service import MemoryService
from convmem_engine.agent.part import AgentPart
from convmem_engine.tools import ToolRegistry
in_r, in_w = os.pipe(); out_r, out_w = os.pipe()
data_dir = Path({str(tmp_path / "data")!r})
front = StdioFront(in_r, out_w, data_dir=data_dir, answer_requests=True)
service = MemoryService.open(data_dir, on_locked=front.start)
os.write(in_w, {initialize()!r} + b"\\n" + {INITIALIZED!r})
os.write(in_w, b'{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":'
               b'"get_system_health","arguments":{{}}}}}}\\n')
part = AgentPart(); part.start_on(data_dir, service)
front.serve_tools(ToolRegistry.for_service(service), agent_enabled=False)
with os.fdopen(out_r, "rb") as out:
    assert json.loads(out.readline())["id"] == 1
    answer = json.loads(out.readline())
assert answer["id"] == 2 and not answer["result"]["isError"], answer
heavy = ("mcp", "mcp_types", "pydantic", "pydantic_core", "anyio", "jsonschema", "yaml")
print(" ".join(sorted({{m.split(".")[0] for m in sys.modules}} & set(heavy))))
part.stop(); service.close(); os._exit(0)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"loaded on the way to the first reply: {out.stdout}"


@pytest.mark.parametrize("mode", ERAS)
def test_the_official_client_is_answered_by_the_front_in_both_eras(
    tmp_path: Path, mode: str
) -> None:
    """The SDK client's own requests (tools/list, tool calls, each era's envelope) are plain
    enough for the front: it answers them, and the client sees the same tools and results."""
    import anyio
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    data_dir = tmp_path / "data"
    params = StdioServerParameters(
        command=sys.executable,
        args=serve_args(data_dir, "--log-level", "INFO"),
        env=child_env(),
        cwd=str(ROOT),
    )

    async def scenario() -> None:
        with (tmp_path / "serve.err").open("w") as errlog:
            async with Client(stdio_client(params, errlog=errlog), mode=mode) as client:
                tools = await client.list_tools()
                assert len(tools.tools) == 7
                written = await client.call_tool(
                    "write_message", {"session_id": "c", "role": "user", "content": "hello ✓"}
                )
                assert not written.is_error, written
                health = json.loads(payload_text(await client.call_tool("get_system_health", {})))
                assert health["active_messages"] == 1

    anyio.run(scenario)
    assert answered_by_front((tmp_path / "serve.err").read_text()) >= 2
    with Store.open(data_dir) as store:
        assert [m.content for m in store.messages.values()] == ["hello ✓"]


def payload_text(result: Any) -> str:
    return str(result.content[0].text)
