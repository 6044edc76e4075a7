"""The line transport's `tools/call` fast path (convmem_engine/mcp/fast_call.py) answers byte
for byte what the SDK answers.

The same scripts of requests (every tool with valid and invalid arguments, an unknown tool,
malformed calls, both protocol eras, string and integer ids, `_meta` with a progress token,
cancellation, a second handshake) run through a real line session on a real MemoryService twice:
with the fast path, and with it switched off (`CONVMEM_MCP_FAST_PATH=0`: every request goes
through the SDK). The answer lines must be the same bytes, once the message ids (ULIDs, random
per store) are renamed in order of appearance; the clock is fixed. The fast path must actually
have served the valid calls, and the SDK the rest.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import errno
import json
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
import ulid

from convmem_engine.mcp import build_server, fast_call, serve_chunks
from convmem_engine.mcp.line_transport import Lane
from convmem_engine.service import ChangeEvent, MemoryService
from convmem_engine.storage import FileSystem
from convmem_engine.tools import Annotations, Param, Text, ToolRegistry, ToolSpec

FIXED_MS = 1_790_000_000_000
ULID = re.compile(r"\b[0-7][0-9A-HJKMNP-TV-Z]{25}\b")
BASE64 = re.compile(r"[A-Za-z0-9_\-]{30,}")
SIZES = re.compile(r'(\\"(?:\w*_bytes|bytes_\w+|\w+_size)\\":)\d+')
MODERN = {
    types.PROTOCOL_VERSION_META_KEY: "2026-07-28",
    types.CLIENT_CAPABILITIES_META_KEY: {},
    types.CLIENT_INFO_META_KEY: {"name": "identity", "version": "1"},
}

CAPS = types.CLIENT_CAPABILITIES_META_KEY

Step = Callable[[dict[str, Any]], tuple[bytes, int]]
"""Given the answers so far (by id), the bytes to send and how many answer lines they get."""


def line(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode() + b"\n"


def request(request_id: object, method: str, params: Any = None, **extra: Any) -> bytes:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        body["params"] = params
    return line(body | extra)


def call(request_id: object, name: str, arguments: Any = None, meta: Any = None) -> bytes:
    params: dict[str, Any] = {"name": name}
    if arguments is not None:
        params["arguments"] = arguments
    if meta is not None:
        params["_meta"] = meta
    return request(request_id, "tools/call", params)


def notification(method: str, params: dict[str, Any] | None = None) -> bytes:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        body["params"] = params
    return line(body)


def message_id(answers: dict[Any, dict[str, Any]], request_id: object) -> str:
    text = answers[request_id]["result"]["content"][0]["text"]
    return str(json.loads(text)["message"]["message_id"])


def fixed(data: bytes, n: int = 1) -> Step:
    return lambda _answers: (data, n)


def memory_tool_steps(meta: Any, prefix: str) -> list[Step]:
    """Every memory tool, valid and invalid arguments, ids of both kinds, all through
    `tools/call` with `meta` as `params._meta`."""

    def c(request_id: object, name: str, arguments: Any = None) -> Step:
        return fixed(call(request_id, name, arguments, meta))

    session = f"{prefix}-s"
    write = {"session_id": session, "role": "user", "content": "héllo wörld ✓ \U0001f600"}
    metadata = json.dumps({"tags": ["a", "b"], "importance": 5})
    steps: list[Step] = [
        c(10, "write_message", write),
        c("w-2", "write_message", write | {"role": "assistant", "content": 'say "hi"\n\t\\'}),
        c("7", "write_message", write | {"metadata_json": metadata}),
        c(2**62, "write_message", write | {"content": "x" * 5000}),
        c(-3, "write_message", write | {"content": "needle in a haystack"}),
        # invalid arguments: the tool's VALIDATION_ERROR envelope
        c(11, "write_message", {"session_id": session, "role": "user"}),
        c(12, "write_message", write | {"role": "robot"}),
        c(13, "write_message", write | {"content": 5}),
        c(14, "write_message", write | {"extra": True}),
        c(15, "write_message", write | {"metadata_json": "{not json"}),
        c(16, "write_message", {}),
        c(17, "write_message"),  # no arguments at all
        c(18, "read_messages", {"view": "sessions"}),
        c(19, "read_messages", {"view": "history", "session_id": session, "limit": 3}),
        c(20, "read_messages", {"view": "history", "session_id": session, "limit": 0}),
        c(21, "read_messages", {"view": "nonsense"}),
        c(22, "search_messages", {"query": "needle"}),
        c(23, "search_messages", {"query": "wörld", "limit": 2, "context_size": 1}),
        c(24, "search_messages", {"query": ""}),
        c(25, "search_messages", {"query": "x", "filters_json": "[1]"}),
        lambda a: (
            call(26, "update_message", {"message_id": message_id(a, 10), "content": "new"}, meta),
            1,
        ),
        lambda a: (
            call(
                27,
                "update_message",
                {"message_id": message_id(a, 10), "content": "again", "expected_revision": 1},
                meta,
            ),
            1,
        ),
        c(28, "update_message", {"message_id": "not-a-ulid", "content": "x"}),
        lambda a: (call(29, "read_messages", {"message_id": message_id(a, "7")}, meta), 1),
        lambda a: (call(30, "delete_message", {"message_id": message_id(a, "w-2")}, meta), 1),
        lambda a: (call(31, "delete_message", {"message_id": message_id(a, "w-2")}, meta), 1),
        c(32, "delete_message", {"message_id": 12}),
        c(33, "get_system_health", {"verbose": True}),
        c(49, "get_system_health", {}),
        c(34, "rebuild_index", {"force": 1}),
        c(35, "rebuild_index", {}),
        c(36, "read_messages", {"view": "sessions"}),
        # not for the fast path: the SDK answers, and must answer the same either way
        c(37, "no_such_tool", {}),
        c(38, "write_message", [1, 2]),
        fixed(request(39, "tools/call", {"arguments": {}, "_meta": meta} if meta else {})),
        fixed(request(40, "tools/call", {"name": 5, "arguments": {}})),
        fixed(request(41, "tools/call")),  # no params
        fixed(request(42, "tools/call", {"name": "read_messages", "arguments": {}}, extra=1)),
        fixed(request(1.5, "tools/call", {"name": "read_messages"})),
        fixed(request(True, "tools/call", {"name": "read_messages"})),
        fixed(b'{"jsonrpc":"2.0","id":43,"method":"tools/call","params":{"name":"read_messages"\n'),
        # cancelled in the same breath: never answered (the ping after it is)
        fixed(
            call(44, "read_messages", {"view": "sessions"}, meta)
            + notification("notifications/cancelled", {"requestId": 44, "reason": "test"})
            + request(45, "ping", {"_meta": meta} if meta else None)
        ),
        fixed(
            call("46", "read_messages", {"view": "sessions"}, meta)
            + notification("notifications/cancelled", {"requestId": 46})
            + request(47, "ping", {"_meta": meta} if meta else None)
        ),
        fixed(
            notification("notifications/cancelled", {"requestId": 999})
            + request(48, "ping", {"_meta": meta} if meta else None)
        ),
    ]
    # the same id twice in a row (the first answered before the second is sent)
    steps.append(c(10, "read_messages", {"view": "sessions"}))
    return steps


def progress(meta: dict[str, Any] | None, token: object) -> dict[str, Any]:
    return (meta or {}) | {"progressToken": token}


def legacy_script() -> list[Step]:
    init = {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "identity", "version": "1"},
    }
    write = {"session_id": "p", "role": "user", "content": "with progress"}
    return [
        fixed(call(1, "read_messages", {"view": "sessions"})),  # before the handshake
        fixed(request("init", "initialize", init)),
        fixed(notification("notifications/initialized") + request(2, "ping")),
        fixed(request(3, "tools/list")),
        *memory_tool_steps(None, "legacy"),
        fixed(call(60, "write_message", write, progress(None, "tok-1"))),
        fixed(call(61, "read_messages", {"view": "sessions"}, progress(None, 7))),
        fixed(call(62, "read_messages", {"view": "sessions"}, {"progressToken": True})),
        fixed(call(63, "read_messages", {"view": "sessions"}, {"other": [1]})),
        fixed(call(64, "read_messages", {"view": "sessions"}, MODERN)),  # refused: legacy
        fixed(call(65, "read_messages", {"view": "sessions"}, "not an object")),
        # a second handshake: the session is the SDK's from now on, answers still equal
        fixed(request("init-2", "initialize", init | {"protocolVersion": "2025-11-25"})),
        fixed(call(66, "read_messages", {"view": "sessions"})),
    ]


def modern_script() -> list[Step]:
    no_info = {k: v for k, v in MODERN.items() if k != types.CLIENT_INFO_META_KEY}
    old = MODERN | {types.PROTOCOL_VERSION_META_KEY: "2025-11-25"}
    unknown = MODERN | {types.PROTOCOL_VERSION_META_KEY: "2099-01-01"}
    no_caps = {k: v for k, v in MODERN.items() if k != types.CLIENT_CAPABILITIES_META_KEY}
    odd_caps = MODERN | {CAPS: []}
    sessions = {"view": "sessions"}
    return [
        fixed(request(1, "server/discover", {"_meta": MODERN})),
        fixed(request(2, "tools/list", {"_meta": MODERN})),
        *memory_tool_steps(MODERN, "modern"),
        fixed(call(60, "read_messages", sessions, no_info)),
        fixed(call(61, "read_messages", sessions, progress(MODERN, "tok"))),
        fixed(call(62, "read_messages", sessions)),  # no envelope on a modern session
        fixed(call(63, "read_messages", sessions, old)),
        fixed(call(64, "read_messages", sessions, unknown)),
        fixed(call(65, "read_messages", sessions, no_caps)),
        fixed(call(66, "read_messages", sessions, odd_caps)),
        fixed(call(67, "read_messages", sessions, MODERN | {"io.modelcontextprotocol/x": 1})),
        fixed(call(70, "read_messages", sessions, MODERN | {types.CLIENT_INFO_META_KEY: "x"})),
        fixed(call(71, "read_messages", sessions, MODERN | {types.CLIENT_INFO_META_KEY: None})),
        fixed(call(72, "read_messages", sessions, MODERN | {CAPS: {"sampling": 5}})),
        fixed(call(73, "read_messages", sessions, MODERN | {types.PROTOCOL_VERSION_META_KEY: 7})),
        fixed(request(68, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}})),
        fixed(call(69, "read_messages", sessions, MODERN)),
    ]


async def run_script(
    server: Any, steps: list[Step], inline: bool = False, lane: str = ""
) -> list[bytes]:
    """Send each step once the answers to the ones before it are in; every answer line.
    `inline`: writes alone in the session may be served on the loop (as for a runtime's only
    client). `lane`: each step's bytes are offered to the session's lane first (as the pipe
    bridge's reader does), and queued for `read_chunk` only when it refuses them; "refusing":
    the lane's output takes every other answer only (as a full stdout pipe would not)."""
    inbox: asyncio.Queue[bytes] = asyncio.Queue()
    out: list[bytes] = []
    answers: dict[Any, dict[str, Any]] = {}
    arrived = asyncio.Event()

    async def read_chunk() -> bytes:
        return await inbox.get()

    def record(data: bytes) -> None:
        out.append(data)
        answer = json.loads(data)
        answers[answer.get("id")] = answer
        arrived.set()

    offered = 0

    def send_now(data: bytes) -> bool:
        nonlocal offered
        offered += 1
        if lane == "refusing" and offered % 2:
            return False
        record(data)
        return True

    async def send(data: bytes) -> None:
        record(data)

    the_lane = Lane(lambda: True, send_now) if lane else None

    async def drive() -> None:
        for step in steps:
            data, expected = step(answers)
            want = len(out) + expected
            if the_lane is None or not inbox.empty() or not the_lane.offer(data):
                inbox.put_nowait(data)
            with anyio.fail_after(30):
                while len(out) < want:
                    arrived.clear()
                    await arrived.wait()
        inbox.put_nowait(b"")

    async with anyio.create_task_group() as tg:
        tg.start_soon(drive)
        await serve_chunks(
            server, read_chunk, send, inline=(lambda: True) if inline else None, lane=the_lane
        )
    return out


def normalised(lines: list[bytes]) -> list[str]:
    """Rename message ids in order of appearance, also inside cursors (base64 of JSON), and
    mask the byte counts of health and rebuild_index: a store's own figures (memory estimates
    from object sizes, compacted sizes) that differ by a few bytes from store to store
    whichever path served the call."""
    names: dict[str, str] = {}

    def rename(match: re.Match[str]) -> str:
        return names.setdefault(match.group(0), f"ID{len(names):03d}")

    def cursor(match: re.Match[str]) -> str:
        token = match.group(0)
        try:
            decoded = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        except ValueError:
            return token
        if not ULID.search(decoded):
            return token
        return base64.urlsafe_b64encode(ULID.sub(rename, decoded).encode()).decode()

    out = []
    for data in lines:
        assert data.endswith(b"\n") and data.count(b"\n") == 1
        text = ULID.sub(rename, BASE64.sub(cursor, data.decode()))
        out.append(SIZES.sub(lambda m: m.group(1) + "0", text))
    return out


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tool names the fast path served (on the loop: "inline:" and the name; on the
    line transport's lane: "lane:" and the name)."""
    served: list[str] = []
    start = fast_call.FastCallSession.start
    serve_inline = fast_call.FastCallSession.serve_inline

    def counting(self: fast_call.FastCallSession, call: fast_call.FastCall) -> None:
        served.append(call.name)
        start(self, call)

    async def counting_inline(self: fast_call.FastCallSession, call: fast_call.FastCall) -> None:
        served.append(f"inline:{call.name}")
        await serve_inline(self, call)

    def counting_lane(self: fast_call.FastCallSession, call: fast_call.FastCall) -> None:
        served.append(f"lane:{call.name}")
        answer(self, call)

    answer = fast_call.FastCallSession.answer
    monkeypatch.setattr(fast_call.FastCallSession, "start", counting)
    monkeypatch.setattr(fast_call.FastCallSession, "serve_inline", counting_inline)
    monkeypatch.setattr(fast_call.FastCallSession, "answer", counting_lane)
    return served


def transcript(
    tmp_path: Path,
    name: str,
    script: list[Step],
    fast: bool,
    monkeypatch: pytest.MonkeyPatch,
    inline: bool = False,
    lane: str = "",
) -> list[str]:
    monkeypatch.setenv(fast_call.ENV_SWITCH, "1" if fast else "0")
    with MemoryService.open(tmp_path / name, clock=lambda: FIXED_MS) as service:
        # with the clock standing still, every id is the last one plus 1: the same ids (so
        # the same record sizes and log positions) in both runs
        service._ids.observe(str(ulid.ULID.from_bytes((FIXED_MS << 80).to_bytes(16, "big"))))
        lines = anyio.run(run_script, build_server(service), script, inline, lane)
        assert service.check() == []
    return normalised(lines)


@pytest.mark.parametrize("mode", ["threads", "inline", "lane", "refusing"])
@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_fast_path_answers_byte_for_byte_what_the_sdk_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spy: list[str], era: str, mode: str
) -> None:
    script = legacy_script() if era == "legacy" else modern_script()
    sdk = transcript(tmp_path, "sdk", script, False, monkeypatch)
    assert spy == []
    inline, lane = mode != "threads", mode if mode in ("lane", "refusing") else ""
    fast = transcript(tmp_path, "fast", script, True, monkeypatch, inline, lane)
    assert len(fast) == len(sdk)
    for ours, theirs in zip(fast, sdk, strict=True):
        assert ours == theirs
    # the fast path served the calls it may (memory tools after the era is settled), the
    # SDK everything else; with `inline`, the writes (each alone in its step) on the loop;
    # with the lane, those that came as one plain line straight from the reader
    assert len(spy) >= 35, spy
    assert "no_such_tool" not in spy
    on_loop = {name.split(":")[1] for name in spy if name.startswith(("inline:", "lane:"))}
    by_lane = {name.removeprefix("lane:") for name in spy if name.startswith("lane:")}
    if inline:
        assert on_loop == set(fast_call.INLINE_TOOLS), spy
        assert "write_message" not in spy  # every write came alone
    else:
        assert on_loop == set()
    assert by_lane == (set(fast_call.INLINE_TOOLS) if lane else set()), spy
    cancelled = [json.loads(t).get("id") for t in fast]
    assert 44 not in cancelled and "46" not in cancelled and 45 in cancelled


# ---- concurrency, cancellation and the end of input, with a tool that waits -----------------


class Gate:
    """A tool context whose `wait` tool blocks until released."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()

    def wait(self, args: dict[str, Any]) -> str:
        self.entered.release()
        assert self.release.wait(30)
        return f"waited: {args['note']}"


def _wait(gate: Gate, args: dict[str, Any]) -> str:
    return gate.wait(args)


WAIT_TOOL: ToolSpec[Gate] = ToolSpec(
    name="wait",
    title="Wait",
    description="Blocks until the test releases it.",
    params=(Param("note", Text(16, min_bytes=1), "A note.", required=True),),
    annotations=Annotations(read_only=True, destructive=False, idempotent=True),
    handler=_wait,
    result_style="text",
)


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[Any, Gate]]:
    gate = Gate()
    with MemoryService.open(tmp_path / "data") as service:
        registry = ToolRegistry.for_service(service).with_tools([WAIT_TOOL], gate)
        try:
            yield build_server(registry), gate
        finally:
            gate.release.set()


INIT = request(
    0,
    "initialize",
    {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
)


class Session:
    """One line session driven by hand: `put` lines, `answer(id)` waits for an answer."""

    def __init__(self, server: Any, **options: Any) -> None:
        self.server = server
        self.options = options
        self.inbox: asyncio.Queue[bytes] = asyncio.Queue()
        self.answers: dict[Any, dict[str, Any]] = {}
        self.order: list[Any] = []
        self.arrived = asyncio.Event()
        self.requests: list[str] = []

    async def run(self) -> None:
        async def read_chunk() -> bytes:
            return await self.inbox.get()

        async def send(data: bytes) -> None:
            answer = json.loads(data)
            self.answers[answer.get("id")] = answer
            self.order.append(answer.get("id"))
            self.arrived.set()

        def observe(method: str, _params: dict[str, Any] | None) -> None:
            self.requests.append(method)

        await serve_chunks(self.server, read_chunk, send, on_request=observe, **self.options)

    def put(self, data: bytes) -> None:
        self.inbox.put_nowait(data)

    async def answer(self, request_id: object) -> dict[str, Any]:
        with anyio.fail_after(30):
            while request_id not in self.answers:
                self.arrived.clear()
                await self.arrived.wait()
        return self.answers[request_id]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "sdk"])
def test_a_waiting_call_holds_up_no_other_and_a_cancelled_one_is_never_answered(
    gated: tuple[Any, Gate], monkeypatch: pytest.MonkeyPatch, spy: list[str], fast: bool
) -> None:
    server, gate = gated
    monkeypatch.setenv(fast_call.ENV_SWITCH, "1" if fast else "0")

    async def scenario() -> None:
        session = Session(server)
        async with anyio.create_task_group() as tg:
            tg.start_soon(session.run)
            session.put(INIT)
            await session.answer(0)
            session.put(call(1, "wait", {"note": "first"}))
            await anyio.to_thread.run_sync(gate.entered.acquire)
            # the first call is stuck in its handler; others are served meanwhile
            write = {"session_id": "s", "role": "user", "content": "meanwhile"}
            session.put(call(2, "write_message", write))
            assert "result" in await session.answer(2)
            session.put(call(3, "wait", {"note": "second"}))
            await anyio.to_thread.run_sync(gate.entered.acquire)
            session.put(notification("notifications/cancelled", {"requestId": 3}))
            session.put(request(4, "ping"))
            await session.answer(4)
            gate.release.set()
            first = await session.answer(1)
            assert first["result"]["content"][0]["text"] == "waited: first"
            session.put(request(5, "ping"))
            await session.answer(5)
            session.put(b"")  # end of input: nothing is still due, the session ends at once
        assert 3 not in session.answers
        assert session.order == [0, 2, 4, 1, 5]
        calls = ["tools/call"] * 3
        assert session.requests == ["initialize", *calls, "ping", "ping"]

    anyio.run(scenario)
    assert spy == (["wait", "write_message", "wait"] if fast else [])


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "sdk"])
def test_calls_still_running_at_end_of_input_are_answered_before_the_session_ends(
    gated: tuple[Any, Gate], monkeypatch: pytest.MonkeyPatch, fast: bool
) -> None:
    server, gate = gated
    monkeypatch.setenv(fast_call.ENV_SWITCH, "1" if fast else "0")

    async def scenario() -> None:
        session = Session(server, max_in_flight=2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(session.run)
            session.put(INIT)
            await session.answer(0)
            # two calls fill the session's cap; the third waits for room before it is read
            session.put(call(1, "wait", {"note": "a"}) + call(2, "wait", {"note": "b"}))
            session.put(call(3, "read_messages", {"view": "sessions"}))
            await anyio.to_thread.run_sync(gate.entered.acquire)
            await anyio.to_thread.run_sync(gate.entered.acquire)
            await anyio.sleep(0.2)
            assert 3 not in session.answers
            session.put(b"")
            gate.release.set()
        # all answered; the third only once one of the first two had made room
        assert sorted(session.order) == [0, 1, 2, 3] and session.order[1] in (1, 2)

    anyio.run(scenario)


@pytest.mark.parametrize("alone", [True, False], ids=["only-client", "other-clients"])
def test_a_write_runs_on_the_loop_only_when_nothing_else_could_wait_for_it(
    gated: tuple[Any, Gate], monkeypatch: pytest.MonkeyPatch, spy: list[str], alone: bool
) -> None:
    """A write alone in its session (nothing in flight, nothing more read) is served on the
    loop when the transport allows it; a write behind another request in flight, or read
    together with more bytes (a cancellation in the same chunk stays unanswered), or with
    other clients on the loop, goes to a worker thread as before."""
    server, gate = gated
    monkeypatch.setenv(fast_call.ENV_SWITCH, "1")
    write = {"session_id": "s", "role": "user", "content": "alone"}

    async def scenario() -> None:
        session = Session(server, inline=lambda: alone)
        async with anyio.create_task_group() as tg:
            tg.start_soon(session.run)
            session.put(INIT)
            await session.answer(0)
            session.put(call(1, "write_message", write))  # alone
            assert "result" in await session.answer(1)
            session.put(call(2, "write_message", write) + call(3, "write_message", write))
            await session.answer(2)
            await session.answer(3)
            # a write and its cancellation read together: never answered (the ping is)
            cancel = notification("notifications/cancelled", {"requestId": 4})
            session.put(call(4, "write_message", write) + cancel + request(5, "ping"))
            await session.answer(5)
            # behind a call in flight
            session.put(call(6, "wait", {"note": "held"}))
            await anyio.to_thread.run_sync(gate.entered.acquire)
            session.put(call(7, "write_message", write))
            assert "result" in await session.answer(7)
            gate.release.set()
            await session.answer(6)
            session.put(call(8, "get_system_health", {}))  # not a write: a thread
            await session.answer(8)
            session.put(b"")
        assert 4 not in session.answers

    anyio.run(scenario)
    first = ["inline:write_message"] if alone else ["write_message"]
    rest = ["write_message"] * 3 + ["wait", "write_message", "get_system_health"]
    assert spy == first + rest


def test_a_failing_write_on_the_loop_answers_as_on_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spy: list[str]
) -> None:
    """A handler raising something unexpected on the loop gets the SDK's answer and the
    session goes on."""
    monkeypatch.setenv(fast_call.ENV_SWITCH, "1")
    steps = legacy_script()[1:3]
    write = {"session_id": "s", "role": "user", "content": "boom"}
    steps += [fixed(call(5, "write_message", write)), fixed(request(6, "ping"))]
    out: dict[bool, list[str]] = {}
    for inline in (False, True):
        with MemoryService.open(tmp_path / f"d{inline}", clock=lambda: FIXED_MS) as service:

            def broken(**_kwargs: Any) -> dict[str, Any]:
                raise RuntimeError("disk on fire")

            monkeypatch.setattr(service, "write_message", broken)
            lines = anyio.run(run_script, build_server(service), steps, inline)
        out[inline] = normalised(lines)
    assert out[True] == out[False]
    failed = json.loads(out[True][-2])
    assert failed["id"] == 5 and failed["result"]["isError"] is True
    assert "disk on fire" not in out[True][-2]
    assert "inline:write_message" in spy and "write_message" in spy


class GatedFsync(FileSystem):
    """fsync that waits for `release` (set by default), counts itself, and fails while `fail`."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()
        self.release.set()
        self.fail = False
        self.fsyncs = 0

    def fsync(self, fd: int) -> None:
        self.fsyncs += 1  # one fsync at a time (the store's group commit)
        self.entered.release()
        self.release.wait(30)
        if self.fail:
            raise OSError(errno.EIO, "injected fsync failure")
        super().fsync(fd)


WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


async def host_sessions(server: Any, count: int) -> tuple[list[Session], list[asyncio.Task[None]]]:
    """`count` line sessions, each in its own task with `WHO` set in its context (as the
    runtime sets each session's client), initialised."""
    sessions, tasks = [], []
    for h in range(count):
        session = Session(server)

        async def run(session: Session = session, who: str = f"host{h}") -> None:
            WHO.set(who)
            await session.run()

        tasks.append(asyncio.get_running_loop().create_task(run()))
        session.put(INIT)
        await session.answer(0)
        sessions.append(session)
    return sessions, tasks


def write_call(request_id: int, session_id: str) -> bytes:
    arguments = {"session_id": session_id, "role": "user", "content": f"m{request_id}"}
    return call(request_id, "write_message", arguments)


def test_writes_of_several_sessions_are_answered_once_durable_and_share_fsyncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spy: list[str]
) -> None:
    """Writes that may not run on the loop go to the writer thread: stored in turn, made
    durable together, answered only after their fsync, and each change event published
    after it in the writing session's context."""
    monkeypatch.setenv(fast_call.ENV_SWITCH, "1")
    fs = GatedFsync()
    events: list[tuple[str, str | None, int]] = []
    with MemoryService.open(tmp_path / "data", fs=fs) as service:

        def on_change(event: ChangeEvent) -> None:
            events.append((WHO.get(), event.session_id, fs.fsyncs))

        service.subscribe(on_change)
        server = build_server(service)

        async def scenario() -> None:
            hosts, tasks = await host_sessions(server, 3)
            fs.release.clear()
            before = fs.fsyncs
            for h, session in enumerate(hosts):
                session.put(write_call(1, f"s{h}") + write_call(2, f"s{h}"))
            await anyio.to_thread.run_sync(fs.entered.acquire)  # the first fsync waits
            await asyncio.sleep(0.2)  # the other writes are stored meanwhile
            assert not any(s.answers.keys() & {1, 2} for s in hosts)
            assert events == []  # nothing published before its fsync
            fs.release.set()
            for session in hosts:
                for i in (1, 2):
                    assert (await session.answer(i))["result"]["isError"] is False
                session.put(b"")
            await asyncio.gather(*tasks)
            assert fs.fsyncs - before < 6  # shared
            assert sorted((who, sid) for who, sid, _ in events) == [
                (f"host{h}", f"s{h}") for h in range(3) for _ in (1, 2)
            ]
            assert all(seen > before for _, _, seen in events)

        anyio.run(scenario)
    assert spy == ["write_message"] * 6


def test_writes_whose_fsync_fails_are_answered_with_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed fsync fails every write it was to make durable, in every session, as it fails
    a write alone: IO_ERROR, no change event; the sessions go on."""
    monkeypatch.setenv(fast_call.ENV_SWITCH, "1")
    fs = GatedFsync()
    events: list[ChangeEvent] = []
    with MemoryService.open(tmp_path / "data", fs=fs) as service:
        service.subscribe(events.append)
        server = build_server(service)

        async def scenario() -> None:
            hosts, tasks = await host_sessions(server, 2)
            fs.fail = True
            for h, session in enumerate(hosts):
                session.put(write_call(1, f"s{h}") + write_call(2, f"s{h}"))
            for session in hosts:
                for i in (1, 2):
                    result = (await session.answer(i))["result"]
                    assert result["isError"] is True
                    error = json.loads(result["content"][0]["text"])["error"]
                    assert error["code"] == "IO_ERROR"
                session.put(request(3, "ping"))
                await session.answer(3)
                session.put(b"")
            await asyncio.gather(*tasks)

        anyio.run(scenario)
    assert events == []
