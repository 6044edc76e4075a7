"""Carry MemoryService change events from writer threads to the GUI thread, in batches
(`convmem_app.inbox.Inbox`), and hand each batch to the window's listeners in plain Python."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from PySide6.QtCore import QObject

from convmem_app.inbox import Inbox

if TYPE_CHECKING:
    from convmem_engine.service import ChangeEvent, MemoryService

INTERVAL_MS: Final = 250
"""While hosts keep writing, the window takes their changes at most this often (a change that
comes alone still arrives at once)."""

Listener = Callable[[list["ChangeEvent"]], None]


class ChangeBridge(QObject):
    """Subscribes to the service; hands what changed to each listener (`listen`) on the
    bridge's own (GUI) thread: lists of events in the order they happened, one call per batch
    (`Inbox`: the first change after a quiet spell at once, then at most one batch every
    `INTERVAL_MS` while hosts keep writing).

    A batch goes to the listeners as a plain Python call, not a Qt signal: with hosts writing,
    each PySide emission hands the GIL to a writer thread and waits to get it back, which cost
    the GUI thread more than everything the pages do with the events (docs/benchmarks.md, "The
    app's CPU per write with its window open")."""

    def __init__(
        self,
        service: MemoryService,
        parent: QObject | None = None,
        *,
        interval_ms: int = INTERVAL_MS,
    ) -> None:
        super().__init__(parent)
        self._service = service
        self._unsubscribe: Callable[[], None] | None = None
        self._listeners: list[Listener] = []
        self._inbox: Inbox[ChangeEvent] = Inbox(self._deliver, self, interval_ms=interval_ms)

    def listen(self, listener: Listener) -> None:
        """Call `listener(events)` on the GUI thread with every batch from now on."""
        self._listeners.append(listener)

    def start(self) -> None:
        if self._unsubscribe is None:
            self._unsubscribe = self._service.subscribe(self._inbox.put)  # writer threads

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    @property
    def active(self) -> bool:
        return self._unsubscribe is not None

    def _deliver(self, events: list[ChangeEvent]) -> None:  # GUI thread
        for listener in self._listeners:
            listener(events)
