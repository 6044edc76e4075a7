"""Shown when a save hits CONFLICT: your edit and the stored version side by side."""

from __future__ import annotations

from typing import Any

from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from convmem_app.browser.metadata_form import MetadataForm

_FIELDS = (
    ("tags", "Tags"),
    ("memory_tier", "Tier"),
    ("memory_kind", "Kind"),
    ("importance", "Importance"),
    ("summary", "Summary"),
    ("relations", "Relations"),
    ("source_message_ids", "Sources"),
)


def _text(key: str, value: Any) -> str:
    if key == "relations":
        return "\n".join(f"{r['type']} → {r['message_id']}" for r in value)
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) if key == "tags" else "\n".join(value)
    return str(value)


class ConflictDialog(QDialog):
    """Buttons: reload the stored version (drop the edit) or overwrite it deliberately."""

    RELOAD = 10
    OVERWRITE = 11

    def __init__(
        self, mine: MetadataForm, stored: dict[str, Any], parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Message changed elsewhere")
        self.stored = stored
        revision = stored.get("revision")
        intro = QLabel(
            f"This message was changed elsewhere while you edited it; it is now at revision "
            f"{revision}. Differences are in bold. Reload the stored version (your edit is "
            f"discarded) or overwrite it with your edit."
        )
        intro.setWordWrap(True)
        mine_json = mine.to_metadata()
        theirs_json = MetadataForm.from_message(stored).to_metadata()
        self.table = QTableWidget(len(_FIELDS), 2)
        self.table.setHorizontalHeaderLabels(["Your edit", f"Stored (revision {revision})"])
        self.table.setVerticalHeaderLabels([label for _key, label in _FIELDS])
        self.differing: list[str] = []
        bold = QFont()
        bold.setBold(True)
        for row, (key, _label) in enumerate(_FIELDS):
            a, b = mine_json[key], theirs_json[key]
            for col, value in enumerate((a, b)):
                item = QTableWidgetItem(_text(key, value))
                if a != b:
                    item.setFont(bold)
                self.table.setItem(row, col, item)
            if a != b:
                self.differing.append(key)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.resizeRowsToContents()
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)

        buttons = QDialogButtonBox()
        self.reload_button = QPushButton("Reload stored version")
        self.overwrite_button = QPushButton("Overwrite with my edit")
        buttons.addButton(self.reload_button, QDialogButtonBox.ButtonRole.RejectRole)
        buttons.addButton(self.overwrite_button, QDialogButtonBox.ButtonRole.AcceptRole)
        buttons.addButton(QDialogButtonBox.StandardButton.Cancel)
        self.reload_button.clicked.connect(lambda: self.done(self.RELOAD))
        self.overwrite_button.clicked.connect(lambda: self.done(self.OVERWRITE))
        buttons.button(QDialogButtonBox.StandardButton.Cancel).clicked.connect(self.reject)

        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.table, 1)
        layout.addWidget(buttons)
        self.resize(640, 420)
