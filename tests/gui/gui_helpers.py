"""Helpers for the browser tests (real MemoryService, real widgets)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QItemSelectionModel, QModelIndex
from PySide6.QtWidgets import QMessageBox

from convmem_app.browser import MemoryBrowser
from convmem_engine.service import MemoryService
from convmem_engine.tools import ToolRegistry


def write(
    svc: MemoryService, session: str, content: str, role: str = "user", **meta: Any
) -> dict[str, Any]:
    arguments = {"session_id": session, "role": role, "content": content}
    if meta:
        arguments["metadata_json"] = json.dumps(meta)
    result = ToolRegistry.for_service(svc).call("write_message", arguments)
    return dict(result["message"])


def update(svc: MemoryService, message_id: str, metadata_json: str) -> None:
    """What another host does: update_message through the tools."""
    arguments = {"message_id": message_id, "metadata_json": metadata_json}
    ToolRegistry.for_service(svc).call("update_message", arguments)


def stored(svc: MemoryService, message_id: str) -> dict[str, Any]:
    result = svc.read_messages(
        view="context", message_id=message_id, before=0, after=0, relation_depth=0
    )
    return dict(result["message"])


def select_session(qtbot: Any, b: MemoryBrowser, session_id: str) -> None:
    """Click-equivalent: make the session current in the sessions view, wait for its history."""
    qtbot.waitUntil(lambda: b.browse.sessions_model.row_of(session_id) >= 0)
    source = b.browse.sessions_model.index(b.browse.sessions_model.row_of(session_id), 0)
    index = b.browse.sessions_proxy.mapFromSource(source)
    b.browse.sessions_view.selectionModel().setCurrentIndex(
        index,
        QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows,
    )
    qtbot.waitUntil(
        lambda: (
            b.browse.history_model.session_id == session_id
            and not b.browse.history_model.loading
            and b.browse.history_model.rowCount() > 0
        )
    )


def select_history_rows(b: MemoryBrowser, *rows: int) -> None:
    sel = b.browse.history_view.selectionModel()
    first = True
    for row in rows:
        flag = (
            QItemSelectionModel.SelectionFlag.ClearAndSelect
            if first
            else QItemSelectionModel.SelectionFlag.Select
        )
        sel.setCurrentIndex(
            b.browse.history_model.index(row, 0), flag | QItemSelectionModel.SelectionFlag.Rows
        )
        first = False


def delete_confirmation(qtbot: Any, b: MemoryBrowser, ask: Callable[[], object]) -> QMessageBox:
    """The box asking to confirm the delete that `ask()` requests (a click, a key, a call)."""
    with qtbot.waitSignal(b.deleteConfirmationShown) as shown:
        ask()
    box = shown.args[0]
    assert isinstance(box, QMessageBox)
    return box


def history_ids(b: MemoryBrowser) -> list[str]:
    return [str(r["message_id"]) for r in b.browse.history_model.rows()]


def no_index() -> QModelIndex:
    return QModelIndex()
