"""The runtime: one object that owns a data dir's running parts (docs/app.md, "The runtime").

runtime = Runtime(data_dir, parts=[...])     # Part: start(runtime) / stop() / health()
runtime.open()                               # lock, store, service, engine loop, parts, server
runtime.add_listener(listener)               # Listener: start(runtime) / async stop(grace)
runtime.clients.clients()                    # who is connected, over what, since when
runtime.health()                             # state + store health + clients + parts
runtime.stop(grace) / runtime.stop_async(grace)

`convmem serve` is `serve_cli` (a Runtime with a `StdioListener`); the tray app runs the same
Runtime on its engine thread with its local-pipe listener.

The names below are loaded when first used, so `convmem serve` can start answering the
handshake (`front.py`) before the SDK and the store's modules are imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from convmem_engine.domain.lazy import lazy_exports

if TYPE_CHECKING:
    from convmem_engine.runtime.clients import ClientHandle, ClientInfo, ClientRegistry
    from convmem_engine.runtime.engine_thread import EngineThread
    from convmem_engine.runtime.runtime import (
        DEFAULT_GRACE,
        Listener,
        ListenerError,
        Part,
        Runtime,
        RuntimeHealth,
        RuntimeState,
        RuntimeStateError,
    )
    from convmem_engine.runtime.stdio_listener import StdioListener

_WHERE = {
    "ClientHandle": "clients",
    "ClientInfo": "clients",
    "ClientRegistry": "clients",
    "EngineThread": "engine_thread",
    "DEFAULT_GRACE": "runtime",
    "Listener": "runtime",
    "ListenerError": "runtime",
    "Part": "runtime",
    "Runtime": "runtime",
    "RuntimeHealth": "runtime",
    "RuntimeState": "runtime",
    "RuntimeStateError": "runtime",
    "StdioListener": "stdio_listener",
}

__all__ = [
    "DEFAULT_GRACE",
    "ClientHandle",
    "ClientInfo",
    "ClientRegistry",
    "EngineThread",
    "Listener",
    "ListenerError",
    "Part",
    "Runtime",
    "RuntimeHealth",
    "RuntimeState",
    "RuntimeStateError",
    "StdioListener",
]


__getattr__ = lazy_exports(__name__, _WHERE)
