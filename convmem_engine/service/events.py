"""Change events: a plain callback list (no Qt); the GUI and others subscribe."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(__name__)

ChangeKind = Literal["write", "update", "delete", "rebuild"]


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    kind: ChangeKind
    message_id: str | None
    session_id: str | None


class EventHub:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[ChangeEvent], None]] = []

    def subscribe(self, callback: Callable[[ChangeEvent], None]) -> Callable[[], None]:
        with self._lock:
            self._callbacks = [*self._callbacks, callback]

        def unsubscribe() -> None:
            with self._lock:
                self._callbacks = [cb for cb in self._callbacks if cb is not callback]

        return unsubscribe

    def publish(self, event: ChangeEvent) -> None:
        for callback in self._callbacks:  # a snapshot: the list is replaced, never mutated
            try:
                callback(event)
            except Exception:  # a subscriber's bug must not fail the write that already happened
                log.exception("change event subscriber failed (event kind %s)", event.kind)
