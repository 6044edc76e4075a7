"""Sessions list: `read_messages(view="sessions")`, paged, with a sort/filter proxy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QSortFilterProxyModel, Qt

from convmem_app.browser import format as fmt
from convmem_app.browser.jobs import JobRunner
from convmem_app.browser.paged_model import FILTER_ROLE, SORT_ROLE, Page, PagedTableModel, Row

if TYPE_CHECKING:
    from convmem_engine.service import MemoryService

COL_SESSION, COL_COUNT, COL_KINDS, COL_SUMMARY, COL_STARTED, COL_LAST = range(6)


class SessionsModel(PagedTableModel):
    HEADERS = ("Session", "Messages", "Kinds", "Summary", "Started", "Last message")
    PAGE_SIZE = 200

    def __init__(
        self, service: MemoryService, runner: JobRunner, parent: QObject | None = None
    ) -> None:
        super().__init__(runner, parent)
        self._service = service

    def key(self, row: Row) -> str:
        return str(row["session_id"])

    def read_page(self, cursor: str | None, limit: int) -> Page:
        result = self._service.read_messages(view="sessions", limit=limit, cursor=cursor)
        return list(result["sessions"]), result.get("nextCursor")

    def cell(self, row: Row, column: int, role: int) -> Any:
        if role == Qt.ItemDataRole.DisplayRole:
            if column == COL_SESSION:
                return row["session_id"]
            if column == COL_COUNT:
                return row["message_count"]
            if column == COL_KINDS:
                return fmt.kind_counts_text(row.get("kind_counts", {}))
            if column == COL_SUMMARY:
                return fmt.one_line(row.get("representative_summary", ""), 120)
            if column == COL_STARTED:
                return fmt.time_text(row.get("started_at"))
            if column == COL_LAST:
                return fmt.time_text(row.get("last_message_at"))
        elif role == SORT_ROLE:
            return {
                COL_SESSION: row["session_id"],
                COL_COUNT: row["message_count"],
                COL_KINDS: fmt.kind_counts_text(row.get("kind_counts", {})),
                COL_SUMMARY: row.get("representative_summary", ""),
                COL_STARTED: row.get("started_at", 0),
                COL_LAST: row.get("last_message_at", 0),
            }[column]
        elif role == FILTER_ROLE:
            return f"{row['session_id']}\n{row.get('representative_summary', '')}"
        elif role == Qt.ItemDataRole.ToolTipRole:
            if column == COL_KINDS:
                return fmt.kind_counts_tooltip(row.get("kind_counts", {}))
            if column == COL_SUMMARY:
                return fmt.one_line(row.get("representative_summary", ""), 600)
            if column == COL_SESSION:
                return row["session_id"]
        elif role == Qt.ItemDataRole.TextAlignmentRole and column == COL_COUNT:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None


class SessionsProxy(QSortFilterProxyModel):
    """Sorts the loaded sessions by any column and filters them by session id or summary."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.setSortRole(SORT_ROLE)
        self.setFilterRole(FILTER_ROLE)
        self.setFilterKeyColumn(COL_SESSION)
        self.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.setSortCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
