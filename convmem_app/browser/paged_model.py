"""A table model over a cursor-paged MemoryService view, loaded page by page off the GUI thread.

Qt's views call `canFetchMore`/`fetchMore` as the user scrolls near the end; each call starts at
most one background read. `refresh()` re-reads the rows already shown and merges them in place
(removals, moves, inserts, data changes) so selections and the current row survive live updates.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from PySide6.QtCore import QModelIndex, QObject, Qt, QTimer, Signal

from convmem_app.browser.jobs import Job, JobRunner
from convmem_app.browser.table_model import AnyIndex, HeaderTableModel

Row = dict[str, Any]
Page = tuple[list[Row], str | None]

SORT_ROLE = Qt.ItemDataRole.UserRole + 1  # raw value for sorting
KEY_ROLE = Qt.ItemDataRole.UserRole + 2  # the row's id (session_id / message_id)
ROW_ROLE = Qt.ItemDataRole.UserRole + 3  # the whole row dict
FILTER_ROLE = Qt.ItemDataRole.UserRole + 4  # text the filter proxy matches against


class PagedTableModel(HeaderTableModel):
    loadingChanged = Signal(bool)
    pageLoaded = Signal(int)  # number of rows now loaded
    refreshed = Signal()
    loadFailed = Signal(str)

    PAGE_SIZE = 200
    BULK_PAGE_SIZE = 1000  # pages read by load_all()
    LOAD_ALL_CAP = 50_000  # load_all() stops here; beyond it sort/filter see the loaded rows

    def __init__(self, runner: JobRunner, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._runner = runner
        self._rows: list[Row] = []
        self._pos: dict[str, int] = {}
        self._cursor: str | None = None
        self._exhausted = True
        self._job: Job | None = None
        self._generation = 0
        self._refresh_pending = False
        self._want_all = False

    # --- subclass hooks (the read hooks run on a worker thread: no Qt state there) ---

    def key(self, row: Row) -> str:
        raise NotImplementedError

    def read_page(self, cursor: str | None, limit: int) -> Page:
        raise NotImplementedError

    def cell(self, row: Row, column: int, role: int) -> Any:
        raise NotImplementedError

    # --- Qt model API ---

    def row_total(self) -> int:
        return len(self._rows)

    def data(self, index: AnyIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or index.row() >= len(self._rows):
            return None
        row = self._rows[index.row()]
        if role == KEY_ROLE:
            return self.key(row)
        if role == ROW_ROLE:
            return row
        return self.cell(row, index.column(), role)

    def canFetchMore(self, parent: AnyIndex) -> bool:
        return not parent.isValid() and not self._exhausted and self._job is None

    def fetchMore(self, parent: AnyIndex) -> None:
        if self.canFetchMore(parent):
            self._load_page()

    # --- public API ---

    @property
    def loading(self) -> bool:
        return self._job is not None

    @property
    def exhausted(self) -> bool:
        return self._exhausted

    def rows(self) -> list[Row]:
        return list(self._rows)

    def row_of(self, key: str) -> int:
        return self._pos.get(key, -1)

    def row_data(self, row: int) -> Row:
        return self._rows[row]

    def clear(self) -> None:
        self._generation += 1
        self._cancel_job()
        self.beginResetModel()
        self._rows = []
        self._pos = {}
        self._cursor = None
        self._exhausted = True
        self.endResetModel()

    def reload(self) -> None:
        """Drop everything and load the first page."""
        self.clear()
        self._exhausted = False
        self._load_page()

    def load_all(self) -> None:
        """Keep loading pages in the background (up to LOAD_ALL_CAP rows), e.g. so that sorting
        and filtering see every row; the GUI stays responsive between pages."""
        self._want_all = True
        self._continue_loading()

    def _continue_loading(self) -> None:
        if (
            self._want_all
            and not self._exhausted
            and self._job is None
            and len(self._rows) < self.LOAD_ALL_CAP
        ):
            self._load_page(self.BULK_PAGE_SIZE)

    def refresh(self) -> None:
        """Re-read as many rows as are loaded now and merge them in place."""
        if self._job is not None:
            self._refresh_pending = True
            return
        target = max(len(self._rows), self.PAGE_SIZE)
        generation = self._generation

        def work(job: Job) -> Page:
            rows: list[Row] = []
            cursor: str | None = None
            while True:
                page, cursor = self.read_page(cursor, min(1000, target - len(rows)))
                rows.extend(page)
                if cursor is None or len(rows) >= target or job.cancelled:
                    return rows, cursor

        self._start(work, lambda result: self._refresh_done(generation, result))

    def remove_key(self, key: str) -> bool:
        return self.remove_keys([key]) == 1

    def remove_keys(self, keys: Iterable[str]) -> int:
        """Remove the loaded rows of `keys` (others are ignored); how many went. One removal
        per run of adjacent rows, bottom-up; only the rows below a run change position, so a
        batch costs about one pass over the rows, not one per key."""
        rows = sorted({self._pos[k] for k in keys if k in self._pos})
        for first, last in reversed(_runs(rows)):
            self.beginRemoveRows(QModelIndex(), first, last)
            for gone in self._rows[first : last + 1]:
                del self._pos[self.key(gone)]
            del self._rows[first : last + 1]
            self._reposition(first)
            self.endRemoveRows()
        return len(rows)

    def replace_row(self, new: Row) -> bool:
        row = self._pos.get(self.key(new))
        if row is None:
            return False
        self._rows[row] = new
        self.dataChanged.emit(self.index(row, 0), self.index(row, self.columnCount() - 1))
        return True

    def append_row(self, new: Row) -> bool:
        if self.key(new) in self._pos:
            return self.replace_row(new)
        n = len(self._rows)
        self.beginInsertRows(QModelIndex(), n, n)
        self._rows.append(new)
        self._pos[self.key(new)] = n
        self.endInsertRows()
        return True

    # --- internals ---

    def _reindex(self) -> None:
        self._pos = {self.key(r): i for i, r in enumerate(self._rows)}

    def _reposition(self, start: int) -> None:
        """Positions of the rows from `start` on, after rows above them came or went."""
        for i in range(start, len(self._rows)):
            self._pos[self.key(self._rows[i])] = i

    def _cancel_job(self) -> None:
        if self._job is not None:
            self._job.cancel()
            self._job = None
            self.loadingChanged.emit(False)

    def _start(self, work: Any, on_success: Any) -> None:
        job = Job(work)
        self._job = job

        def settle() -> bool:
            """Mark the job over (before handling its result, so handlers see `loading` off)."""
            if self._job is not job:
                return False
            self._job = None
            self.loadingChanged.emit(False)
            return True

        def succeeded(result: Any) -> None:
            if settle():
                on_success(result)
                self._after_job()

        def failed(exc: BaseException) -> None:
            if settle():
                self.loadFailed.emit(str(exc))
                self._after_job()

        job.succeeded.connect(succeeded)
        job.failed.connect(failed)
        self.loadingChanged.emit(True)
        self._runner.start(job)

    def _after_job(self) -> None:
        if self._refresh_pending and self._job is None:
            self._refresh_pending = False
            self.refresh()

    def _load_page(self, limit: int | None = None) -> None:
        cursor = self._cursor
        generation = self._generation
        limit = limit or self.PAGE_SIZE
        self._start(
            lambda job: self.read_page(cursor, limit),
            lambda result: self._page_done(generation, result),
        )

    def _page_done(self, generation: int, result: Page) -> None:
        if generation != self._generation:
            return
        page, cursor = result
        fresh = [r for r in page if self.key(r) not in self._pos]
        if fresh:
            n = len(self._rows)
            self.beginInsertRows(QModelIndex(), n, n + len(fresh) - 1)
            for r in fresh:
                self._pos[self.key(r)] = len(self._rows)
                self._rows.append(r)
            self.endInsertRows()
        self._cursor = cursor
        self._exhausted = cursor is None
        self.pageLoaded.emit(len(self._rows))
        if self._want_all:
            QTimer.singleShot(0, self._continue_loading)  # let the GUI paint between pages

    def _refresh_done(self, generation: int, result: Page) -> None:
        if generation != self._generation:
            return
        new_rows, cursor = result
        self._merge(new_rows)
        self._cursor = cursor
        self._exhausted = cursor is None
        self.refreshed.emit()

    def _merge(self, new_rows: list[Row]) -> None:
        new_keys = [self.key(r) for r in new_rows]
        if new_keys != [self.key(r) for r in self._rows]:
            self._rearrange(new_keys, new_rows)
        # Now row i has key new_keys[i]. Tell the views about rows whose values changed, and
        # only those: a sorting/filtering proxy re-reads what it is told changed, and a refresh
        # after one write changes one or two rows of thousands.
        changed = [
            i
            for i, (old, new) in enumerate(zip(self._rows, new_rows, strict=True))
            if old is not new and old != new
        ]
        last_column = self.columnCount() - 1
        for first, last in _runs(changed):
            self._rows[first : last + 1] = new_rows[first : last + 1]
            self.dataChanged.emit(self.index(first, 0), self.index(last, last_column))

    def _rearrange(self, new_keys: list[str], new_rows: list[Row]) -> None:
        """Make the rows' keys `new_keys`: removals, moves and inserts as model signals, so
        selections and the current row follow their rows."""
        wanted = set(new_keys)
        # 1. remove rows that vanished
        self.remove_keys([k for k in self._pos if k not in wanted])
        # 2. reorder the survivors into the new order (same count: a layout change)
        survivors = [k for k in new_keys if k in self._pos]
        current = [self.key(r) for r in self._rows]
        if survivors != current:
            self.layoutAboutToBeChanged.emit()
            by_key = {self.key(r): r for r in self._rows}
            new_pos = {k: i for i, k in enumerate(survivors)}
            old_list = self.persistentIndexList()
            new_list = [self.index(new_pos[current[i.row()]], i.column()) for i in old_list]
            self._rows = [by_key[k] for k in survivors]
            self._reindex()
            self.changePersistentIndexList(old_list, new_list)
            self.layoutChanged.emit()
        # 3. insert newcomers at their places; the survivors are a subsequence of new_keys
        for i, row_value in enumerate(new_rows):
            if i < len(self._rows) and self.key(self._rows[i]) == new_keys[i]:
                continue
            self.beginInsertRows(QModelIndex(), i, i)
            self._rows.insert(i, row_value)
            self.endInsertRows()
        self._reindex()


def _runs(rows: list[int]) -> list[tuple[int, int]]:
    """Ascending row numbers as (first, last) runs of adjacent rows."""
    runs: list[tuple[int, int]] = []
    for row in rows:
        if runs and runs[-1][1] == row - 1:
            runs[-1] = (runs[-1][0], row)
        else:
            runs.append((row, row))
    return runs
