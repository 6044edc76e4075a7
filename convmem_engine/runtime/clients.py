"""The clients connected to a runtime, whatever their transport: what the app's host list shows.

A listener calls `ClientRegistry.connect(transport)` when an MCP session starts and
`ClientHandle.close()` when it ends; `Runtime.serve_session` does both, and feeds each request
(its method and params) to `ClientHandle.observe`, which counts it and reads the client's name
and version from the handshake (`initialize`'s `clientInfo`, or the
`io.modelcontextprotocol/clientInfo` entry of a request's `_meta` in the 2026-07-28 era).
Thread-safe: sessions run on the engine loop, the app reads from its GUI thread.

Nothing here records message content: a request is counted, never kept.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

log = logging.getLogger(__name__)

CLIENT_FIELD_MAX: Final = 100
"""Characters kept of a client's self-reported name or version (it is shown, not trusted)."""
QUIET_SECONDS: Final = 0.1
"""A client counts as active for this long after its last request (see `alone`)."""


@dataclass(frozen=True)
class ClientInfo:
    """One connected client, as of the moment `ClientRegistry.clients()` was called."""

    client_id: int
    transport: str  # "stdio", "pipe", "http", ...
    name: str  # from the handshake; "" until the client said
    version: str
    since: float  # wall-clock seconds (time.time()) when the session started
    requests: int  # JSON-RPC requests received so far
    last_activity: float  # wall-clock seconds of the last request (or of `since`)


class _Entry:
    """A client's live record: counted in place on every request (a new ClientInfo per request
    was ~5% of a write's CPU on the engine loop); readers get ClientInfo snapshots."""

    __slots__ = ("client_id", "last", "name", "requests", "since", "transport", "version")

    def __init__(self, client_id: int, transport: str, now: float) -> None:
        self.client_id = client_id
        self.transport = transport
        self.name = ""
        self.version = ""
        self.since = now
        self.requests = 0
        self.last = now

    def info(self) -> ClientInfo:
        return ClientInfo(
            self.client_id,
            self.transport,
            self.name,
            self.version,
            self.since,
            self.requests,
            self.last,
        )


def _clean(value: object) -> str:
    if not isinstance(value, str):
        return ""
    printable = "".join(ch for ch in value if ch.isprintable())
    return printable[:CLIENT_FIELD_MAX]


@functools.cache
def _client_info_meta_key() -> str:
    from mcp_types import CLIENT_INFO_META_KEY  # loaded with the SDK by then

    return CLIENT_INFO_META_KEY


def _implementation(params: Mapping[str, Any] | None, method: str) -> Mapping[str, Any] | None:
    if not params:
        return None
    if method == "initialize":
        info = params.get("clientInfo")
    else:
        meta = params.get("_meta")
        info = meta.get(_client_info_meta_key()) if isinstance(meta, Mapping) else None
    return info if isinstance(info, Mapping) else None


class ClientHandle:
    """A listener's handle on one registered client."""

    def __init__(self, registry: ClientRegistry, client_id: int) -> None:
        self._registry = registry
        self.client_id = client_id
        # the name and version as the client last sent them, before `_clean` (a client of
        # the 2026-07-28 era sends them with every request: cleaned once, not per request)
        self._said: tuple[object, object] | None = None

    def observe(self, method: str, params: Mapping[str, Any] | None) -> None:
        """Count a request; take the client's name and version from it if it carries them
        (a quick call: it runs for every request, on the session's loop)."""
        info = _implementation(params, method)
        name = version = None
        if info is not None:
            said = (info.get("name"), info.get("version"))
            if said != self._said:
                self._said = said
                name, version = _clean(said[0]), _clean(said[1])
        self._registry._touch(self.client_id, name, version)

    def identify(self, name: str, version: str) -> None:
        """Set the client's name and version (for transports that learn them another way)."""
        self._registry._touch(self.client_id, _clean(name), _clean(version), count=False)

    def close(self) -> None:
        self._registry._remove(self.client_id)


class ClientRegistry:
    """Every connected client of one runtime."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._clients: dict[int, _Entry] = {}
        self._ids = itertools.count(1)
        self._listeners: list[Callable[[], None]] = []
        # the last request's client and time, then the last of another client before it
        self._recent: list[tuple[int, float]] = []

    def connect(self, transport: str) -> ClientHandle:
        now = self._clock()
        with self._lock:
            client_id = next(self._ids)
            self._clients[client_id] = _Entry(client_id, transport, now)
        self._notify()
        return ClientHandle(self, client_id)

    def clients(self) -> list[ClientInfo]:
        """The connected clients, oldest first."""
        with self._lock:
            return [self._clients[key].info() for key in sorted(self._clients)]

    def get(self, client_id: int) -> ClientInfo | None:
        """One connected client, or None when it is not (or no longer) connected."""
        with self._lock:
            entry = self._clients.get(client_id)
            return None if entry is None else entry.info()

    def count(self, transport: str | None = None) -> int:
        with self._lock:
            if transport is None:
                return len(self._clients)
            return sum(1 for c in self._clients.values() if c.transport == transport)

    def alone(self, client_id: int) -> bool:
        """True when no other client has made a request in the last `QUIET_SECONDS`: a
        request of `client_id` served on the engine loop then holds up no other client's
        (hosts that stay connected but idle do not count; with several hosts writing at once
        their calls keep running in worker threads, sharing fsyncs)."""
        for cid, at in self._recent:  # (a list replaced or set by item: no lock needed)
            if cid != client_id:
                return self._clock() - at >= QUIET_SECONDS
        return True

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback()` (on the session's thread) when a client connects, says who it is,
        or disconnects; not on every request (poll `clients()` for counts). Returns the
        function that unsubscribes it."""
        with self._lock:
            self._listeners.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._listeners:
                    self._listeners.remove(callback)

        return unsubscribe

    def _touch(
        self, client_id: int, name: str | None, version: str | None, *, count: bool = True
    ) -> None:
        now = self._clock()
        identified = False
        with self._lock:
            entry = self._clients.get(client_id)
            if entry is None:
                return
            if count:
                entry.requests += 1
                entry.last = now
                recent = self._recent
                if recent and recent[0][0] == client_id:
                    recent[0] = (client_id, now)
                else:
                    self._recent = [(client_id, now), *recent[:1]]
            if name and (name, version or "") != (entry.name, entry.version):
                entry.name, entry.version = name, version or ""
                identified = True
        if identified:
            self._notify()

    def _remove(self, client_id: int) -> None:
        with self._lock:
            removed = self._clients.pop(client_id, None) is not None
        if removed:
            self._notify()

    def _notify(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for callback in listeners:
            try:
                callback()
            except Exception as exc:  # a subscriber's bug must not end a session
                log.error("client registry subscriber failed: %s", type(exc).__name__)
