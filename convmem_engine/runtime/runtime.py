"""`Runtime`: the one object that owns a data dir's running parts, for `convmem serve` and the app.

    runtime = Runtime(data_dir, parts=[...])
    runtime.open()                        # lock, store, service, engine loop, parts, MCP server
    runtime.add_listener(listener)        # stdio, the app's pipe, HTTP: each start(runtime)
    ...                                   # sessions: await runtime.serve_session(transport, ...)
    runtime.stop(grace)                   # listeners, parts, service (fsync, lock released)

Start order (`open`): the data dir's lock is taken (then `open(on_locked=...)`'s callback runs:
`convmem serve` answers the handshake from there on), the store is replayed and the service
opened (`MemoryService.open`), the engine loop starts, each part starts in the order given, the
MCP server is built. Listeners are added afterwards, while RUNNING, in any number. Stop order
(`stop`): every listener is told to stop at the same moment (newest first) and answers what it
has received within `grace`; then the parts stop, last started first; then the service closes
(the store is fsynced and closed, the lock released); then the engine loop ends. The state
machine is in docs/app.md.

Thread-safety: `open` blocks (it replays the store) and may run on any thread; `stop` blocks;
`stop_async` does not (the app's GUI thread uses it: its pipe listener needs the GUI loop to
run while it drains). Listener `stop` coroutines run on the engine loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from convmem_engine.runtime.activity import CURRENT_CLIENT
from convmem_engine.runtime.clients import ClientInfo, ClientRegistry
from convmem_engine.runtime.engine_thread import EngineThread

if TYPE_CHECKING:
    from mcp.server import Server

    from convmem_engine.mcp.line_transport import Lane, ReadChunk, Send
    from convmem_engine.service import MemoryService

log = logging.getLogger(__name__)

DEFAULT_GRACE = 10.0
"""Seconds listeners get, at stop, to answer the requests they have received."""


OpenService = Callable[[Path, Callable[[], None] | None], "MemoryService"]
"""Opens the store and service of a data dir; calls its second argument (when given) once the
data dir's lock is held, before the store is read."""


class RuntimeState(enum.StrEnum):
    NEW = "new"  # constructed, nothing open
    OPENING = "opening"  # open() is taking the lock, replaying the store, starting parts
    RUNNING = "running"  # service, parts and server up; listeners may be added
    FAILED = "failed"  # open() failed; nothing is held; open() may be called again
    STOPPING = "stopping"  # stop() is running: listeners, parts, service in that order
    STOPPED = "stopped"  # everything closed, the lock released; final


class RuntimeStateError(Exception):
    """A call that the runtime's current state does not allow (e.g. add_listener when not
    RUNNING, open when RUNNING)."""


class ListenerError(Exception):
    """A listener could not start accepting (its message says why; it names no content)."""


class Part(Protocol):
    """A subsystem the runtime starts and stops with the store (e.g. the agent's queue).

    `start` runs after the service is open and before the MCP server is built and any listener
    starts, on the thread calling `Runtime.open`; it may use `runtime.service`, `runtime.loop`.
    If it raises, the parts already started are stopped (reverse order), the service closes
    and `open` fails with that exception. `stop` runs after every listener has stopped and
    before the service closes, on the thread running the stop; it must not raise (a raise is
    logged and the stop goes on). `health` is quick and is shown under its `name`.
    """

    name: str

    def start(self, runtime: Runtime) -> None: ...

    def stop(self) -> None: ...

    def health(self) -> dict[str, Any]: ...


class Listener(Protocol):
    """A way clients reach the runtime: stdio, the app's local pipe, HTTP.

    `start` is called by `Runtime.add_listener` on the caller's thread (a Qt listener adds
    itself from the GUI thread) and returns once the listener accepts clients, or raises
    `ListenerError`. Each client connection runs `await runtime.serve_session(transport, ...)`
    on `runtime.loop`, which registers it in `runtime.clients`.

    `stop(grace)` runs on the engine loop: stop accepting, answer every request already
    received (within `grace` seconds, then cancel), end the sessions. It may be called again
    with a smaller grace (0: at once) while the first call is waiting: the second call must
    cut the wait short.
    """

    transport: str

    def start(self, runtime: Runtime) -> None: ...

    async def stop(self, grace: float) -> None: ...


