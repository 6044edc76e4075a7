"""Message detail: every field, revision and times, and the full content.

Content longer than the history rows keep is read through the content view in chunks pinned to
one revision, with a progress bar and a cancel button.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from convmem_app.browser import format as fmt
from convmem_app.browser.calls import fetch_content
from convmem_app.browser.history_model import CLIPPED
from convmem_app.browser.jobs import JobRunner
from convmem_app.browser.service_panel import ServicePanel

if TYPE_CHECKING:
    from convmem_engine.service import MemoryService


class MessageDetail(ServicePanel):
    contentLoaded = Signal(str)  # message id whose full content is now shown

    def __init__(
        self, service: MemoryService, runner: JobRunner, parent: QWidget | None = None
    ) -> None:
        super().__init__(service, runner, parent)
        self.message: dict[str, Any] | None = None

        self.header = QLabel()
        self.header.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.header.setWordWrap(True)

        meta_box = QGroupBox("Metadata")
        form = QFormLayout(meta_box)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.fields: dict[str, QLabel] = {}
        for key, label in (
            ("memory_kind", "Kind"),
            ("memory_tier", "Tier"),
            ("importance", "Importance"),
            ("tags", "Tags"),
            ("summary", "Summary"),
            ("relations", "Relations"),
            ("source_message_ids", "Sources"),
            ("tool_call_id", "Tool call id"),
        ):
            value = QLabel()
            value.setWordWrap(True)
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.fields[key] = value
            form.addRow(label + ":", value)

        self.content = QPlainTextEdit()
        self.content.setReadOnly(True)
        self.content.setObjectName("messageContent")
        self.content.setPlaceholderText("Select a message to see its content.")

        self.progress = QProgressBar()
        self.progress.setFormat("Loading content… %p%")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel_loading)
        progress_row = QHBoxLayout()
        progress_row.addWidget(self.progress, 1)
        progress_row.addWidget(self.cancel_button)
        self.progress_widget = QWidget()
        self.progress_widget.setLayout(progress_row)
        progress_row.setContentsMargins(0, 0, 0, 0)
        self.progress_widget.hide()

        layout = QVBoxLayout(self)
        layout.addWidget(self.header)
        meta_scroll = QScrollArea()
        meta_scroll.setWidgetResizable(True)
        meta_scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        meta_scroll.setWidget(meta_box)
        meta_scroll.setMinimumHeight(60)
        content_box = QWidget()
        content_layout = QVBoxLayout(content_box)
        content_layout.setContentsMargins(0, 0, 0, 0)
        content_layout.addWidget(self.progress_widget)
        content_layout.addWidget(QLabel("Content:"))
        content_layout.addWidget(self.content, 1)
        self.split = QSplitter(Qt.Orientation.Vertical)
        self.split.setObjectName("detailSplit")
        self.split.addWidget(meta_scroll)
        self.split.addWidget(content_box)
        self.split.setChildrenCollapsible(False)
        self.split.setSizes([230, 300])
        layout.addWidget(self.split, 1)
        self.clear()

    @property
    def loading(self) -> bool:
        return self._job is not None

    def clear(self, note: str = "") -> None:
        self.cancel_loading()
        self.message = None
        self.header.setText(note or "No message selected.")
        for label in self.fields.values():
            label.clear()
        self.content.clear()

    def show_message(self, message: dict[str, Any]) -> None:
        self.cancel_loading()
        self.message = message
        meta = message.get("metadata", {})
        size = fmt.bytes_text(fmt.utf8_len(str(message.get("content", ""))))
        self.header.setText(
            f"<b>{html.escape(str(message.get('role', '')))}</b> in session "
            f"<b>{html.escape(str(message.get('session_id', '')))}</b><br>"
            f"<code>{html.escape(str(message.get('message_id', '')))}</code> · revision "
            f"{message.get('revision')} · created {fmt.time_text(message.get('timestamp'), True)}"
            f" · updated {fmt.time_text(message.get('updated_at'), True)}"
            + ("" if message.get(CLIPPED) else f" · {size}")
        )
        self.fields["memory_kind"].setText(str(meta.get("memory_kind", "")))
        self.fields["memory_tier"].setText(str(meta.get("memory_tier", "")))
        self.fields["importance"].setText(str(meta.get("importance", "")))
        self.fields["tags"].setText(", ".join(meta.get("tags", [])) or "—")
        self.fields["summary"].setText(meta.get("summary") or "—")
        rels = meta.get("relations", [])
        self.fields["relations"].setText(
            "\n".join(f"{r['type']} → {r['message_id']}" for r in rels) or "—"
        )
        self.fields["source_message_ids"].setText(
            "\n".join(meta.get("source_message_ids", [])) or "—"
        )
        self.fields["tool_call_id"].setText(meta.get("tool_call_id") or "—")
        if message.get(CLIPPED):
            self.content.setPlainText(str(message.get("content", "")) + "\n…")
            self._load_full(str(message["message_id"]), int(message["revision"]))
        else:
            self.content.setPlainText(str(message.get("content", "")))
            self.contentLoaded.emit(str(message["message_id"]))

    def cancel_loading(self) -> None:
        self._cancel_job()
        self.progress_widget.hide()

    def _load_full(self, message_id: str, revision: int) -> None:
        service = self._service
        self.progress.setRange(0, 0)
        self.progress_widget.show()

        def progress(done: int, total: int) -> None:
            self.progress.setRange(0, max(total, 1))
            self.progress.setValue(done)

        def succeeded(result: tuple[str, int] | None) -> None:
            self.progress_widget.hide()
            if result is None:  # cancelled as the window closed: the clipped text stays
                return
            text, _revision = result
            self.content.setPlainText(text)
            self.header.setText(self.header.text() + f" · {fmt.bytes_text(fmt.utf8_len(text))}")
            self.contentLoaded.emit(message_id)

        def failed(exc: BaseException) -> None:
            self.progress_widget.hide()
            self.content.appendPlainText(f"\n[content could not be loaded: {exc}]")

        self._run_latest(
            lambda j: fetch_content(service, j, message_id, revision), succeeded, failed, progress
        )
