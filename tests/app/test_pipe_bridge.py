"""The pipe bridge on its own (real engine thread, real service, real MCP server, real socket):
control messages, and what a host sees when the app quits under it."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from app_helpers import INITIALIZED, initialize_request, lines, request, write_call
from pytestqt.qtbot import QtBot

from convmem_app.shell.pipe_bridge import SHUTTING_DOWN_CODE, PipeBridge
from convmem_app.shim.paths import endpoint
from convmem_engine.mcp import fast_call, line_transport
from convmem_engine.runtime import Runtime
from convmem_engine.runtime.activity import ActivityLog
from convmem_engine.service import MemoryService

# Talks to the bridge over raw AF_UNIX sockets (on Windows it listens on a named pipe).
pytestmark = [pytest.mark.gui, pytest.mark.posix]


INITIALIZE = lines(initialize_request("bridge-test"))


def write(request_id: int, content: str) -> bytes:
    return lines(write_call(request_id, "bridge", content))


class Bridge:
    """A running Runtime with the pipe bridge as its listener (as the app has it)."""

    def __init__(self, data_dir: Path, direct: bool) -> None:
        self.runtime = Runtime(data_dir)
        self.runtime.open()
        self.service = self.runtime.service
        self.name = endpoint(data_dir)
        self.bridge = PipeBridge(self.name, direct=direct)
        self.runtime.add_listener(self.bridge)

    def close(self, qtbot: QtBot) -> None:
        stopped = self.runtime.stop_async(0)  # the bridge drains on the Qt loop: keep it running
        qtbot.waitUntil(stopped.done, timeout=30_000)


@pytest.fixture(params=[True, False], ids=["direct", "relayed"])
def bridge(tmp_path: Path, qtbot: QtBot, request: pytest.FixtureRequest) -> Iterator[Bridge]:
    """Both byte paths: direct (the engine loop serves the socket; the default off Windows)
    and relayed through the Qt thread (what Windows runs)."""
    b = Bridge(tmp_path / "data", direct=request.param)
    yield b
    b.close(qtbot)


def read_line(sock: socket.socket, qtbot: QtBot, buffer: bytearray) -> bytes:
    """Read one line while the Qt loop keeps running (the bridge lives on it)."""
    sock.setblocking(False)

    def have_line() -> bool:
        try:
            chunk = sock.recv(65536)
        except BlockingIOError:
            chunk = None
        if chunk == b"":
            buffer.extend(b"<EOF>\n")
        elif chunk:
            buffer.extend(chunk)
        return b"\n" in buffer

    qtbot.waitUntil(have_line, timeout=30_000)
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line


def test_control_messages(bridge: Bridge, qtbot: QtBot) -> None:
    buffer = bytearray()
    with (
        qtbot.waitSignal(bridge.bridge.raiseRequested, timeout=10_000),
        socket.socket(socket.AF_UNIX) as sock,
    ):
        sock.connect(bridge.name)
        sock.sendall(b'{"convmem_control": "raise"}\n')
        assert json.loads(read_line(sock, qtbot, buffer)) == {"convmem_control": "ok"}
    buffer.clear()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(bridge.name)
        sock.sendall(b'{"convmem_control": "reboot"}\n')
        answer = json.loads(read_line(sock, qtbot, buffer))
    assert answer["convmem_control"] == "error"
    assert bridge.bridge.host_count == 0  # control connections are not hosts


def test_quit_lets_a_half_sent_request_finish_and_refuses_later_ones(
    bridge: Bridge, qtbot: QtBot
) -> None:
    buffer = bytearray()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(bridge.name)
        sock.sendall(INITIALIZE)
        assert json.loads(read_line(sock, qtbot, buffer))["id"] == 1
        sock.sendall(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        request = write(2, "sent in two halves")
        sock.sendall(request[:20])
        # Wait until the engine session holds the half line (a read of the bridge's state).
        sessions = bridge.bridge._sessions
        qtbot.waitUntil(lambda: any(not s.at_line_start for s in list(sessions.values())))
        with qtbot.waitSignal(bridge.bridge.drained, timeout=30_000):
            bridge.bridge.shutdown(grace=10.0)
            qtbot.waitUntil(lambda: not any(s.accepting for s in list(sessions.values())))
            sock.sendall(request[20:] + write(3, "too late"))
            replies = [json.loads(read_line(sock, qtbot, buffer)) for _ in range(2)]
        by_id = {reply["id"]: reply for reply in replies}
        assert by_id[3]["error"]["code"] == SHUTTING_DOWN_CODE
        written = json.loads(by_id[2]["result"]["content"][0]["text"])
        assert written["status"] == "OK"
        assert read_line(sock, qtbot, buffer) == b"<EOF>"  # then the app closes the pipe
    history = bridge.service.read_messages(session_id="bridge")["history"]
    assert [m["content"] for m in history] == ["sent in two halves"]
    assert not Path(bridge.name).exists()


def test_the_runtime_lists_pipe_hosts_and_its_stop_drains_the_pipe(
    bridge: Bridge, qtbot: QtBot
) -> None:
    buffer = bytearray()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(bridge.name)
        sock.sendall(INITIALIZE)
        assert json.loads(read_line(sock, qtbot, buffer))["id"] == 1
        (client,) = bridge.runtime.clients.clients()
        assert (client.transport, client.name, client.requests) == ("pipe", "bridge-test", 1)
        sock.sendall(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n' + write(2, "x"))
        assert json.loads(read_line(sock, qtbot, buffer))["id"] == 2
        stopped = bridge.runtime.stop_async(10.0)
        assert read_line(sock, qtbot, buffer) == b"<EOF>"  # the runtime's stop closed the pipe
        qtbot.waitUntil(stopped.done, timeout=30_000)
    assert bridge.runtime.clients.count() == 0
    assert not Path(bridge.name).exists()
    MemoryService.open(bridge.runtime.data_dir).close()  # the lock was released


# ---- the byte path: chunks, lines, closing, back-pressure (both modes) ----------------------


class Host:
    """A raw host on the bridge's socket, reading replies while the Qt loop runs."""

    def __init__(self, bridge: Bridge, qtbot: QtBot) -> None:
        self.qtbot = qtbot
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(bridge.name)
        self.buffer = bytearray()
        self.replies: dict[object, dict[str, object]] = {}

    def close(self) -> None:
        self.sock.close()

    def _collect(self) -> None:
        self.sock.setblocking(False)
        while True:
            try:
                chunk = self.sock.recv(1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                break
            self.buffer.extend(chunk)
        *complete, rest = bytes(self.buffer).split(b"\n")
        self.buffer[:] = rest
        for line in complete:
            reply = json.loads(line)
            self.replies[reply.get("id")] = reply

    def wait_for(self, ids: Iterable[object]) -> None:
        wanted = set(ids)

        def arrived() -> bool:
            self._collect()
            return wanted <= self.replies.keys()

        self.qtbot.waitUntil(arrived, timeout=60_000)


def stored(bridge: Bridge, session: str) -> list[str]:
    history = bridge.service.read_messages(session_id=session, limit=1000)["history"]
    return [m["content"] for m in history]


def test_many_lines_in_one_chunk_and_lines_split_across_chunks(
    bridge: Bridge, qtbot: QtBot
) -> None:
    host = Host(bridge, qtbot)
    try:
        burst = INITIALIZE + lines(INITIALIZED)
        burst += b"".join(write(i, f"burst {i}") for i in range(2, 32))
        host.sock.sendall(burst)  # one send: many lines reach the app in one chunk
        host.wait_for(range(1, 32))
        # A line cut into pieces, some inside multi-byte UTF-8 characters.
        text = "split ü€😀 end"
        raw = json.dumps(write_call(40, "bridge", text), ensure_ascii=False)  # real UTF-8
        request = raw.encode() + b"\n" + write(41, "after the split")
        cuts = sorted({7, 8, 30, request.index("ü".encode()) + 1, request.index(b"\xf0") + 2})
        pieces = [request[a:b] for a, b in zip([0, *cuts], [*cuts, len(request)], strict=True)]
        for piece in pieces:
            host.sock.sendall(piece)
            qtbot.wait(20)  # let the pieces arrive apart
        host.wait_for([40, 41])
    finally:
        host.close()
    assert all("result" in host.replies[i] for i in [*range(1, 32), 40, 41])
    expected = [f"burst {i}" for i in range(2, 32)] + [text, "after the split"]
    assert sorted(stored(bridge, "bridge")) == sorted(expected)


def test_a_host_closing_in_the_middle_of_a_line(bridge: Bridge, qtbot: QtBot) -> None:
    host = Host(bridge, qtbot)
    host.sock.sendall(INITIALIZE + lines(INITIALIZED))
    host.wait_for([1])
    assert bridge.bridge.host_count == 1
    host.sock.sendall(write(2, "never finished")[:40])
    host.close()
    qtbot.waitUntil(lambda: bridge.bridge.host_count == 0, timeout=30_000)
    qtbot.waitUntil(lambda: bridge.runtime.clients.count() == 0, timeout=30_000)
    assert stored(bridge, "bridge") == []  # the half line was not served
    again = Host(bridge, qtbot)  # the bridge serves the next host as before
    try:
        again.sock.sendall(INITIALIZE + lines(INITIALIZED) + write(2, "next host"))
        again.wait_for([1, 2])
    finally:
        again.close()
    assert stored(bridge, "bridge") == ["next host"]


def content_read(request_id: int, message_id: str) -> bytes:
    arguments = {"view": "content", "message_id": message_id, "content_limit": 65536}
    return lines(
        request(request_id, "tools/call", {"name": "read_messages", "arguments": arguments})
    )


def test_a_host_that_stops_reading_is_held_back_and_loses_nothing(
    bridge: Bridge, qtbot: QtBot
) -> None:
    """Replies pile up while the host does not read: the engine stops writing at HIGH_WATER,
    the session stops reading at its in-flight cap, and (direct) the socket is no longer
    read, so the host's own writes block. Once it reads, every request is answered."""
    big = bridge.service.write_message(session_id="big", role="user", content="x" * 65536)
    message_id = big["message"]["message_id"]
    host = Host(bridge, qtbot)
    try:
        host.sock.sendall(INITIALIZE + lines(INITIALIZED))
        host.wait_for([1])
        reads = range(100, 250)  # 150 replies of 64 KiB and more: far over HIGH_WATER
        host.sock.sendall(b"".join(content_read(i, message_id) for i in reads))
        sessions = bridge.bridge._sessions

        def output_held() -> bool:
            for s in list(sessions.values()):
                if (s.relay is not None and s.relay.blocked) or not s.writable.is_set():
                    return True
            return False

        qtbot.waitUntil(output_held, timeout=30_000)
        writes = b"".join(write(i, f"{i}:" + "y" * 262_144) for i in range(1000, 1040))
        sent = 0
        if bridge.bridge.direct:
            host.sock.setblocking(False)
            blocked_twice = False
            while sent < len(writes) and not blocked_twice:
                try:
                    sent += host.sock.send(writes[sent : sent + 65536])
                except BlockingIOError:
                    qtbot.wait(300)  # time enough for an app that reads to drain some
                    try:
                        sent += host.sock.send(writes[sent : sent + 65536])
                    except BlockingIOError:
                        blocked_twice = True
            assert blocked_twice, "the app kept reading a host that does not read its replies"
            assert sent < 16 * 1024 * 1024

        def sent_all_and_answered() -> bool:
            nonlocal sent
            host.sock.setblocking(False)
            if sent < len(writes):
                with contextlib.suppress(BlockingIOError):
                    sent += host.sock.send(writes[sent : sent + 65536])
            host._collect()
            return sent == len(writes) and {*reads, *range(1000, 1040)} <= host.replies.keys()

        qtbot.waitUntil(sent_all_and_answered, timeout=120_000)
        host.sock.sendall(write(2000, "still served"))
        host.wait_for([2000])
    finally:
        host.close()
    for i in reads:
        text = json.loads(host.replies[i]["result"]["content"][0]["text"])  # type: ignore[index]
        assert text["content_range"]["content"] == "x" * 65536
    for i in [*range(1000, 1040), 2000]:
        text = json.loads(host.replies[i]["result"]["content"][0]["text"])  # type: ignore[index]
        assert text["status"] == "OK"


def test_direct_a_host_that_half_closes_gets_its_answers(tmp_path: Path, qtbot: QtBot) -> None:
    """Direct connections (the engine loop owns the socket) answer what a host sent before it
    shut down its writing side, then close."""
    b = Bridge(tmp_path / "data", direct=True)
    try:
        host = Host(b, qtbot)
        try:
            host.sock.sendall(INITIALIZE + lines(INITIALIZED) + write(2, "then half-closed"))
            host.sock.shutdown(socket.SHUT_WR)
            host.wait_for([1, 2])
            assert read_line(host.sock, qtbot, host.buffer) == b"<EOF>"
        finally:
            host.close()
        assert stored(b, "bridge") == ["then half-closed"]
    finally:
        b.close(qtbot)


def test_direct_writes_one_at_a_time_are_served_by_the_lane_for_their_client(
    tmp_path: Path, qtbot: QtBot, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host's writes, each sent once the one before is answered, are served straight from
    the socket's read (the line transport's lane); each change is its host's in the activity
    log; a request that is not a plain write, and bytes that come with more behind them, take
    the session's task, in order."""
    served: list[bool] = []
    serve_now = line_transport._LineSession.serve_now

    def counting(self: line_transport._LineSession, data: bytes) -> bool:
        served.append(serve_now(self, data))
        return served[-1]

    monkeypatch.setattr(line_transport._LineSession, "serve_now", counting)
    b = Bridge(tmp_path / "data", direct=True)
    activity = ActivityLog(b.service, b.runtime.clients)
    host = Host(b, qtbot)
    try:
        host.sock.sendall(INITIALIZE + lines(INITIALIZED))
        host.wait_for([1])
        for i in range(2, 12):
            host.sock.sendall(write(i, f"one at a time {i}"))
            host.wait_for([i])
        lane_served = served.count(True)
        # not a plain write: the task's path; then a write and a list in one chunk: in order
        host.sock.sendall(lines(request(20, "tools/list", {})))
        host.wait_for([20])
        host.sock.sendall(write(21, "with a list behind") + lines(request(22, "tools/list", {})))
        host.wait_for([21, 22])
        host.sock.sendall(write(23, "alone again"))
        host.wait_for([23])
        contents = stored(b, "bridge")
    finally:
        host.close()
        activity.close()
        b.close(qtbot)
    assert lane_served >= 9, served  # (the first may arrive while the session still settles)
    assert served[-1] is True and served.count(True) == lane_served + 1
    assert all("result" in host.replies[i] for i in [*range(1, 12), 20, 21, 22, 23])
    assert not any(host.replies[i]["result"].get("isError") for i in [*range(2, 12), 21, 23])
    assert contents == [f"one at a time {i}" for i in range(2, 12)] + [
        "with a list behind",
        "alone again",
    ]
    writes = [e for e in activity.entries() if e.kind == "write"]
    assert len(writes) == 12
    assert {e.client for e in writes} == {"bridge-test 0"}


def test_direct_writes_of_several_hosts_go_from_the_lane_to_the_writer(
    tmp_path: Path, qtbot: QtBot, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four hosts writing at once: their writes are taken by the lane and started on the
    writer thread (not alone), answered once durable, each change its own host's."""
    started: list[str] = []
    start = fast_call.FastCallSession.start

    def counting(self: fast_call.FastCallSession, call: fast_call.FastCall) -> None:
        started.append(call.name)
        start(self, call)

    served: list[bool] = []
    serve_now = line_transport._LineSession.serve_now

    def offered(self: line_transport._LineSession, data: bytes) -> bool:
        served.append(serve_now(self, data))
        return served[-1]

    monkeypatch.setattr(fast_call.FastCallSession, "start", counting)
    monkeypatch.setattr(line_transport._LineSession, "serve_now", offered)
    b = Bridge(tmp_path / "data", direct=True)
    activity = ActivityLog(b.service, b.runtime.clients)
    hosts = [Host(b, qtbot) for _ in range(4)]
    try:
        for h, host in enumerate(hosts):
            host.sock.sendall(lines(initialize_request(f"host{h}"), INITIALIZED))
            host.wait_for([1])
        for i in range(2, 22):
            for h, host in enumerate(hosts):
                host.sock.sendall(lines(write_call(i, f"s{h}", f"host {h} write {i}")))
            for host in hosts:
                host.wait_for([i])
        contents = {h: stored(b, f"s{h}") for h in range(4)}
    finally:
        for host in hosts:
            host.close()
        activity.close()
        b.close(qtbot)
    assert started, "no write went to the writer thread"
    assert served.count(True) >= 40, served  # of 80 writes (a host's first may come early)
    for h, host in enumerate(hosts):
        assert not any(host.replies[i]["result"].get("isError") for i in range(2, 22))
        assert contents[h] == [f"host {h} write {i}" for i in range(2, 22)]
    by_session: dict[str | None, set[str]] = {}
    for e in activity.entries():
        by_session.setdefault(e.session_id, set()).add(e.client)
    assert by_session == {f"s{h}": {f"host{h} 0"} for h in range(4)}
