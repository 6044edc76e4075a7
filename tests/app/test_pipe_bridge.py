"""The pipe bridge on its own (real engine thread, real service, real MCP server, real socket):
control messages, and what a host sees when the app quits under it."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from app_helpers import initialize_request, lines, write_call
from pytestqt.qtbot import QtBot

from convmem_app.shell.pipe_bridge import SHUTTING_DOWN_CODE, PipeBridge
from convmem_app.shim.paths import endpoint
from convmem_engine.runtime import Runtime
from convmem_engine.service import MemoryService

# Talks to the bridge over raw AF_UNIX sockets (on Windows it listens on a named pipe).
pytestmark = [pytest.mark.gui, pytest.mark.posix]


INITIALIZE = lines(initialize_request("bridge-test"))


def write(request_id: int, content: str) -> bytes:
    return lines(write_call(request_id, "bridge", content))


class Bridge:
    """A running Runtime with the pipe bridge as its listener (as the app has it)."""

    def __init__(self, data_dir: Path) -> None:
        self.runtime = Runtime(data_dir)
        self.runtime.open()
        self.service = self.runtime.service
        self.name = endpoint(data_dir)
        self.bridge = PipeBridge(self.name)
        self.runtime.add_listener(self.bridge)

    def close(self, qtbot: QtBot) -> None:
        stopped = self.runtime.stop_async(0)  # the bridge drains on the Qt loop: keep it running
        qtbot.waitUntil(stopped.done, timeout=30_000)


@pytest.fixture
def bridge(tmp_path: Path, qtbot: QtBot) -> Iterator[Bridge]:
    b = Bridge(tmp_path / "data")
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
