"""Relations and context: chronological neighbours and the relation graph, each navigable."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QFont
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QSpinBox,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from convmem_app.browser import format as fmt
from convmem_app.browser.jobs import JobRunner
from convmem_app.browser.service_panel import ServicePanel
from convmem_engine.domain import limits
from convmem_engine.domain.message import RELATION_TYPES

if TYPE_CHECKING:
    from convmem_engine.service import MemoryService

TARGET_ROLE = Qt.ItemDataRole.UserRole + 10  # (message_id, session_id) of a navigable item


class ContextPanel(ServicePanel):
    openRequested = Signal(str, str)  # message_id, session_id
    loaded = Signal()

    def __init__(
        self, service: MemoryService, runner: JobRunner, parent: QWidget | None = None
    ) -> None:
        super().__init__(service, runner, parent)
        self.message_id: str | None = None
        self.result: dict[str, Any] | None = None

        self.before_spin = QSpinBox()
        self.before_spin.setRange(0, limits.CONTEXT_NEIGHBOURS_MAX)
        self.before_spin.setValue(2)
        self.before_spin.setPrefix("before ")
        self.after_spin = QSpinBox()
        self.after_spin.setRange(0, limits.CONTEXT_NEIGHBOURS_MAX)
        self.after_spin.setValue(2)
        self.after_spin.setPrefix("after ")
        self.depth_spin = QSpinBox()
        self.depth_spin.setRange(1, limits.RELATION_DEPTH_MAX)
        self.depth_spin.setValue(limits.RELATION_DEPTH_DEFAULT)
        self.depth_spin.setPrefix("depth ")
        self.type_boxes: dict[str, QCheckBox] = {}
        controls = QHBoxLayout()
        for w in (self.before_spin, self.after_spin, self.depth_spin):
            controls.addWidget(w)
            w.valueChanged.connect(self.reload)
        controls.addStretch(1)
        types_row = QHBoxLayout()
        types_row.addWidget(QLabel("Relation types:"))
        for rtype in RELATION_TYPES:
            box = QCheckBox(rtype)
            box.setChecked(True)
            box.toggled.connect(self.reload)
            self.type_boxes[rtype] = box
            types_row.addWidget(box)
        types_row.addStretch(1)

        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(["Message", "Role / relation", "Time"])
        self.tree.setRootIsDecorated(True)
        self.tree.setUniformRowHeights(True)
        self.tree.itemActivated.connect(self._activated)
        self.note = QLabel()

        layout = QVBoxLayout(self)
        layout.addLayout(controls)
        layout.addLayout(types_row)
        layout.addWidget(self.tree, 1)
        layout.addWidget(self.note)

    def relation_types(self) -> list[str]:
        return [t for t, box in self.type_boxes.items() if box.isChecked()]

    def set_message(self, message_id: str | None) -> None:
        self.message_id = message_id
        self.reload()

    def reload(self, *_args: object) -> None:
        self._cancel_job()
        self.tree.clear()
        self.result = None
        if self.message_id is None:
            self.note.setText("")
            return
        types = self.relation_types()
        if not types:
            self.note.setText("Pick at least one relation type.")
            return
        args: dict[str, Any] = {
            "view": "context",
            "message_id": self.message_id,
            "before": self.before_spin.value(),
            "after": self.after_spin.value(),
            "relation_depth": self.depth_spin.value(),
        }
        if len(types) < len(RELATION_TYPES):
            args["relation_types_json"] = json.dumps(types)
        tools = self._tools
        self.note.setText("Loading…")

        def failed(exc: BaseException) -> None:
            self.note.setText(f"Context not available: {exc}")

        self._run_latest(lambda _j: tools.call("read_messages", args), self._show, failed)

    def _message_item(self, parent: QTreeWidgetItem, msg: dict[str, Any], role: str) -> None:
        item = QTreeWidgetItem(
            parent,
            [fmt.one_line(str(msg.get("content", "")), 100), role, fmt.time_text(msg["timestamp"])],
        )
        item.setData(0, TARGET_ROLE, (msg["message_id"], msg["session_id"]))
        item.setToolTip(0, f"{msg['message_id']} in {msg['session_id']} — Enter to open")

    def _show(self, result: dict[str, Any]) -> None:
        self.result = result
        tree = self.tree
        tree.clear()
        chrono = result.get("chronological_context", {})
        bold = QFont()
        bold.setBold(True)
        before = QTreeWidgetItem(tree, [f"Before ({len(chrono.get('before', []))})"])
        for m in chrono.get("before", []):
            self._message_item(before, m, str(m.get("role")))
        this = QTreeWidgetItem(tree, ["This message"])
        self._message_item(this, result["message"], str(result["message"].get("role")))
        first = this.child(0)
        if first is not None:
            first.setFont(0, bold)
        after = QTreeWidgetItem(tree, [f"After ({len(chrono.get('after', []))})"])
        for m in chrono.get("after", []):
            self._message_item(after, m, str(m.get("role")))
        relations = result.get("relations", [])
        rel_root = QTreeWidgetItem(tree, [f"Relations ({len(relations)})"])
        muted = QBrush(self.palette().color(self.palette().ColorRole.PlaceholderText))
        for rel in relations:
            arrow = "→" if rel.get("direction") == "outgoing" else "←"
            label = f"{arrow} {rel['type']} (depth {rel.get('depth', 1)})"
            if "message" in rel:
                self._message_item(rel_root, rel["message"], label)
            else:
                item = QTreeWidgetItem(rel_root, [f"{rel.get('message_id')} — deleted", label, ""])
                font = QFont()
                font.setItalic(True)
                font.setStrikeOut(True)
                item.setFont(0, font)
                item.setForeground(0, muted)
                item.setToolTip(0, "The related message was deleted.")
        tree.expandAll()
        for col in range(3):
            tree.resizeColumnToContents(col)
        session = result.get("session", {})
        self.note.setText(
            f"Session {session.get('session_id', '')}: {session.get('message_count', 0)} messages"
            + (" · truncated at the response limit" if result.get("truncated") else "")
        )
        self.loaded.emit()

    def _activated(self, item: QTreeWidgetItem, _column: int) -> None:
        target = item.data(0, TARGET_ROLE)
        if target:
            message_id, session_id = target
            self.openRequested.emit(str(message_id), str(session_id))
