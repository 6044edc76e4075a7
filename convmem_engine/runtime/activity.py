"""Who changed what: a bounded feed of writes, updates and deletes, each with its client.

`Runtime.serve_session` sets `CURRENT_CLIENT` to the session's client id for everything it
runs (tool calls run in worker threads that inherit it), and the service publishes its change
events synchronously on the writing thread, so `ActivityLog` reads the contextvar there and
knows which client made each change. Changes made outside an MCP session (the memory browser,
an import) carry no client and show as made here. Nothing here records content: an entry is
the kind of change, the message and session ids, the time and the client.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Final, NamedTuple

from convmem_engine.runtime.clients import ClientRegistry
from convmem_engine.service import ChangeEvent, MemoryService

CURRENT_CLIENT: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "convmem_current_client", default=None
)
MAX_ENTRIES: Final = 500


class Activity(NamedTuple):
    """One change. A tuple (built for every write on the writing thread: a frozen dataclass
    cost several times as much to build)."""

    at: float  # wall-clock seconds
    kind: str  # write, update, delete, rebuild
    message_id: str | None
    session_id: str | None
    client_id: int | None
    client: str  # "name version", "" when unknown or not from a client


class ActivityLog:
    """The last MAX_ENTRIES changes, newest last. Thread-safe."""

    def __init__(
        self,
        service: MemoryService,
        clients: ClientRegistry | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._clients = clients
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: deque[Activity] = deque(maxlen=MAX_ENTRIES)
        self._names: dict[int, str] = {}  # every client's name as last seen (also once gone)
        # the names of connected clients, good while the registry has not changed since:
        # looked up per change, asked of the registry only after a client came, said who it
        # is or went (`_generation` counts those)
        self._current: dict[int, tuple[int, str]] = {}
        self._generation = 0
        self._listeners: list[Callable[[Activity], None]] = []
        self._unsubscribe_clients = clients.subscribe(self._clients_changed) if clients else None
        self._unsubscribe = service.subscribe(self._on_change)

    def close(self) -> None:
        self._unsubscribe()
        if self._unsubscribe_clients is not None:
            self._unsubscribe_clients()

    def _clients_changed(self) -> None:  # on the thread of the session that changed
        self._generation += 1
        self._current = {}  # (gone clients' names stay in `_names`)

    def _client_name(self, client_id: int | None) -> str:
        if client_id is None or self._clients is None:
            return ""
        generation = self._generation
        known = self._current.get(client_id)
        if known is not None and known[0] == generation:
            return known[1]
        c = self._clients.get(client_id)
        if c is None:
            return self._names.get(client_id, f"client {client_id}")
        name = f"{c.name} {c.version}".strip() or f"{c.transport} client {client_id}"
        self._names[client_id] = name
        self._current[client_id] = (generation, name)
        return name

    def _on_change(self, event: ChangeEvent) -> None:
        client_id = CURRENT_CLIENT.get()
        entry = Activity(
            self._clock(),
            event.kind,
            event.message_id,
            event.session_id,
            client_id,
            self._client_name(client_id),
        )
        with self._lock:
            self._entries.append(entry)
            listeners = self._listeners  # a snapshot: the list is replaced, never changed
        for callback in listeners:
            callback(entry)

    def entries(self) -> list[Activity]:
        with self._lock:
            return list(self._entries)

    def subscribe(self, callback: Callable[[Activity], None]) -> Callable[[], None]:
        """`callback(entry)` on the writing thread after each change; returns unsubscribe."""
        return self.follow(callback)[1]

    def follow(
        self, callback: Callable[[Activity], None]
    ) -> tuple[list[Activity], Callable[[], None]]:
        """The entries so far and a subscription from there on, in one step: every change is
        either in the list or passed to `callback` (on the writing thread), never both, never
        neither. Returns (entries, unsubscribe)."""
        with self._lock:
            self._listeners = [*self._listeners, callback]
            entries = list(self._entries)

        def unsubscribe() -> None:
            with self._lock:
                self._listeners = [cb for cb in self._listeners if cb is not callback]

        return entries, unsubscribe
