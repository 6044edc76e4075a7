"""The local pipe: a QLocalServer whose connections become MCP sessions on the runtime's loop.

`PipeBridge` is the app's `Listener` (transport "pipe") of `convmem_engine.runtime`: the app
adds it to the running Runtime from the GUI thread (`start` listens), and `Runtime.stop` stops
it (`stop` runs the graceful shutdown below and waits until it is done).

Each accepted QLocalSocket is one host (one `convmem-shim`). The Qt thread accepts it and reads
its first bytes (a control message or MCP?). Then, for MCP, one of two byte paths:

- **direct** (Linux, macOS: the default off Windows): the connected Unix socket's descriptor is
  duplicated and served by the engine loop itself (`loop.connect_accepted_socket`); the Qt
  object is dropped (closing it closes only Qt's copy of the descriptor). Every byte after the
  first read goes socket -> engine loop -> socket, with no Qt thread hand-off per request, and
  asyncio's flow control in both directions (reading pauses while 2 MiB wait unread; writing
  waits while more than `HIGH_WATER` bytes wait to be sent). The listener and its access
  control stay Qt's (`UserAccessOption`). What the socket's read brings is offered to the
  session first (`line_transport.Lane`): a host's write that arrives alone is served and
  answered inside that read's callback, without waking the session's task.
- **relayed** (Windows, where QLocalServer's named pipe, with its user-only security
  descriptor, has no asyncio counterpart): the Qt thread reads the socket and hands the bytes
  to the engine loop in batches (one `call_soon_threadsafe` wakes the loop for everything read
  until the loop takes it); the engine hands its replies back the same way (one queued signal
  for all replies the Qt thread has not taken yet), where they are written to the socket.

Either way the bytes reach an `asyncio.StreamReader` that `Runtime.serve_session` reads. Qt
objects are only ever touched on the main thread, asyncio objects only on the engine thread;
what the two share for a relayed connection (`_Relay`) is guarded by a lock.

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
import os
import socket
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

from convmem_engine.mcp.line_transport import READ_CHUNK_BYTES, Lane
from convmem_engine.runtime import ListenerError

if TYPE_CHECKING:
    from convmem_engine.runtime import EngineThread, Runtime

CONTROL_PREFIX = b'{"convmem_control":'
CONTROL_LINE_MAX = 4096
# `serve_lines` reads chunks (not readline) and bounds line length itself; the limit only
# decides when the reader pauses its transport (above twice the limit). Relayed connections
# have no transport to pause; a direct one stops reading the socket while 2 MiB wait unread.
READER_LIMIT = 64 * 1024 * 1024
DIRECT_READER_LIMIT = 1024 * 1024
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


class _Relay:
    """What the Qt thread and the engine loop share for one relayed connection: bytes read
    and not yet taken by the engine (`inbox`), replies not yet taken by the Qt thread
    (`outbox`), and the bytes handed to Qt and not yet written (`unsent`). Each side wakes the
    other only when a box goes from empty to full, so a busy side takes many chunks at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inbox: list[bytes] = []
        self.outbox: list[bytes] = []
        self.unsent = 0
        self.blocked = False  # the engine waits for `unsent` to drop to LOW_WATER
        self.writable = asyncio.Event()  # engine side; set from the Qt thread via call_soon

    def put_in(self, data: bytes) -> bool:
        """Qt thread: queue bytes read; True when the engine must be woken to take them."""
        with self.lock:
            self.inbox.append(data)
            return len(self.inbox) == 1

    def take_in(self) -> bytes:
        with self.lock:
            chunks, self.inbox = self.inbox, []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def put_out(self, data: bytes) -> tuple[bool, bool]:
        """Engine: queue a reply; (wake the Qt thread?, wait for the socket to drain?)."""
        with self.lock:
            self.outbox.append(data)
            self.unsent += len(data)
            if self.unsent > HIGH_WATER and not self.blocked:
                self.blocked = True
                self.writable.clear()
            return len(self.outbox) == 1, self.blocked

    def take_out(self) -> bytes:
        with self.lock:
            chunks, self.outbox = self.outbox, []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def written(self, count: int) -> bool:
        """Qt thread: `count` bytes reached the socket; True when the engine must be woken."""
        with self.lock:
            self.unsent -= count
            if self.blocked and self.unsent <= LOW_WATER:
                self.blocked = False
                return True
            return False


@dataclass
class _EngineSession:
    """Engine-thread state of one MCP connection."""

    reader: asyncio.StreamReader
    relay: _Relay | None = None  # a relayed connection; else direct, with `transport`
    transport: asyncio.Transport | None = None
    at_line_start: bool = True  # the last byte fed was a newline (or nothing was fed)
    accepting: bool = True  # False once shutdown began: no new requests reach the session
    refused: bytes = b""  # bytes after shutdown, split into lines to refuse each request
    eof: bool = False  # the reader has been told end of input
    gone: bool = False  # the socket is closed: nothing more can be written
    writable: asyncio.Event = field(default_factory=asyncio.Event)  # direct: not paused
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # direct: socket closed
    task: asyncio.Task[None] | None = None
    lane: Lane | None = None  # direct: the session's synchronous lane (line_transport.Lane)
    unread: int = 0  # bytes fed to `reader` that the session has not read yet


