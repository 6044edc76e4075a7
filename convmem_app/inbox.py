"""Carry what writer threads produce to the GUI thread, in batches.

`Inbox` is the one way over: a writer thread `put`s an item; the GUI thread gets lists of
items. The first item after a quiet spell wakes the GUI thread at once (one queued signal);
while items keep coming, the GUI thread looks again every `interval_ms` by a timer of its
own, and writer threads send no signal at all. So hosts writing a steady stream cost the GUI
thread one wake-up per interval, not one per write (a cross-thread signal per write, and the
GUI work it set off, cost the app ~0.3 ms of CPU per write between the writing thread and the
GUI thread: docs/benchmarks.md, "The app's CPU per write"), and what is shown lags the store by
at most one interval. Used for the memory browser's change events (`ChangeBridge`), the Hosts
tab's activity feed and the app's health refresh.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final, Generic, TypeVar

from PySide6.QtCore import QObject, Qt, QTimer, Signal

T = TypeVar("T")

INTERVAL_MS: Final = 100
"""How often the GUI thread takes what arrived while items keep coming."""


class _Wake(QObject):
    wake = Signal()


class Inbox(Generic[T]):
    """Items put from any thread, delivered as lists (in the order put) on the thread that
    owns `parent` (the GUI thread). See the module doc."""

    def __init__(
        self,
        deliver: Callable[[list[T]], None],
        parent: QObject | None = None,
        *,
        interval_ms: int = INTERVAL_MS,
    ) -> None:
        self._deliver = deliver
        self._lock = threading.Lock()
        self._items: list[T] = []
        # True from the wake (or the timer's start) until the GUI thread finds nothing new:
        # meanwhile writer threads only append
        self._armed = False
        self._signals = _Wake(parent)
        self._signals.wake.connect(self.take, Qt.ConnectionType.QueuedConnection)
        self._timer = QTimer(self._signals)
        self._timer.setSingleShot(True)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self.take)

    def put(self, item: T) -> None:
        """Any thread."""
        with self._lock:
            self._items.append(item)
            if self._armed:
                return
            self._armed = True
        self._signals.wake.emit()

    def take(self) -> None:
        """GUI thread: deliver what has arrived (also called by the wake and the timer)."""
        with self._lock:
            items, self._items = self._items, []
            if not items:
                self._armed = self._timer.isActive()
                return
            self._armed = True
        self._timer.start()  # look again in an interval: more may be on its way
        self._deliver(items)
