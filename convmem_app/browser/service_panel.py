"""The base of every browser panel that talks to the store."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtWidgets import QWidget

from convmem_app.browser.jobs import JobRunner

if TYPE_CHECKING:
    from convmem_engine.service import MemoryService


class ServicePanel(QWidget):
    """A widget over one MemoryService. It never calls the service on the GUI thread: every
    call goes through the window's shared `JobRunner`, and the results come back as signals."""

    def __init__(
        self, service: MemoryService, runner: JobRunner, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self._service = service
        self._runner = runner