@dataclass(frozen=True)
class RuntimeHealth:
    """Everything the app and `get_system_health` know about a runtime, in one place."""

    state: RuntimeState
    status: str  # "OK" / "DEGRADED" from the store; "" when the runtime is not running
    store: dict[str, Any] = field(default_factory=dict)  # get_system_health's fields
    clients: tuple[ClientInfo, ...] = ()
    listeners: tuple[str, ...] = ()  # transports, in the order they were added
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: str = ""  # why the runtime failed or the store check failed (an error code)


def _log_failure(what: str, exc: BaseException) -> None:
    # Frames and type only: an exception's message may quote stored content.
    frames = "".join(traceback.format_tb(exc.__traceback__))
    log.error("%s failed: %s (message withheld)\n%s", what, type(exc).__name__, frames)


def _open_service(data_dir: Path, on_locked: Callable[[], None] | None = None) -> MemoryService:
    from convmem_engine.service import MemoryService

    return MemoryService.open(data_dir, on_locked=on_locked)


def _build_server(service: MemoryService) -> Server[Any]:
    from convmem_engine.mcp.server import build_server

    return build_server(service)


class Runtime:
    """Owns the data-dir lock, the store and service, the engine loop, the parts, the MCP server
    and the listeners of one data dir. See the module doc for the order of things."""

    def __init__(
        self,
        data_dir: Path,
        *,
        parts: Sequence[Part] = (),
        open_service: OpenService = _open_service,
        build_server: Callable[[MemoryService], Server[Any]] = _build_server,
    ) -> None:
        self.data_dir = data_dir
        self.clients = ClientRegistry()
        self.error: BaseException | None = None  # why the last open() failed
        self._parts = list(parts)
        self._open_service = open_service
        self._build_server = build_server
        self._lock = threading.Lock()
        self._state = RuntimeState.NEW
        self._service: MemoryService | None = None
        self._server: Server[Any] | None = None
        self._loop: EngineThread | None = None
        self._started_parts: list[Part] = []
        self._listeners: list[Listener] = []
        self._observers: list[Callable[[RuntimeState], None]] = []
        self._stopped: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._stop_thread: threading.Thread | None = None
        self._listeners_stopped = False
        self._max_line_bytes: int | None = None

    @property
    def max_line_bytes(self) -> int:
        """The longest line a session accepts; a part may raise it (the agent: images)."""
        if self._max_line_bytes is None:
            from convmem_engine.mcp.line_transport import MAX_LINE_BYTES

            return MAX_LINE_BYTES
        return self._max_line_bytes

    @max_line_bytes.setter
    def max_line_bytes(self, value: int) -> None:
        self._max_line_bytes = value

    # ---- state ----------------------------------------------------------------------------

    @property
    def state(self) -> RuntimeState:
        return self._state

    def subscribe(self, callback: Callable[[RuntimeState], None]) -> Callable[[], None]:
        """Call `callback(state)` on every transition (on the thread making it)."""
        with self._lock:
            self._observers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._observers:
                    self._observers.remove(callback)

        return unsubscribe

    def _enter(self, state: RuntimeState) -> None:
        with self._lock:
            self._state = state
            observers = list(self._observers)
        log.info("runtime %s", state.value)
        for callback in observers:
            try:
                callback(state)
            except Exception as exc:
                _log_failure("runtime state observer", exc)

    # ---- what is running ------------------------------------------------------------------

    @property
    def service(self) -> MemoryService:
        if self._service is None:
            raise RuntimeStateError(f"the runtime is {self._state.value}: no service")
        return self._service

    @property
    def server(self) -> Server[Any]:
        if self._server is None:
            raise RuntimeStateError(f"the runtime is {self._state.value}: no MCP server")
        return self._server

    @property
    def loop(self) -> EngineThread:
        """The engine loop every session and listener coroutine runs on."""
        if self._loop is None:
            raise RuntimeStateError(f"the runtime is {self._state.value}: no engine loop")
        return self._loop

    @property
    def listeners(self) -> tuple[Listener, ...]:
        return tuple(self._listeners)

    # ---- open -----------------------------------------------------------------------------

    def open(self, *, on_locked: Callable[[], None] | None = None) -> None:
        """NEW or FAILED -> OPENING -> RUNNING; on an error -> FAILED and the error is raised
        (BusyError, CorruptStoreError, StoreIOError from the store; whatever a part raised).
        Blocks while the store is replayed. `on_locked()` runs on this thread as soon as the
        data dir's lock is held, before the store is read (`convmem serve` starts answering
        the handshake there); if it raises, the open fails with that error."""
        with self._lock:
            if self._state not in (RuntimeState.NEW, RuntimeState.FAILED):
                raise RuntimeStateError(f"cannot open a runtime that is {self._state.value}")
            self._state = RuntimeState.OPENING
        self._enter(RuntimeState.OPENING)
        self.error = None
        try:
            self._service = self._open_service(self.data_dir, on_locked)
            self._loop = EngineThread()
            self._loop.start()
            for part in self._parts:
                part.start(self)
                self._started_parts.append(part)
            self._server = self._build_server(self._service)
        except BaseException as exc:
            self.error = exc
            self._release()
            self._enter(RuntimeState.FAILED)
            raise
        self._enter(RuntimeState.RUNNING)

    def _release(self) -> None:
        """Undo what `open` did, in reverse (after a failed open, or at the end of stop)."""
        for part in reversed(self._started_parts):
            try:
                part.stop()
            except Exception as exc:
                _log_failure(f"stopping part {part.name}", exc)
        self._started_parts.clear()
        self._server = None
        if self._service is not None:
            try:
                self._service.close()
            except Exception as exc:  # the lock is released by process exit anyway
                _log_failure("closing the store", exc)
            self._service = None
        if self._loop is not None:
            self._loop.stop()
            self._loop = None

    # ---- listeners and sessions -----------------------------------------------------------

    def add_listener(self, listener: Listener) -> None:
        """Start `listener` (on this thread) and stop it with the runtime. RUNNING only; a
        `ListenerError` from its start leaves the runtime running without it."""
        with self._lock:
            if self._state is not RuntimeState.RUNNING:
                raise RuntimeStateError(f"cannot add a listener: the runtime is {self._state}")
        listener.start(self)
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        """Forget a listener its owner has already stopped (the app turning HTTP off or moving
        it to another port); the runtime will not stop it again."""
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    async def serve_session(
        self, transport: str, read_chunk: ReadChunk, send: Send, lane: Lane | None = None
    ) -> None:
        """Serve one MCP session over newline-delimited JSON-RPC (`serve_chunks`), listed in
        `clients` while it lasts. Call on the engine loop. `lane`: a reader on the loop that
        offers what it reads first (`line_transport.Lane`)."""
        from convmem_engine.mcp.line_transport import serve_chunks

        handle = self.clients.connect(transport)
        # the session's tool calls (and the change events they publish) know their client
        token = CURRENT_CLIENT.set(handle.client_id)
        try:
            await serve_chunks(
                self.server,
                read_chunk,
                send,
                on_request=handle.observe,
                max_line_bytes=self.max_line_bytes,
                inline=lambda: self._holds_up_nobody(handle.client_id),
                lane=lane,
            )
        finally:
            CURRENT_CLIENT.reset(token)
            handle.close()

    def _holds_up_nobody(self, client_id: int) -> bool:
        """Whether a session's write may run on the engine loop (fast_call.py, "One call
        alone"): no other client is active (`ClientRegistry.alone`) and no HTTP listener
        shares the loop (HTTP requests are not clients)."""
        for listener in self._listeners:
            if listener.transport == "http":
                return False
        return self.clients.alone(client_id)

    # ---- health ---------------------------------------------------------------------------

    def part(self, name: str) -> Part | None:
        """The part called `name` given at construction (None when there is none)."""
        return next((part for part in self._parts if part.name == name), None)

    def health(self) -> RuntimeHealth:
        """The runtime's health: its state, the store's `get_system_health`, the clients, the
        listeners and each part. Blocks briefly (the store's read lock); any thread."""
        state = self._state
        service = self._service
        store: dict[str, Any] = {}
        status = ""
        error = ""
        if self.error is not None:
            error = str(getattr(self.error, "code", type(self.error).__name__))
        if state is RuntimeState.RUNNING and service is not None:
            try:
                store = service.get_system_health()
                status = str(store.get("status", "OK"))
            except Exception as exc:
                status = "DEGRADED"
                error = str(getattr(exc, "code", type(exc).__name__))
        parts: dict[str, dict[str, Any]] = {}
        for part in list(self._started_parts):
            try:
                parts[part.name] = part.health()
            except Exception as exc:
                parts[part.name] = {"error": type(exc).__name__}
        return RuntimeHealth(
            state=state,
            status=status,
            store=store,
            clients=tuple(self.clients.clients()),
            listeners=tuple(listener.transport for listener in self._listeners),
            parts=parts,
            error=error,
        )

    # ---- stop -----------------------------------------------------------------------------

    def stop_async(self, grace: float = DEFAULT_GRACE) -> concurrent.futures.Future[None]:
        """Begin the stop (see the module doc) on a thread of its own; the future completes
        when the runtime is STOPPED. A second call while stopping with `grace` 0 cuts the
        listeners' grace short. Never blocks; safe from any thread."""
        with self._lock:
            state = self._state
            if state in (RuntimeState.NEW, RuntimeState.FAILED):
                self._state = RuntimeState.STOPPED
            elif state is RuntimeState.RUNNING:
                self._state = RuntimeState.STOPPING
                self._stop_thread = threading.Thread(
                    target=self._stop_sequence, args=(grace,), name="convmem-stop", daemon=True
                )
            elif state is RuntimeState.OPENING:
                raise RuntimeStateError("cannot stop a runtime while it opens; stop it after")
        if state in (RuntimeState.NEW, RuntimeState.FAILED):
            self._enter(RuntimeState.STOPPED)
            self._stopped.set_result(None)
        elif state is RuntimeState.RUNNING:
            self._enter(RuntimeState.STOPPING)
            assert self._stop_thread is not None
            self._stop_thread.start()
        elif state is RuntimeState.STOPPING and grace <= 0:
            self._force_listeners()
        return self._stopped

    def stop(self, grace: float = DEFAULT_GRACE) -> None:
        """Stop and wait until STOPPED. (Waits in short steps so signal handlers of the main
        thread still run on every platform.)"""
        future = self.stop_async(grace)
        while True:
            try:
                future.result(timeout=0.2)
                return
            except concurrent.futures.TimeoutError:
                continue

    def _force_listeners(self) -> None:
        loop = self._loop
        if loop is None or self._listeners_stopped:
            return
        for listener in reversed(self._listeners):
            try:
                loop.submit(listener.stop(0))
            except RuntimeError:  # the loop already closed
                return

    def _stop_sequence(self, grace: float) -> None:
        try:
            loop = self._loop
            listeners = list(reversed(self._listeners))
            if loop is not None and listeners and loop.running:

                async def stop_all() -> None:
                    results = await asyncio.gather(
                        *(listener.stop(grace) for listener in listeners), return_exceptions=True
                    )
                    for listener, result in zip(listeners, results, strict=True):
                        if isinstance(result, BaseException):
                            _log_failure(f"stopping the {listener.transport} listener", result)

                try:
                    loop.submit(stop_all()).result()
                except (concurrent.futures.CancelledError, RuntimeError) as exc:
                    _log_failure("stopping the listeners", exc)
            self._listeners_stopped = True
            self._release()
        finally:
            self._enter(RuntimeState.STOPPED)
            self._stopped.set_result(None)
