"""Carry MemoryService change events from writer threads to the GUI thread (in batches:
`convmem_app.inbox.Inbox`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from convmem_app.inbox import Inbox

if TYPE_CHECKING:
    from convmem_engine.service import MemoryService


class ChangeBridge(QObject):
    """Subscribes to the service; re-emits each ChangeEvent as `changed(kind, id, session)`
    on the bridge's own (GUI) thread, in the order the events happened, in batches (`Inbox`).
    """

    changed = Signal(str, object, object)  # kind, message_id | None, session_id | None

    def __init__(self, service: MemoryService, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._service = service
        self._unsubscribe: Callable[[], None] | None = None
        self._inbox: Inbox[tuple[str, object, object]] = Inbox(self._emit, self)

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
        self._inbox.put((str(event.kind), event.message_id, event.session_id))

    def _emit(self, events: list[tuple[str, object, object]]) -> None:  # GUI thread
        for kind, message_id, session_id in events:
            self.changed.emit(kind, message_id, session_id)
