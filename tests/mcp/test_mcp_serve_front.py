"""`convmem serve`'s stdio front: the handshake answered before the SDK and the store are ready.

- The front's answers are the SDK's, byte for byte: `handshake_answers.py` is what the
  generator writes from the live server now, and for every request shape the front accepts
  (each protocol version, an unknown one, ids, client infos, capabilities) its answer equals the
  live server's; for everything else (bad params, odd ids, escapes, other methods) it answers
  nothing and leaves the request to the SDK.
- With a real `convmem serve` whose open is held back (its `agent.yaml` is a FIFO nobody has
  opened yet: the runtime blocks reading it, after the lock and the store), the handshake is
  answered in both eras, a tool call sent meanwhile waits and then succeeds once the open goes
  on, the SDK's own duplicate of the early answer never reaches the host, and an open that then
  fails answers the waiting calls with an error naming why (exit status 1, one stderr line).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp_helpers import ERAS, child_env, payload, serve_args, serve_client

from convmem_engine.runtime import handshake_answers
from convmem_engine.runtime.front_plan import answer_for
from scripts.gen_handshake_answers import sdk_first_answers

ROOT = Path(__file__).resolve().parent.parent.parent
ENVELOPE = dict.fromkeys(handshake_answers.ENVELOPE_KEYS)
VERSION_KEY, INFO_KEY, CAPABILITIES_KEY = handshake_answers.ENVELOPE_KEYS

pytestmark = pytest.mark.posix  # FIFOs


def line(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def initialize(
    request_id: object = 1,
    version: object = "2025-11-25",
    capabilities: object = None,
    info: object = None,
    **extra: object,
) -> bytes:
    params: dict[str, Any] = {
        "protocolVersion": version,
        "capabilities": {} if capabilities is None else capabilities,
        "clientInfo": {"name": "host", "version": "1"} if info is None else info,
        **extra,
    }
    return line({"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": params})


def discover(
    request_id: object = 1,
    version: object = "2026-07-28",
    capabilities: object = None,
    info: object = None,
    drop: str = "",
    extra_meta: dict[str, Any] | None = None,
    **extra: object,
) -> bytes:
    meta: dict[str, Any] = {
        VERSION_KEY: version,
        INFO_KEY: {"name": "host", "version": "1"} if info is None else info,
        CAPABILITIES_KEY: {} if capabilities is None else capabilities,
        **(extra_meta or {}),
    }
    meta.pop(drop, None)
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "server/discover",
        "params": {"_meta": meta, **extra},
    }
    return line(body)


INSPECTOR_INITIALIZE = (
    b'{"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"roots":'
    b'{"listChanged":true},"extensions":{"io.modelcontextprotocol/tasks":{},"io.modelcontextp'
    b'rotocol/skills":{}}},"clientInfo":{"name":"inspector-cli","version":"2.12.0"}},"jsonrpc"'
    b':"2.0","id":0}'
)
INSPECTOR_DISCOVER = (
    b'{"jsonrpc":"2.0","id":"server-discover-probe-1","method":"server/discover","params":{"_m'
    b'eta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/c'
    b'lientInfo":{"name":"inspector-cli","version":"2.12.0"},"io.modelcontextprotocol/clientC'
    b'apabilities":{"roots":{"listChanged":true},"extensions":{"io.modelcontextprotocol/tasks'
    b'":{},"io.modelcontextprotocol/skills":{}}}}}}'
)


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


# The shapes the front answers itself: each must be byte-identical to the live SDK's answer.
ANSWERED = [
    *(initialize(version=v) for v in handshake_answers.INITIALIZE),
    initialize(version="1999-01-01"),  # unknown: the server counter-offers its latest
    initialize(version="2026-07-28"),  # a modern version through the handshake: the same
    initialize(version=""),
    initialize(request_id=0),
    initialize(request_id=-7),
    initialize(request_id=2**53 - 1),
    initialize(request_id="abc"),
    initialize(request_id="req-1.2:3_x"),
    initialize(capabilities={"roots": {"listChanged": True}}),
    initialize(capabilities={"roots": {}}),
    initialize(capabilities={"sampling": {}, "elicitation": {}}),
    initialize(capabilities={"sampling": {"context": {}, "tools": {}}}),
    initialize(capabilities={"elicitation": {"form": {}, "url": {}}}),
    initialize(info={"name": "Claude Desktop", "version": "0.9", "title": "Claude"}),
    initialize(info={"name": "n", "version": "", "description": "日本語のホスト"}),
    initialize(info={"name": "host", "version": "1", "websiteUrl": "https://example.com/a"}),
    discover(info={"name": "host", "version": "1", "websiteUrl": "not checked as a URL"}),
    *(discover(version=v) for v in handshake_answers.DISCOVER),
    discover(request_id="d-1"),
    discover(capabilities={"extensions": {"io.modelcontextprotocol/tasks": {}}}),
    discover(capabilities={"roots": {}, "sampling": {}, "elicitation": {"form": {}}}),
    discover(drop=INFO_KEY),
    discover(info={"name": "host", "version": "2", "title": "Host"}),
    # the MCP Inspector 2.12 (TypeScript SDK), as it writes them: its key order, its roots,
    # tasks and skills extensions in both eras
    INSPECTOR_INITIALIZE,
    INSPECTOR_DISCOVER,
    initialize(capabilities={"extensions": {"io.modelcontextprotocol/tasks": {}}}),
    initialize(capabilities={"tasks": {}}),
    initialize(
        capabilities={
            "tasks": {
                "list": {},
                "cancel": {},
                "requests": {"sampling": {"createMessage": {}}, "elicitation": {"create": {}}},
            }
        }
    ),
    initialize(capabilities={"experimental": {"x": {}}}),
    initialize(capabilities={"experimental": {"x": {"on": True, "n": [1, "b", None]}}}),
    initialize(capabilities={"roots": {"listChanged": False}, "experimental": {}}),
    discover(capabilities={"roots": {"listChanged": True}}),
    discover(capabilities={"roots": {"listChanged": False}, "experimental": {"x": {}}}),
]

# Shapes the front must leave to the SDK (it answers nothing for them).
LEFT_TO_THE_SDK = [
    initialize(request_id=True),
    initialize(request_id=1.5),
    initialize(request_id=None),
    initialize(request_id=2**60),
    initialize(request_id="ü"),
    initialize(request_id="a b"),
    initialize(version=5),
    initialize(info={"name": "host"}),
    initialize(info={"name": "host", "version": 1}),
    initialize(info={"name": "host", "version": "1", "icons": [{"src": "https://x/i.png"}]}),
    initialize(capabilities="all"),
    initialize(capabilities={"roots": {"listChanged": "yes"}}),
    initialize(capabilities={"roots": {"listChanged": True, "x": 1}}),
    initialize(capabilities={"sampling": {"context": {"x": 1}}}),
    initialize(capabilities={"sampling": {"x": {}}}),
    initialize(capabilities={"elicitation": {"form": {"applyDefaults": True}}}),
    initialize(capabilities={"tasks": {"list": 1}}),  # the SDK refuses it
    initialize(capabilities={"experimental": {"x": 1}}),  # the SDK refuses it
    initialize(capabilities={"experimental": {"x": {"n": float("nan")}}}),  # NaN: not JSON
    initialize(capabilities={"experimental": {"x": _nested(70)}}),  # deeper than the front reads
    initialize(capabilities={"extensions": {"x": {"setting": 1}}}),
    initialize(capabilities={"unknown": {}}),
    initialize(_meta={"progressToken": 1}),
    initialize(info={"name": "tab\there", "version": "1"}),  # an escape in the line
    b'{"jsonrpc":"2.0","id":1,"method":"initialize"}',
    b'{"jsonrpc":"1.0","id":1,"method":"initialize","params":{}}',
    b"\xef\xbb\xbf" + initialize(),
    b"[" + initialize() + b"]",
    b"not json",
    line({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    line({"jsonrpc": "2.0", "id": 1, "method": "ping"}),
    line({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    line({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}, "extra": 1}),
    discover(version="2025-11-25"),
    discover(version="2099-01-01"),
    discover(drop=CAPABILITIES_KEY),
    discover(drop=VERSION_KEY),
    discover(info={"name": "host"}),
    discover(capabilities={"roots": {"listChanged": 1}}),
    discover(capabilities={"tasks": {}}),  # an extension in 2026-07-28, not a capability
    discover(capabilities={"extensions": {"x": {"setting": 1}}}),
    discover(cursor="abc"),
    discover(extra_meta={"io.modelcontextprotocol/logLevel": "debug"}),  # (requests only)
]


def test_the_answers_module_is_what_the_generator_writes() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_handshake_answers.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


def test_the_front_answers_exactly_what_the_live_sdk_answers() -> None:
    sdk = sdk_first_answers(ANSWERED + LEFT_TO_THE_SDK)
    for request, expected in zip(ANSWERED, sdk, strict=False):
        found = answer_for(request)
        assert found is not None, f"the front should answer {request!r}"
        assert found[1] == expected, request
    for request in LEFT_TO_THE_SDK:
        assert answer_for(request) is None, f"the front must leave {request!r} to the SDK"
    # the SDK does answer most of what the front leaves (errors, or results the front does not
    # know byte for byte); the front only ever answers first lines it is sure about
    assert sum(answer is not None for answer in sdk[len(ANSWERED) :]) > len(LEFT_TO_THE_SDK) // 2


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randrange(8 if depth < 3 else 5)
    if pick < 5:
        return [True, 1, "s", None, [1, "a"]][pick]
    if pick == 5:
        return {}
    return {rng.choice("abc"): _random_json(rng, depth + 1) for _ in range(rng.randrange(1, 3))}


def _random_tree(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """Objects down to empty ones, now and then a leaf that is not an object."""
    if depth >= 3 or rng.random() < 0.4:
        return {}
    keys = rng.sample(["list", "cancel", "requests", "sampling", "x"], rng.randrange(1, 3))
    return {k: _random_tree(rng, depth + 1) if rng.random() < 0.9 else 1 for k in keys}


_ROOTS = [{}, {"listChanged": True}, {"listChanged": False}, {"listChanged": 1}, {"x": {}}]
_SAMPLING = [
    {},
    {"context": {}},
    {"tools": {}},
    {"context": {}, "tools": {}},
    {"context": {"x": 1}},
]
_ELICITATION = [{}, {"form": {}}, {"url": {}}, {"form": {}, "url": {}}, {"form": {"x": True}}]
_EXTENSIONS = ["io.modelcontextprotocol/tasks", "io.example/skills"]


def _random_capabilities(rng: random.Random) -> dict[str, Any]:
    choices: dict[str, Any] = {
        "roots": lambda: rng.choice(_ROOTS),
        "sampling": lambda: rng.choice(_SAMPLING),
        "elicitation": lambda: rng.choice(_ELICITATION),
        "tasks": lambda: _random_tree(rng),
        "experimental": lambda: {
            rng.choice(["x", "y"]): _random_json(rng) for _ in range(rng.randrange(0, 3))
        },
        "extensions": lambda: {
            name: rng.choice([{}, {}, {"setting": 1}])
            for name in rng.sample(_EXTENSIONS, rng.randrange(0, 3))
        },
        "other": lambda: {},
    }
    keys = [key for key in choices if rng.random() < (0.05 if key == "other" else 0.35)]
    return {key: choices[key]() for key in keys}


def _random_info(rng: random.Random) -> dict[str, Any]:
    info: dict[str, Any] = {"name": rng.choice(["host", "Claude", "é"]), "version": "1.2"}
    for key, value in (
        ("title", "T"),
        ("description", "d"),
        ("websiteUrl", rng.choice(["https://example.com", "not a url"])),
        ("icons", [{"src": "https://example.com/i.png"}]),
        ("other", "x"),
    ):
        if rng.random() < 0.15:
            info[key] = value
    return info


def test_random_handshakes_the_front_answers_are_the_live_sdks() -> None:
    """400 handshakes drawn from the capability and client-info shapes hosts send, valid and
    not: every one the front answers, it answers with the live SDK's bytes."""
    rng = random.Random(13)
    lines = []
    for _ in range(400):
        request_id: object = rng.choice([0, 7, "p-1", "server-discover-probe-1"])
        if rng.random() < 0.5:
            version = rng.choice([*handshake_answers.INITIALIZE, "1999-01-01"])
            caps, info = _random_capabilities(rng), _random_info(rng)
            lines.append(initialize(request_id, version, capabilities=caps, info=info))
        else:
            version = rng.choice(list(handshake_answers.DISCOVER))
            caps, info = _random_capabilities(rng), _random_info(rng)
            lines.append(discover(request_id, version, capabilities=caps, info=info))
    sdk = sdk_first_answers(lines)
    answered = 0
    for request, expected in zip(lines, sdk, strict=True):
        found = answer_for(request)
        if found is not None:
            answered += 1
            assert found[1] == expected, request
    assert 80 < answered < 320, answered  # both kinds drawn often (108 answered)


