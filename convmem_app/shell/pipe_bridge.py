"""The local pipe: a QLocalServer whose connections become MCP sessions on the runtime's loop.

`PipeBridge` is the app's `Listener` (transport "pipe") of `convmem_engine.runtime`: the app
adds it to the running Runtime from the GUI thread (`start` listens), and `Runtime.stop` stops
it (`stop` runs the graceful shutdown below and waits until it is done).

Each accepted QLocalSocket is one host (one `convmem-shim`). Its bytes are fed, from the Qt
main thread, into an `asyncio.StreamReader` on the engine loop (`call_soon_threadsafe`); the
engine answers through a `send` coroutine that hands the bytes back to the Qt thread with a
queued signal, where they are written to the socket. Qt objects are only ever touched on the
main thread, asyncio objects only on the engine thread.

Control messages: a connection whose first bytes are `{"convmem_control":` is not a host but
another ConvMem process talking to this app. Its first line is one JSON object
`{"convmem_control": "raise" | "quit" | "status"}`; the app answers one line
`{"convmem_control": "ok", ...}` (or `"error"`) and closes. No JSON-RPC message can start that
way, so a host's first bytes are recognised after at most 19 bytes and pass on unchanged.

Graceful shutdown (`shutdown()`): stop accepting connections; end each session's input at
the next line boundary (a request half received is let through whole) and answer requests that
arrive later with a JSON-RPC error; each session answers every request it has read before it
returns (bounded by the grace period); write out what is still buffered, close the sockets,
then emit `drained`. `stop(0)` while that runs cancels the sessions still running.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

from convmem_engine.mcp.line_transport import READ_CHUNK_BYTES
from convmem_engine.runtime import ListenerError

if TYPE_CHECKING:
    from convmem_engine.runtime import EngineThread, Runtime

CONTROL_PREFIX = b'{"convmem_control":'
CONTROL_LINE_MAX = 4096
# `serve_lines` reads chunks (not readline) and bounds line length itself; the limit only
# decides when the reader would pause a transport, and there is none here.
READER_LIMIT = 64 * 1024 * 1024
SHUTTING_DOWN_CODE = -32000
# Output flow control: a session's `send` waits while more than HIGH_WATER bytes are queued for
# a socket (a host that does not read), until they drop to LOW_WATER.
HIGH_WATER = 4 * 1024 * 1024
LOW_WATER = 1024 * 1024

log = logging.getLogger(__name__)


def control_line(command: str, **extra: object) -> bytes:
    return json.dumps({"convmem_control": command, **extra}).encode() + b"\n"


def _shutting_down_reply(request_line: bytes) -> bytes | None:
    try:
        message = json.loads(request_line)
    except ValueError:
        return None
    if not (isinstance(message, dict) and "method" in message and "id" in message):
        return None
    error = {"code": SHUTTING_DOWN_CODE, "message": "ConvMem is shutting down; try again"}
    return json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error}).encode() + b"\n"


@dataclass
class _EngineSession:
    """Engine-thread state of one MCP connection."""

    reader: asyncio.StreamReader
    at_line_start: bool = True  # the last byte fed was a newline (or nothing was fed)
    accepting: bool = True  # False once shutdown began: no new requests reach the session
    refused: bytes = b""  # bytes after shutdown, split into lines to refuse each request
    eof: bool = False  # the reader has been told end of input
    gone: bool = False  # the socket is closed: nothing more can be written
    unsent: int = 0  # bytes handed to the Qt thread and not yet written to the socket
    writable: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


@dataclass
class _Connection:
    """Qt-thread state of one accepted socket."""

    cid: int
    socket: QLocalSocket
    mode: str = "sniff"  # sniff -> mcp | control
    buffer: bytes = b""


class PipeBridge(QObject):
    """Owns the QLocalServer; every host connection is one `Runtime.serve_session`."""

    transport = "pipe"

    hostsChanged = Signal(int)
    raiseRequested = Signal()
    quitRequested = Signal()
    drained = Signal()

    _outgoing = Signal(int, object)
    _engineEnded = Signal(int)
    _engineDrained = Signal()
    _shutdownRequested = Signal(float)

    def __init__(self, name: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.name = name
        self._runtime: Runtime | None = None
        self._engine: EngineThread | None = None
        self._stopped: asyncio.Event | None = None  # engine thread: set once drained
        self._drained = False
        self._local = QLocalServer(self)
        self._local.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        self._local.setMaxPendingConnections(128)
        self._local.setListenBacklogSize(128)
        self._local.newConnection.connect(self._on_new_connection)
        self._connections: dict[int, _Connection] = {}
        self._next_id = 1
        self._hosts = 0
        self._shutting_down = False
        self._sessions: dict[int, _EngineSession] = {}  # engine thread only
        queued = Qt.ConnectionType.QueuedConnection
        self._outgoing.connect(self._on_outgoing, queued)
        self._engineEnded.connect(self._on_engine_ended, queued)
        self._engineDrained.connect(self._on_engine_drained, queued)
        self._shutdownRequested.connect(self.shutdown, queued)
        self._close_timer = QTimer(self)
        self._close_timer.setSingleShot(True)
        self._close_timer.timeout.connect(self._finish_drain)
        self._status_extra: Callable[[], dict[str, object]] = dict

    # ---- Qt thread -------------------------------------------------------------------------

    @property
    def host_count(self) -> int:
        return self._hosts

    def set_status_provider(self, provider: Callable[[], dict[str, object]]) -> None:
        """Extra fields for the answer to a `status` control message."""
        self._status_extra = provider

    @property
    def engine(self) -> EngineThread:
        if self._engine is None:
            raise RuntimeError("the pipe bridge has not been started")
        return self._engine

    def start(self, runtime: Runtime) -> None:
        """Listen on `name` (the `Listener` start; GUI thread). Call only while the runtime
        holds the data-dir lock: a stale socket of a crashed app is removed first, which would
        also cut off a live app's socket. Raises `ListenerError`."""
        self._runtime = runtime
        self._engine = runtime.loop
        QLocalServer.removeServer(self.name)
        if not self._local.listen(self.name):
            raise ListenerError(f"local pipe {self.name}: {self._local.errorString()}")

    async def stop(self, grace: float) -> None:
        """The `Listener` stop (engine loop): the graceful shutdown, waited for. A second call
        with `grace` 0 cancels the sessions still running."""
        if self._drained:
            return
        if self._stopped is None:
            self._stopped = asyncio.Event()
            self._shutdownRequested.emit(grace)
        elif grace <= 0:
            for session in list(self._sessions.values()):
                if session.task is not None:
                    session.task.cancel()
        await self._stopped.wait()

    def _on_new_connection(self) -> None:
        while self._local.hasPendingConnections():
            socket = self._local.nextPendingConnection()
            if socket is None:
                break
            if self._shutting_down:
                socket.abort()
                socket.deleteLater()
                continue
            cid = self._next_id
            self._next_id += 1
            conn = _Connection(cid, socket)
            self._connections[cid] = conn
            socket.readyRead.connect(lambda c=conn: self._on_ready_read(c))
            socket.disconnected.connect(lambda c=conn: self._on_disconnected(c))
            socket.bytesWritten.connect(
                lambda count, c=conn: self.engine.call_soon(self._e_written, c.cid, count)
            )
            if socket.bytesAvailable():
                self._on_ready_read(conn)

    def _on_ready_read(self, conn: _Connection) -> None:
        data = bytes(conn.socket.readAll().data())
        if not data:
            return
        if conn.mode == "mcp":
            self.engine.call_soon(self._e_feed, conn.cid, data)
            return
        conn.buffer += data
        if conn.mode == "sniff":
            head = conn.buffer[: len(CONTROL_PREFIX)]
            if CONTROL_PREFIX.startswith(head):
                if len(head) < len(CONTROL_PREFIX):
                    return  # not enough bytes yet to decide
                conn.mode = "control"
            else:
                self._start_mcp(conn)
                return
        self._handle_control(conn)

    def _start_mcp(self, conn: _Connection) -> None:
        conn.mode = "mcp"
        data, conn.buffer = conn.buffer, b""
        self.engine.call_soon(self._e_start, conn.cid)
        self.engine.call_soon(self._e_feed, conn.cid, data)
        self._set_hosts(self._hosts + 1)

    def _handle_control(self, conn: _Connection) -> None:
        line, newline, _rest = conn.buffer.partition(b"\n")
        if not newline:
            if len(conn.buffer) > CONTROL_LINE_MAX:
                conn.socket.abort()
            return
        conn.buffer = b""
        try:
            command = json.loads(line).get("convmem_control")
        except (ValueError, AttributeError):
            command = None
        if command == "raise":
            reply = control_line("ok")
            self.raiseRequested.emit()
        elif command == "quit":
            reply = control_line("ok")
            QTimer.singleShot(0, self.quitRequested.emit)
        elif command == "status":
            reply = control_line("ok", hosts=self._hosts, **self._status_extra())
        else:
            reply = control_line("error", message="convmem_control: unknown command")
        conn.socket.write(reply)
        conn.socket.disconnectFromServer()

    def _on_disconnected(self, conn: _Connection) -> None:
        if self._connections.pop(conn.cid, None) is None:
            return
        if conn.mode == "mcp":
            self.engine.call_soon(self._e_disconnected, conn.cid)
            self._set_hosts(self._hosts - 1)
        conn.socket.deleteLater()
        self._maybe_finish_drain()

    def _on_outgoing(self, cid: int, data: bytes) -> None:
        conn = self._connections.get(cid)
        if conn is not None and conn.socket.state() == QLocalSocket.LocalSocketState.ConnectedState:
            conn.socket.write(data)

    def _on_engine_ended(self, cid: int) -> None:
        # The session is over on the engine side (EOF or the session ended): close the pipe,
        # after what is still buffered has been written.
        conn = self._connections.get(cid)
        if conn is not None:
            conn.socket.disconnectFromServer()

    def _set_hosts(self, count: int) -> None:
        self._hosts = count
        self.hostsChanged.emit(count)

    def shutdown(self, grace: float = 10.0) -> None:
        """Graceful stop (see module doc); emits `drained` once, when done."""
        if self._shutting_down:
            if self._drained:  # already done (e.g. asked directly, then by the runtime)
                self._signal_stopped()
            return
        self._shutting_down = True
        self._local.close()
        if self._engine is None or not self._engine.running:
            self._on_engine_drained()
            return
        self._engine.submit(self._e_drain(grace))

    def _on_engine_drained(self) -> None:
        for conn in list(self._connections.values()):
            conn.socket.disconnectFromServer()
        self._close_timer.start(2000)
        self._maybe_finish_drain()

    def _maybe_finish_drain(self) -> None:
        if self._shutting_down and self._close_timer.isActive() and not self._connections:
            self._finish_drain()

    def _finish_drain(self) -> None:
        self._close_timer.stop()
        for conn in list(self._connections.values()):
            conn.socket.abort()
        self._connections.clear()
        if self._hosts:
            self._set_hosts(0)
        self._drained = True
        self._signal_stopped()
        self.drained.emit()

    def _signal_stopped(self) -> None:
        stopped = self._stopped
        if stopped is not None and self._engine is not None:
            self._engine.call_soon(stopped.set)

    # ---- engine thread ---------------------------------------------------------------------

    def _e_start(self, cid: int) -> None:
        session = _EngineSession(asyncio.StreamReader(limit=READER_LIMIT))
        self._sessions[cid] = session

        async def send(data: bytes) -> None:
            if session.gone:
                raise ConnectionResetError("the host's pipe is closed")
            session.unsent += len(data)
            self._outgoing.emit(cid, data)
            if session.unsent > HIGH_WATER:
                session.writable.clear()
                await session.writable.wait()

        async def read_chunk() -> bytes:
            return await session.reader.read(READ_CHUNK_BYTES)

        async def run() -> None:
            assert self._runtime is not None
            try:
                await self._runtime.serve_session(self.transport, read_chunk, send)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug or a broken session: end this host only
                log.error("MCP session %d ended with %s", cid, type(exc).__name__)
            finally:
                self._sessions.pop(cid, None)
                self._engineEnded.emit(cid)

        session.task = asyncio.get_running_loop().create_task(run(), name=f"mcp-session-{cid}")

    def _e_feed(self, cid: int, data: bytes) -> None:
        session = self._sessions.get(cid)
        if session is None:
            return
        if session.eof:
            if not session.accepting:
                self._e_refuse(cid, session, data)
            return
        if session.accepting:
            session.reader.feed_data(data)
            session.at_line_start = data.endswith(b"\n")
            return
        # Shutting down while this host was in the middle of a line: let that line through
        # whole (it is a request already on its way), then end the session's input.
        newline = data.find(b"\n")
        if newline < 0:
            session.reader.feed_data(data)
            return
        session.reader.feed_data(data[: newline + 1])
        self._e_end_input(session)
        self._e_refuse(cid, session, data[newline + 1 :])

    def _e_refuse(self, cid: int, session: _EngineSession, data: bytes) -> None:
        """Answer requests that arrive after shutdown began with a JSON-RPC error."""
        *lines, session.refused = (session.refused + data).split(b"\n")
        for line in lines:
            reply = _shutting_down_reply(line)
            if reply is not None:
                session.unsent += len(reply)
                self._outgoing.emit(cid, reply)

    def _e_written(self, cid: int, count: int) -> None:
        session = self._sessions.get(cid)
        if session is not None:
            session.unsent -= count
            if session.unsent <= LOW_WATER:
                session.writable.set()

    def _e_disconnected(self, cid: int) -> None:
        session = self._sessions.get(cid)
        if session is not None:
            session.gone = True
            session.writable.set()
            self._e_end_input(session)

    @staticmethod
    def _e_end_input(session: _EngineSession) -> None:
        if not session.eof:
            session.eof = True
            session.reader.feed_eof()

    async def _e_drain(self, grace: float) -> None:
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + grace
            for session in self._sessions.values():
                session.accepting = False
                if session.at_line_start:
                    self._e_end_input(session)
            # A session answers every request it has read before it returns.
            tasks = [s.task for s in self._sessions.values() if s.task is not None]
            if tasks:
                _done, pending = await asyncio.wait(tasks, timeout=max(0.5, deadline - loop.time()))
                for task in pending:
                    task.cancel()
                if pending:
                    log.warning("%d session(s) did not finish within the quit grace", len(pending))
                    await asyncio.gather(*pending, return_exceptions=True)
        finally:
            self._engineDrained.emit()
