"""Carry MemoryService change events from writer threads to the GUI thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Qt, Signal

if TYPE_CHECKING:
    from convmem_engine.service import MemoryService


class ChangeBridge(QObject):
    """Subscribes to the service; re-emits each ChangeEvent as `changed(kind, id, session)`
    on the bridge's own (GUI) thread, in the order the events happened.

    The callback runs on the writer's thread: it queues the event and, when the queue was
    empty, wakes the GUI thread with one queued signal; the GUI thread then emits `changed`
    for every event waiting. So many hosts writing cost the GUI thread one cross-thread
    delivery per batch, not one per write.
    """

    changed = Signal(str, object, object)  # kind, message_id | None, session_id | None
    _waiting = Signal()

    def __init__(self, service: MemoryService, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._service = service
        self._unsubscribe: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._events: list[tuple[str, object, object]] = []
        self._waiting.connect(self._flush, Qt.ConnectionType.QueuedConnection)

    def start(self) -> None:
        if self._unsubscribe is None:
            self._unsubscribe = self._service.subscribe(self._on_event)

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    @property
    def active(self) -> bool:
        return self._unsubscribe is not None

    def _on_event(self, event: Any) -> None:  # writer thread
        with self._lock:
            self._events.append((str(event.kind), event.message_id, event.session_id))
            first = len(self._events) == 1
        if first:
            self._waiting.emit()

    def _flush(self) -> None:  # GUI thread
        with self._lock:
            events, self._events = self._events, []
        for kind, message_id, session_id in events:
            self.changed.emit(kind, message_id, session_id)