# ---- a real `convmem serve` whose open is held back ----------------------------------------


class HeldOpen:
    """`convmem serve` on a data dir whose agent.yaml is a FIFO: the runtime's open blocks
    reading it (after the lock and the store) until `release(text)`."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.fifo = data_dir / "agent.yaml"
        os.mkfifo(self.fifo, 0o600)
        self.proc = subprocess.Popen(
            [sys.executable, *serve_args(data_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env(),
        )
        self.released = False

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data + b"\n")
        self.proc.stdin.flush()

    def answer(self) -> bytes:
        assert self.proc.stdout is not None
        got = self.proc.stdout.readline()
        assert got, f"the server ended its output (exit {self.proc.poll()})"
        return got

    def release(self, text: str) -> None:
        """Let the open go on, with `text` as agent.yaml."""
        assert not self.released, "released twice"
        self.released = True
        fd = os.open(self.fifo, os.O_WRONLY)  # returns once the server has it open for reading
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def finish(self) -> tuple[bytes, bytes, int]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        assert self.proc.stderr is not None
        self.proc.stdin.close()
        rest, err = self.proc.stdout.read(), self.proc.stderr.read()
        status = self.proc.wait(60)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return rest, err, status


def _health_call(request_id: int, meta: dict[str, Any] | None = None) -> bytes:
    params: dict[str, Any] = {"name": "get_system_health", "arguments": {}}
    if meta is not None:
        params["_meta"] = meta
    return line({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})


@pytest.mark.parametrize("era", ["handshake", "2026-07-28"])
def test_handshake_answered_while_opening_and_a_tool_call_waits_then_succeeds(
    tmp_path: Path, era: str
) -> None:
    server = HeldOpen(tmp_path / "data")
    try:
        first = initialize() if era == "handshake" else discover()
        server.send(first)
        found = answer_for(first)
        assert found is not None
        # the runtime cannot be ready: its open is blocked on the FIFO nobody has opened
        assert server.answer() == found[1]
        meta = None
        if era == "handshake":
            server.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        else:
            meta = {VERSION_KEY: "2026-07-28", CAPABILITIES_KEY: {}}
        server.send(_health_call(2, meta))
        server.release("enabled: false\n")
        answer = json.loads(server.answer())
        assert answer["id"] == 2 and "result" in answer, answer
        health = json.loads(answer["result"]["content"][0]["text"])
        assert health["status"] == "OK"
        server.send(_health_call(3, meta))
        assert json.loads(server.answer())["id"] == 3
    finally:
        if not server.released:
            server.release("enabled: false\n")
        rest, err, status = server.finish()
    assert status == 0, err
    assert rest == b"", "the SDK's duplicate of the early answer reached the host"


def test_an_open_that_fails_answers_the_waiting_calls_with_why(tmp_path: Path) -> None:
    server = HeldOpen(tmp_path / "data")
    server.send(initialize())
    assert json.loads(server.answer())["id"] == 1
    server.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    server.send(_health_call(2))
    server.send(_health_call("three"))  # type: ignore[arg-type]
    server.release("enabled: maybe\n")  # not a boolean: the agent part refuses to start
    rest, err, status = server.finish()
    assert status == 1
    answers = [json.loads(raw) for raw in rest.splitlines()]
    assert [a["id"] for a in answers] == [2, "three"]
    for a in answers:
        assert a["error"]["code"] == -32603
        assert a["error"]["message"].startswith("convmem serve could not start: agent: ")
        assert "enabled" in a["error"]["message"]
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("convmem serve: agent: "), lines


def test_a_corrupt_store_still_gives_its_line_and_status_and_no_stray_answer(
    tmp_path: Path,
) -> None:
    from convmem_engine.service import MemoryService

    data_dir = tmp_path / "data"
    with MemoryService.open(data_dir) as svc:
        svc.write_message(session_id="s", role="user", content="hello")
    (data_dir / "snapshot.bin").unlink(missing_ok=True)
    log = data_dir / "active.log"
    raw = bytearray(log.read_bytes())
    raw[-3] ^= 0xFF
    log.write_bytes(bytes(raw))
    proc = subprocess.run(
        [sys.executable, *serve_args(data_dir)],
        input=initialize() + b"\n" + _health_call(2) + b"\n",
        capture_output=True,
        env=child_env(),
        timeout=60,
    )
    assert proc.returncode == 1
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("convmem serve: CORRUPT_STORE: ")
    found = answer_for(initialize())
    assert found is not None
    # whether the front read the lines before the open failed depends on timing; what it
    # writes is either nothing, or the exact handshake answer and an error for the call
    out = proc.stdout.splitlines(keepends=True)
    assert len(out) <= 2 and out[:1] in ([], [found[1]]), out
    if len(out) == 2:
        error = json.loads(out[1])
        assert error["id"] == 2 and "CORRUPT_STORE" in error["error"]["message"]


@pytest.mark.parametrize("mode", ERAS)
def test_the_sdk_client_connects_while_the_open_is_held(tmp_path: Path, mode: str) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o700)
    fifo = data_dir / "agent.yaml"
    os.mkfifo(fifo, 0o600)
    released = threading.Event()

    def release() -> None:
        fd = os.open(fifo, os.O_WRONLY)
        try:
            os.write(fd, b"enabled: false\n")
        finally:
            os.close(fd)
        released.set()

    async def scenario() -> None:
        errlog = (tmp_path / "serve.err").open("w")
        try:
            async with serve_client(data_dir, mode, errlog) as client:
                # connected (handshake done) while the runtime's open is still blocked
                assert not released.is_set()
                threading.Thread(target=release, daemon=True).start()
                result = await client.call_tool("get_system_health", {})
                assert payload(result)["status"] == "OK"
                tools = await client.list_tools()
                assert "write_message" in {tool.name for tool in tools.tools}
        finally:
            errlog.close()

    anyio.run(scenario)
    assert released.is_set()


def test_a_busy_http_port_after_the_handshake_answers_the_waiting_calls(tmp_path: Path) -> None:
    import socket

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, *serve_args(tmp_path / "data", "--http", "--port", str(port))],
            input=initialize() + b"\n" + _health_call(2) + b"\n",
            capture_output=True,
            env=child_env(),
            timeout=60,
        )
    assert proc.returncode == 3
    found = answer_for(initialize())
    assert found is not None
    out = proc.stdout.splitlines(keepends=True)
    assert not out or out[0] == found[1], out  # the front read the handshake, or nothing yet
    for raw in out[1:]:
        error = json.loads(raw)
        assert error["id"] == 2 and "HTTP listener failed" in error["error"]["message"]
    assert str(port) in proc.stderr.decode()


READERS = ("loop", "thread")
"""After the hand-over stdin is read on the session's loop (pipes and sockets on POSIX) or by
the front's thread (regular files, consoles, Windows): `LoopReader.usable` decides; "thread"
makes it say no, as on Windows."""


def _reading_by(reader: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from convmem_engine.runtime.loop_reader import LoopReader

    if reader == "thread":
        monkeypatch.setattr(LoopReader, "usable", staticmethod(lambda *args: False))


@pytest.mark.parametrize("reader", READERS)
def test_the_handed_over_stream_is_every_byte_in_order_past_the_read_ahead_cap(
    reader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process, on real pipes: a front started, fed more than it keeps before the hand-over
    (so its reading pauses), answers the handshake, then hands over; the session's reads give
    back every byte once, in order, the answered line included, then end of input; the pipe
    is left in the mode it had (blocking) and the front's thread has ended."""
    import asyncio

    from convmem_engine.runtime.front import PRE_HANDOVER_BYTES, StdioFront

    _reading_by(reader, monkeypatch)
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    front = StdioFront(in_read, out_write)
    front.start()
    body = (
        initialize()
        + b"\n"
        + b"".join(
            _health_call(i) + b" " * 1000 + b"\n"
            for i in range(2, 2 + 3 * PRE_HANDOVER_BYTES // 1000)
        )
    )
    writer = threading.Thread(target=lambda: (os.write(in_write, body), os.close(in_write)))
    writer.start()
    found = answer_for(initialize())
    assert found is not None
    with os.fdopen(out_read, "rb") as out:
        assert out.readline() == found[1]  # answered while the writer is blocked on the pipe

        async def drain() -> bytes:
            stream = front.handover(asyncio.get_running_loop())
            chunks = []
            while chunk := await stream.read():
                chunks.append(chunk)
            assert await stream.read() == b""  # end of input stays end of input
            return b"".join(chunks)

        assert asyncio.run(drain()) == body
        writer.join(30)
        os.close(out_write)
        assert out.read() == b""  # nothing else was written
    assert os.get_blocking(in_read)
    front._thread.join(30)
    assert not front._thread.is_alive()
    os.close(in_read)


@pytest.mark.parametrize("reader", READERS)
def test_bytes_sent_after_the_hand_over_follow_in_order(
    reader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The front's thread is waiting in its read when the stream is handed over: the chunk it
    then reads is delivered first, and only then does the loop read (or the thread go on), so
    every later line arrives once and in order, past the session's read-ahead, then EOF."""
    import asyncio

    from convmem_engine.runtime.front import StdioFront
    from convmem_engine.runtime.loop_reader import READ_AHEAD_CHUNKS, READ_CHUNK_BYTES

    _reading_by(reader, monkeypatch)
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    front = StdioFront(in_read, out_write, answer_requests=False)
    front.start()
    os.write(in_write, initialize() + b"\n")
    found = answer_for(initialize())
    assert found is not None
    later = [_health_call(i) + b" " * (i % 7) * 999 + b"\n" for i in range(2, 2000)]
    body = b"".join(later)
    assert len(body) > 2 * READ_AHEAD_CHUNKS * READ_CHUNK_BYTES
    with os.fdopen(out_read, "rb") as out:
        assert out.readline() == found[1]  # the thread now waits for more input

        async def session() -> bytes:
            stream = front.handover(asyncio.get_running_loop())
            writer = threading.Thread(target=lambda: (os.write(in_write, body), os.close(in_write)))
            writer.start()
            chunks = [await stream.read()]  # the handshake line the front kept
            while chunk := await stream.read():
                chunks.append(chunk)
                await asyncio.sleep(0)  # a slow session: the reader stays a few chunks ahead
            writer.join(30)
            assert (stream._reader is not None) == (reader == "loop")
            return b"".join(chunks)

        assert asyncio.run(session()) == initialize() + b"\n" + body
    front._thread.join(30)
    assert not front._thread.is_alive()
    assert os.get_blocking(in_read)
    for fd in (in_read, out_write):
        os.close(fd)


@pytest.mark.parametrize("stdin", ["file", "socket", "pipe", "socket in and out"])
def test_serve_reads_requests_from_a_file_a_socket_or_a_pipe(tmp_path: Path, stdin: str) -> None:
    """`convmem serve` answers the same whatever stdin is: a regular file or a socket that is
    stdout too (read by a thread), a socket or a pipe (read on the loop), every request once
    and in order, up to EOF."""
    import socket

    requests = initialize() + b"\n" + b"".join(_health_call(i) + b"\n" for i in range(2, 40))
    args = [sys.executable, *serve_args(tmp_path / "data")]
    if stdin == "file":
        path = tmp_path / "requests.jsonl"
        path.write_bytes(requests)
        with path.open("rb") as source:
            proc = subprocess.run(
                args, stdin=source, capture_output=True, env=child_env(), timeout=120
            )
    elif stdin == "socket":
        ours, theirs = socket.socketpair()
        with ours, theirs:
            child = subprocess.Popen(
                args, stdin=theirs, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env()
            )
            theirs.close()
            ours.sendall(requests)
            ours.shutdown(socket.SHUT_WR)
            out, err = child.communicate(timeout=120)
        proc = subprocess.CompletedProcess(args, child.returncode, out, err)
    elif stdin == "socket in and out":
        ours, theirs = socket.socketpair()
        with ours, theirs:
            child = subprocess.Popen(
                args, stdin=theirs, stdout=theirs, stderr=subprocess.PIPE, env=child_env()
            )
            theirs.close()
            ours.sendall(requests)
            ours.shutdown(socket.SHUT_WR)
            received = b""
            while chunk := ours.recv(65536):
                received += chunk
            err = child.communicate(timeout=120)[1]
        proc = subprocess.CompletedProcess(args, child.returncode, received, err)
    else:
        proc = subprocess.run(
            args, input=requests, capture_output=True, env=child_env(), timeout=120
        )
    assert proc.returncode == 0, proc.stderr.decode()
    answers = [json.loads(raw) for raw in proc.stdout.splitlines()]
    assert [a["id"] for a in answers] == list(range(1, 40))
    assert all("result" in a for a in answers)


def test_the_sdk_duplicate_is_dropped_once_and_only_for_that_id() -> None:
    import asyncio

    from convmem_engine.runtime.front import StdioFront

    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    front = StdioFront(in_read, out_write)
    front.start()
    os.write(in_write, initialize(request_id=7) + b"\n")
    found = answer_for(initialize(request_id=7))
    assert found is not None
    with os.fdopen(out_read, "rb") as out:
        assert out.readline() == found[1]
    sent: list[bytes] = []

    async def send(data: bytes) -> None:
        sent.append(data)

    async def run() -> None:
        front.handover(asyncio.get_running_loop())
        wrapped = front.wrap_send(send)
        other = b'{"jsonrpc":"2.0","id":70,"result":{}}\n'
        await wrapped(other)
        await wrapped(found[1])  # the SDK's own answer to the replayed handshake: dropped
        await wrapped(found[1])  # a second answer with that id is not the duplicate: sent
        assert sent == [other, found[1]]

    asyncio.run(run())
    os.close(in_write)
    os.close(in_read)
    os.close(out_write)


def test_the_path_to_the_lock_and_the_front_loads_no_sdk() -> None:
    """What `convmem serve` imports before the lock is taken and the front answers (the CLI,
    serve_cli, the runtime, the service and store, the front) loads neither the MCP SDK nor
    pydantic, anyio, the agent's Ollama client or jsonschema: they would delay the handshake."""
    code = (
        "import sys\n"
        "import convmem_app.cli, convmem_app.shim.paths\n"
        "import convmem_engine.runtime.serve_cli, convmem_engine.runtime.front\n"
        "from convmem_engine.service import MemoryService\n"
        "heavy = ('mcp', 'mcp_types', 'pydantic', 'anyio', 'ollama', 'httpx', 'jsonschema')\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} & set(heavy))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()
    assert out == "", f"loaded before the handshake: {out}"
