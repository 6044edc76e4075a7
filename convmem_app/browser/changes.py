"""Carry MemoryService change events from writer threads to the GUI thread."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

if TYPE_CHECKING:
    from convmem_engine.service import MemoryService


class ChangeBridge(QObject):
    """Subscribes to the service; re-emits each ChangeEvent as `changed(kind, id, session)`.

    The callback runs on the writer's thread and only emits a signal. The bridge lives in the
    GUI thread, so Qt queues the signal to receivers there (connect bound methods of QObjects).
    """

    changed = Signal(str, object, object)  # kind, message_id | None, session_id | None

    def __init__(self, service: MemoryService, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._service = service
        self._unsubscribe: Callable[[], None] | None = None

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
        self.changed.emit(str(event.kind), event.message_id, event.session_id)
