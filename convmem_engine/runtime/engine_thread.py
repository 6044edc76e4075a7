"""The engine's own thread: one asyncio loop that runs every MCP session of a runtime.

`Runtime.open` starts it and `Runtime.stop` ends it; every listener's sessions run on it. In
the app, Qt owns the main thread: the Qt side hands work over with `submit` / `call_soon` and
gets results back through queued signals. Plain threading + asyncio.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


class EngineThread:
    """A daemon thread running one asyncio event loop until `stop()`."""

    def __init__(self, name: str = "convmem-engine") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = threading.Event()

    def start(self) -> None:
        self._thread.start()
        self._started.wait()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self.loop.is_closed()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        try:
            self.loop.run_forever()
        finally:
            try:
                self._cancel_remaining()
            except Exception as exc:  # the loop closes anyway; say why its tasks did not end
                log.error("engine loop shutdown failed: %s", type(exc).__name__)
            self.loop.close()

    def _cancel_remaining(self) -> None:
        tasks = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.run_until_complete(self.loop.shutdown_default_executor())

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `coro` on the engine loop from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call_soon(self, callback: Callable[..., object], *args: object) -> None:
        """Run `callback(*args)` on the engine loop; a no-op once the loop is closed."""
        with contextlib.suppress(RuntimeError):  # loop closed during shutdown
            self.loop.call_soon_threadsafe(callback, *args)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop (remaining tasks are cancelled) and wait for the thread to end."""
        if self._thread.is_alive():
            self.call_soon(self.loop.stop)
            self._thread.join(timeout)
            if self._thread.is_alive():  # a daemon thread: it dies with the process
                log.warning("the engine thread did not stop within %.0f s", timeout)
