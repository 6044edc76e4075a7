"""History of one session: `read_messages(view="history")`, paged, updated live.

Rows keep at most `INLINE_CHARS` characters of content; the detail pane loads longer content in
chunks through the content view, so a session full of large messages stays light in memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QModelIndex, QObject, Qt, Signal
from PySide6.QtGui import QFont

from convmem_app.browser import format as fmt
from convmem_app.browser.jobs import JobRunner
from convmem_app.browser.paged_model import SORT_ROLE, Page, PagedTableModel, Row

if TYPE_CHECKING:
    from convmem_engine.service import MemoryService

INLINE_CHARS = 8192
CLIPPED = "_clipped"  # row key: True when `content` holds only the first INLINE_CHARS characters

COL_TIME, COL_ROLE, COL_KIND, COL_TIER, COL_IMPORTANCE, COL_TAGS, COL_CONTENT = range(7)


def clip(message: Row) -> Row:
    content = str(message.get("content", ""))
    if len(content) <= INLINE_CHARS:
        return message
    row = dict(message)
    row["content"] = content[:INLINE_CHARS]
    row[CLIPPED] = True
    return row


class HistoryModel(PagedTableModel):
    HEADERS = ("Time", "Role", "Kind", "Tier", "Imp.", "Tags", "Content")
    PAGE_SIZE = 200

    located = Signal(int)  # row of the message asked for with locate()
    notFound = Signal(str)  # message id asked for with locate() that is not in this session

    def __init__(
        self, service: MemoryService, runner: JobRunner, parent: QObject | None = None
    ) -> None:
        super().__init__(runner, parent)
        self._service = service
        self.session_id: str | None = None
        self._target: str | None = None
        self.pageLoaded.connect(self._check_target)
        self.refreshed.connect(self._check_target)

    def set_session(self, session_id: str | None) -> None:
        self.session_id = session_id
        self._target = None
        if session_id is None:
            self.clear()
        else:
            self.reload()

    def key(self, row: Row) -> str:
        return str(row["message_id"])

    def read_page(self, cursor: str | None, limit: int) -> Page:
        result = self._service.read_messages(
            view="history", session_id=self.session_id, limit=limit, cursor=cursor
        )
        return [clip(m) for m in result["history"]], result.get("nextCursor")

    def cell(self, row: Row, column: int, role: int) -> Any:
        meta = row.get("metadata", {})
        if role == Qt.ItemDataRole.DisplayRole:
            if column == COL_TIME:
                return fmt.time_text(row.get("timestamp"), seconds=True)
            if column == COL_ROLE:
                return row.get("role")
            if column == COL_KIND:
                return meta.get("memory_kind")
            if column == COL_TIER:
                return meta.get("memory_tier")
            if column == COL_IMPORTANCE:
                return meta.get("importance")
            if column == COL_TAGS:
                return ", ".join(meta.get("tags", []))
            if column == COL_CONTENT:
                return fmt.one_line(str(row.get("content", "")))
        elif role == SORT_ROLE:
            return self.cell(row, column, Qt.ItemDataRole.DisplayRole)
        elif role == Qt.ItemDataRole.ToolTipRole and column == COL_CONTENT:
            summary = meta.get("summary")
            return f"Summary: {fmt.one_line(summary, 300)}" if summary else None
        elif role == Qt.ItemDataRole.TextAlignmentRole and column == COL_IMPORTANCE:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        elif (
            role == Qt.ItemDataRole.FontRole
            and column == COL_TIER
            and (meta.get("memory_tier") == "discard")
        ):
            font = QFont()
            font.setStrikeOut(True)
            return font
        return None

    # --- live updates ---

    def on_written(self, message: Row) -> None:
        """A new message in this session: it belongs at the end, once the end is loaded."""
        if message.get("session_id") == self.session_id and self.exhausted and not self.loading:
            self.append_row(clip(message))

    def on_updated(self, message: Row) -> None:
        self.replace_row(clip(message))

    # --- locating a message (search results, relation navigation) ---

    def locate(self, message_id: str) -> None:
        """Emit `located(row)` once the message is loaded, paging further as needed."""
        self._target = message_id
        self._check_target()

    def _check_target(self, _count: int = 0) -> None:
        target = self._target
        if target is None:
            return
        row = self.row_of(target)
        if row >= 0:
            self._target = None
            self.located.emit(row)
        elif self.exhausted and not self.loading:
            self._target = None
            self.notFound.emit(target)
        elif not self.loading:
            self.fetchMore(QModelIndex())