@dataclass
class _Connection:
    """Qt-thread state of one accepted socket."""

    cid: int
    socket: QLocalSocket
    mode: str = "sniff"  # sniff -> mcp | control
    buffer: bytes = b""
    relay: _Relay | None = None


class _DirectProtocol(asyncio.BufferedProtocol):
    """The engine loop's side of a direct connection: bytes in to the session, flow control.

    A buffered protocol: the socket is read into one buffer of `READ_CHUNK_BYTES` kept for
    the connection (`recv_into`), and what arrived is copied out. (A plain protocol's
    transport allocates 256 KiB for every read, which glibc serves with an mmap, an mremap and
    a munmap per request: ~13 us of CPU and three more system calls each time.)"""

    def __init__(self, bridge: PipeBridge, cid: int, session: _EngineSession) -> None:
        self._bridge = bridge
        self._cid = cid
        self._session = session
        self._buffer = bytearray(READ_CHUNK_BYTES)
        self._view = memoryview(self._buffer)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)
        self._session.transport = transport
        self._session.writable.set()
        self._session.reader.set_transport(transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        self._bridge._e_feed(self._cid, bytes(self._view[:nbytes]))

    def eof_received(self) -> bool:
        # The host closed its side for writing: answer what it has sent, then close.
        PipeBridge._e_end_input(self._session)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        session = self._session
        session.gone = True
        session.writable.set()
        PipeBridge._e_end_input(session)
        session.closed.set()

    def pause_writing(self) -> None:
        self._session.writable.clear()

    def resume_writing(self) -> None:
        self._session.writable.set()


class PipeBridge(QObject):
    """Owns the QLocalServer; every host connection is one `Runtime.serve_session`."""

    transport = "pipe"

    hostsChanged = Signal(int)
    raiseRequested = Signal()
    quitRequested = Signal()
    drained = Signal()

    _outgoing = Signal(int)
    _engineEnded = Signal(int)
    _engineDrained = Signal()
    _shutdownRequested = Signal(float)

    def __init__(self, name: str, parent: QObject | None = None, *, direct: bool | None = None):
        """`direct`: serve MCP connections' bytes on the engine loop (see the module doc);
        by default off Windows only."""
        super().__init__(parent)
        self.name = name
        self.direct = sys.platform != "win32" if direct is None else direct
        self._direct_cids: set[int] = set()  # Qt thread: direct connections still open
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
            socket.bytesWritten.connect(lambda count, c=conn: self._on_bytes_written(c, count))
            if socket.bytesAvailable():
                self._on_ready_read(conn)

    def _on_ready_read(self, conn: _Connection) -> None:
        data = bytes(conn.socket.readAll().data())  # bytes already: no copy
        if not data:
            return
        if conn.relay is not None:
            if conn.relay.put_in(data):
                self.engine.call_soon(self._e_feed_relayed, conn.cid)
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
        if self.direct:
            # Hand the connected socket to the engine loop: a duplicate of its descriptor,
            # then Qt's object is dropped (abort closes Qt's descriptor only; nothing is sent
            # and the connection stays open). Qt has read nothing beyond `data`.
            try:
                descriptor = os.dup(int(conn.socket.socketDescriptor()))
            except OSError as exc:  # already closed (-1), or out of descriptors
                log.warning("cannot take over a host's socket: %s", type(exc).__name__)
                descriptor = -1
            conn.socket.blockSignals(True)
            conn.socket.abort()
            conn.socket.deleteLater()
            del self._connections[conn.cid]
            if descriptor < 0:
                self._maybe_finish_drain()
                return
            self._direct_cids.add(conn.cid)
            self.engine.call_soon(self._e_start_direct, conn.cid, descriptor, data)
        else:
            conn.relay = _Relay()
            conn.relay.put_in(data)
            self.engine.call_soon(self._e_start_relayed, conn.cid, conn.relay)
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

    def _on_outgoing(self, cid: int) -> None:
        conn = self._connections.get(cid)
        if conn is None or conn.relay is None:
            return
        data = conn.relay.take_out()
        if conn.socket.state() == QLocalSocket.LocalSocketState.ConnectedState:
            conn.socket.write(data)

    def _on_bytes_written(self, conn: _Connection, count: int) -> None:
        relay = conn.relay
        if relay is not None and relay.written(count):
            self.engine.call_soon(relay.writable.set)

    def _on_engine_ended(self, cid: int) -> None:
        # The session is over on the engine side (EOF or the session ended). A direct
        # connection is closed by the engine; a relayed one is closed here, after what is
        # still buffered has been written.
        if cid in self._direct_cids:
            self._direct_cids.discard(cid)
            self._set_hosts(self._hosts - 1)
            self._maybe_finish_drain()
            return
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
        self._direct_cids.clear()
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

    def _e_start_relayed(self, cid: int, relay: _Relay) -> None:
        session = _EngineSession(asyncio.StreamReader(limit=READER_LIMIT), relay=relay)
        self._sessions[cid] = session

        async def send(data: bytes) -> None:
            if session.gone:
                raise ConnectionResetError("the host's pipe is closed")
            wake, wait = relay.put_out(data)
            if wake:
                self._outgoing.emit(cid)
            if wait:
                await relay.writable.wait()

        self._e_run(cid, session, send)
        self._e_feed_relayed(cid)  # the first bytes, read while sniffing

    def _e_start_direct(self, cid: int, descriptor: int, first: bytes) -> None:
        session = _EngineSession(asyncio.StreamReader(limit=DIRECT_READER_LIMIT))
        self._sessions[cid] = session
        self._e_feed(cid, first)

        def send_now(data: bytes) -> bool:
            transport = session.transport
            if session.gone or transport is None or transport.is_closing():
                raise ConnectionResetError("the host's pipe is closed")
            transport.write(data)  # (buffered by the transport if the socket is full)
            return True

        def ready() -> bool:
            transport = session.transport
            return (
                not session.gone
                and transport is not None
                and not transport.is_closing()
                and session.writable.is_set()
            )

        async def send(data: bytes) -> None:
            send_now(data)
            if not session.writable.is_set():
                await session.writable.wait()

        # bytes read are offered to the session first (served at once when they are one
        # plain write): no hand-over to its task per request
        session.lane = Lane(ready, send_now)

        async def connect() -> None:
            loop = asyncio.get_running_loop()
            try:
                sock = socket.socket(fileno=descriptor)
            except OSError:
                os.close(descriptor)
                raise
            try:
                await loop.connect_accepted_socket(
                    lambda: _DirectProtocol(self, cid, session), sock
                )
            except BaseException:
                sock.close()
                raise

        self._e_run(cid, session, send, connect)

    def _e_run(
        self,
        cid: int,
        session: _EngineSession,
        send: Callable[[bytes], Awaitable[None]],
        connect: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        async def read_chunk() -> bytes:
            data = await session.reader.read(READ_CHUNK_BYTES)
            session.unread -= len(data)
            return data

        async def run() -> None:
            assert self._runtime is not None
            try:
                if connect is not None:
                    await connect()
                await self._runtime.serve_session(self.transport, read_chunk, send, session.lane)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug or a broken session: end this host only
                log.error("MCP session %d ended with %s", cid, type(exc).__name__)
            finally:
                self._sessions.pop(cid, None)
                if session.transport is not None:
                    session.transport.close()  # what is buffered is written first
                else:
                    session.closed.set()
                self._engineEnded.emit(cid)

        session.task = asyncio.get_running_loop().create_task(run(), name=f"mcp-session-{cid}")

    def _e_feed_relayed(self, cid: int) -> None:
        session = self._sessions.get(cid)
        if session is not None and session.relay is not None:
            data = session.relay.take_in()
            if data:
                self._e_feed(cid, data)

    def _e_feed(self, cid: int, data: bytes) -> None:
        session = self._sessions.get(cid)
        if session is None:
            return
        if session.eof:
            if not session.accepting:
                self._e_refuse(cid, session, data)
            return
        if session.accepting:
            session.at_line_start = data.endswith(b"\n")
            lane = session.lane
            if lane is not None and not session.unread and lane.offer(data):
                return  # served (nothing read before it is waiting: the order is kept)
            self._e_push(session, data)
            return
        # Shutting down while this host was in the middle of a line: let that line through
        # whole (it is a request already on its way), then end the session's input.
        newline = data.find(b"\n")
        if newline < 0:
            self._e_push(session, data)
            return
        self._e_push(session, data[: newline + 1])
        self._e_end_input(session)
        self._e_refuse(cid, session, data[newline + 1 :])

    @staticmethod
    def _e_push(session: _EngineSession, data: bytes) -> None:
        """Queue bytes for the session's `read_chunk`."""
        session.reader.feed_data(data)
        session.unread += len(data)

    def _e_refuse(self, cid: int, session: _EngineSession, data: bytes) -> None:
        """Answer requests that arrive after shutdown began with a JSON-RPC error."""
        *lines, session.refused = (session.refused + data).split(b"\n")
        for line in lines:
            reply = _shutting_down_reply(line)
            if reply is None or session.gone:
                continue
            if session.relay is not None:
                if session.relay.put_out(reply)[0]:
                    self._outgoing.emit(cid)
            elif session.transport is not None and not session.transport.is_closing():
                session.transport.write(reply)

    def _e_disconnected(self, cid: int) -> None:
        session = self._sessions.get(cid)
        if session is not None:
            session.gone = True
            session.writable.set()
            if session.relay is not None:
                session.relay.writable.set()
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
            direct = [s for s in self._sessions.values() if s.relay is None]
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
            # Direct connections: their last replies written, the sockets closed.
            closing = [asyncio.ensure_future(s.closed.wait()) for s in direct]
            if closing:
                _closed, unclosed = await asyncio.wait(closing, timeout=2.0)
                for waiter in unclosed:
                    waiter.cancel()
                for session in direct:
                    if session.transport is not None and not session.closed.is_set():
                        session.transport.abort()
        finally:
            self._engineDrained.emit()
