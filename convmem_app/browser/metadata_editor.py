"""Metadata editor: inline validation, save with expected_revision, conflict resolution."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from convmem_app.browser import theme
from convmem_app.browser.calls import fetch_message
from convmem_app.browser.conflict_dialog import ConflictDialog
from convmem_app.browser.jobs import JobRunner
from convmem_app.browser.metadata_form import MetadataForm, split_lines, split_tags, validate
from convmem_app.browser.service_panel import ServicePanel
from convmem_engine.domain import ConflictError, ConvMemError, limits
from convmem_engine.domain.message import MEMORY_KINDS, MEMORY_TIERS, RELATION_TYPES

if TYPE_CHECKING:
    from convmem_engine.service import MemoryService


class MetadataEditor(ServicePanel):
    saved = Signal(dict)  # the stored message after a successful save
    conflictShown = Signal(object)  # the ConflictDialog, once open

    def __init__(
        self, service: MemoryService, runner: JobRunner, parent: QWidget | None = None
    ) -> None:
        super().__init__(service, runner, parent)
        self.message: dict[str, Any] | None = None
        self.conflict_dialog: ConflictDialog | None = None
        self._saving = False
        self._loading_form = False
        self._pending: tuple[dict[str, Any] | None] | None = None  # selection awaiting the editor

        self.tags = QLineEdit()
        self.tags.setPlaceholderText("comma-separated, e.g. project, decision")
        self.tier = QComboBox()
        self.tier.addItems(list(MEMORY_TIERS))
        self.kind = QComboBox()
        self.kind.addItems(list(MEMORY_KINDS))
        self.importance = QSpinBox()
        self.importance.setRange(limits.IMPORTANCE_MIN, limits.IMPORTANCE_MAX)
        self.summary = QPlainTextEdit()
        self.summary.setPlaceholderText("optional; empty means no summary")
        self.summary.setTabChangesFocus(True)
        self.summary.setFixedHeight(72)
        self.summary_count = QLabel()
        self.relations = QTableWidget(0, 2)
        self.relations.setHorizontalHeaderLabels(["Type", "Target message id"])
        self.relations.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        self.relations.setColumnWidth(0, 150)
        self.relations.verticalHeader().hide()
        self.relations.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.relations.setFixedHeight(110)
        add_rel = QPushButton("Add relation")
        remove_rel = QPushButton("Remove")
        add_rel.clicked.connect(lambda: self.add_relation("related_to", ""))
        remove_rel.clicked.connect(self._remove_relation)
        rel_buttons = QHBoxLayout()
        rel_buttons.addWidget(add_rel)
        rel_buttons.addWidget(remove_rel)
        rel_buttons.addStretch(1)
        self.sources = QPlainTextEdit()
        self.sources.setPlaceholderText("one message id per line")
        self.sources.setTabChangesFocus(True)
        self.sources.setFixedHeight(64)

        self.errors: dict[str, QLabel] = {}
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)

        def row(
            label: str, key: str, widget: QWidget | QHBoxLayout | QVBoxLayout, buddy: QWidget
        ) -> None:
            caption = QLabel(label)
            caption.setBuddy(buddy)  # Alt+letter moves the focus to the field
            error = QLabel()
            error.setObjectName(f"error_{key}")
            error.hide()
            self.errors[key] = error
            box = QVBoxLayout()
            box.setSpacing(2)
            if isinstance(widget, QWidget):
                box.addWidget(widget)
            else:
                box.addLayout(widget)
            box.addWidget(error)
            form.addRow(caption, box)

        row("&Tags:", "tags", self.tags, self.tags)
        row("T&ier:", "memory_tier", self.tier, self.tier)
        row("&Kind:", "memory_kind", self.kind, self.kind)
        row("I&mportance:", "importance", self.importance, self.importance)
        summary_box = QVBoxLayout()
        summary_box.addWidget(self.summary)
        summary_box.addWidget(self.summary_count)
        row("S&ummary:", "summary", summary_box, self.summary)
        rel_box = QVBoxLayout()
        rel_box.addWidget(self.relations)
        rel_box.addLayout(rel_buttons)
        row("&Relations:", "relations", rel_box, self.relations)
        row("S&ources:", "source_message_ids", self.sources, self.sources)

        self.save_button = QPushButton("&Save")
        self.save_button.setToolTip("Save metadata (Ctrl+S)")
        self.revert_button = QPushButton("Re&vert")
        self.save_button.clicked.connect(self.save)
        self.revert_button.clicked.connect(self.revert)
        self.status = QLabel()
        self.status.setWordWrap(True)
        buttons = QHBoxLayout()
        buttons.addWidget(self.status, 1)
        buttons.addWidget(self.revert_button)
        buttons.addWidget(self.save_button)

        self.banner = QLabel()
        self.banner.setWordWrap(True)
        self.banner.hide()

        layout = QVBoxLayout(self)
        layout.addWidget(self.banner)
        layout.addLayout(form)
        layout.addStretch(1)
        layout.addLayout(buttons)

        self.tags.textChanged.connect(self._changed)
        self.tier.currentIndexChanged.connect(self._changed)
        self.kind.currentIndexChanged.connect(self._changed)
        self.importance.valueChanged.connect(self._changed)
        self.summary.textChanged.connect(self._changed)
        self.sources.textChanged.connect(self._changed)
        self.relations.itemChanged.connect(self._changed)
        self.set_message(None)

    # --- loading ---

    def follow(self, message: dict[str, Any] | None) -> None:
        """The selection moved to `message`: show it, unless that would drop unsaved edits of
        another message; then keep those and show it after Save or Revert."""
        current = self.message
        if (
            current is not None
            and self.dirty
            and (message is None or message.get("message_id") != current.get("message_id"))
        ):
            self._pending = (message,)
            self.banner.setText(
                "These are unsaved edits of another message than the one selected. Save or "
                "Revert them, and the editor follows the selection."
            )
            self.banner.show()
            return
        self._pending = None
        self.set_message(message)

    def _take_pending(self) -> bool:
        """Show the message selected while edits were pending; True if there was one."""
        pending, self._pending = self._pending, None
        if pending is None:
            return False
        self.set_message(pending[0])
        return True

    def set_message(self, message: dict[str, Any] | None) -> None:
        self.message = message
        self.banner.hide()
        self._fill(MetadataForm.from_message(message) if message else MetadataForm())
        self.setEnabled(message is not None)
        self.status.clear()

    def on_external_update(self, message: dict[str, Any]) -> None:
        """The same message changed elsewhere: follow it unless the user has unsaved edits."""
        if self.message is None or message.get("message_id") != self.message.get("message_id"):
            return
        if message.get("revision") == self.message.get("revision"):
            return  # our own save coming back as an event: nothing new
        if not self.dirty:
            self.set_message(message)
            return
        self.banner.setText(
            f"This message was changed elsewhere (now revision {message.get('revision')}). "
            "Saving will show both versions."
        )
        self.banner.show()

    def _fill(self, form: MetadataForm) -> None:
        self._loading_form = True
        try:
            self.tags.setText(", ".join(form.tags))
            self.tier.setCurrentText(form.memory_tier)
            self.kind.setCurrentText(form.memory_kind)
            self.importance.setValue(form.importance)
            self.summary.setPlainText(form.summary)
            self.relations.setRowCount(0)
            for rtype, target in form.relations:
                self.add_relation(rtype, target)
            self.sources.setPlainText("\n".join(form.source_message_ids))
        finally:
            self._loading_form = False
        self._changed()

    def add_relation(self, rtype: str, target: str) -> None:
        row = self.relations.rowCount()
        self.relations.insertRow(row)
        combo = QComboBox()
        combo.addItems(list(RELATION_TYPES))
        combo.setCurrentText(rtype)
        combo.currentIndexChanged.connect(self._changed)
        self.relations.setCellWidget(row, 0, combo)
        self.relations.setItem(row, 1, QTableWidgetItem(target))
        self._changed()

    def _remove_relation(self) -> None:
        rows = sorted({i.row() for i in self.relations.selectedIndexes()}, reverse=True)
        if not rows and self.relations.rowCount():
            rows = [self.relations.currentRow()] if self.relations.currentRow() >= 0 else []
        for r in rows:
            self.relations.removeRow(r)
        self._changed()

    # --- form state ---

    def form(self) -> MetadataForm:
        relations: list[tuple[str, str]] = []
        for r in range(self.relations.rowCount()):
            combo = self.relations.cellWidget(r, 0)
            item = self.relations.item(r, 1)
            rtype = combo.currentText() if isinstance(combo, QComboBox) else ""
            relations.append((rtype, item.text().strip() if item else ""))
        return MetadataForm(
            tags=split_tags(self.tags.text()),
            memory_tier=self.tier.currentText(),
            memory_kind=self.kind.currentText(),
            importance=self.importance.value(),
            summary=self.summary.toPlainText(),
            relations=relations,
            source_message_ids=split_lines(self.sources.toPlainText()),
        )

    @property
    def dirty(self) -> bool:
        if self.message is None:
            return False
        return self.form() != MetadataForm.from_message(self.message)

    def validation_errors(self) -> dict[str, str]:
        return validate(self.form())

    def _changed(self, *_args: object) -> None:
        if self._loading_form:
            return
        errors = self.validation_errors()
        color = theme.error_color(self.palette()).name()
        for key, label in self.errors.items():
            text = errors.get(key)
            label.setVisible(bool(text))
            label.setText(f'<span style="color:{color}">{text}</span>' if text else "")
        nbytes = len(self.summary.toPlainText().encode("utf-8"))
        self.summary_count.setText(f"{nbytes} / {limits.SUMMARY_MAX_BYTES} bytes")
        dirty = self.dirty
        self.save_button.setEnabled(dirty and not errors and not self._saving)
        self.revert_button.setEnabled(dirty and not self._saving)

    def revert(self) -> None:
        if not self._take_pending():
            self.set_message(self.message)

    # --- saving ---

    def save(self, *, overwrite_revision: int | None = None) -> None:
        if self.message is None or self._saving or self.validation_errors():
            return
        form = self.form()
        message_id = str(self.message["message_id"])
        expected = overwrite_revision or int(self.message["revision"])
        metadata_json = json.dumps(form.to_metadata(), ensure_ascii=False)
        service, tools = self._service, self._tools
        self._saving = True
        self.status.setText("Saving…")
        self._changed()

        def work(_job: object) -> dict[str, Any]:
            try:
                arguments = {
                    "message_id": message_id,
                    "metadata_json": metadata_json,
                    "expected_revision": expected,
                }
                return dict(tools.call("update_message", arguments))
            except ConflictError:
                return {"status": "CONFLICT", "stored": fetch_message(service, message_id)}

        self._runner.run(work, lambda r: self._save_done(form, r), self._save_failed)

    def _save_done(self, form: MetadataForm, result: dict[str, Any]) -> None:
        self._saving = False
        if result.get("status") == "CONFLICT":
            self.status.setText("Not saved: the message changed elsewhere.")
            self._changed()
            self._show_conflict(form, result["stored"])
            return
        message = result["message"]
        self.set_message(message)
        self.saved.emit(message)
        moved = self._take_pending()
        text = "Saved." if result.get("changed") else "No changes to save."
        self.status.setText(text + (" Now showing the selected message." if moved else ""))

    def _save_failed(self, exc: BaseException) -> None:
        self._saving = False
        code = exc.code if isinstance(exc, ConvMemError) else type(exc).__name__
        color = theme.error_color(self.palette()).name()
        self.status.setText(f'<span style="color:{color}">Not saved ({code}): {exc}</span>')
        self._changed()

    def _show_conflict(self, mine: MetadataForm, stored: dict[str, Any]) -> None:
        dialog = ConflictDialog(mine, stored, self)
        self.conflict_dialog = dialog

        def finished(code: int) -> None:
            self.conflict_dialog = None
            if code == ConflictDialog.RELOAD:
                self.set_message(stored)
                self.status.setText("Reloaded the stored version.")
            elif code == ConflictDialog.OVERWRITE:
                self.save(overwrite_revision=int(stored["revision"]))
            dialog.deleteLater()

        dialog.finished.connect(finished)
        dialog.setWindowModality(Qt.WindowModality.WindowModal)
        dialog.open()
        self.conflictShown.emit(dialog)
