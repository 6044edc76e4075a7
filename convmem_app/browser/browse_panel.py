"""The Browse page: sessions, the history of one session, and the selected message (its text,
metadata editor, context and relations), kept live as hosts write."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from PySide6.QtCore import (
    QByteArray,
    QElapsedTimer,
    QItemSelectionModel,
    QModelIndex,
    QSettings,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLabel,
    QLineEdit,
    QScrollArea,
    QSplitter,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from convmem_app.browser.bulk import Target
from convmem_app.browser.calls import fetch_message, fetch_messages
from convmem_app.browser.context_panel import ContextPanel
from convmem_app.browser.detail_view import MessageDetail
from convmem_app.browser.history_model import HistoryModel
from convmem_app.browser.metadata_editor import MetadataEditor
from convmem_app.browser.page import BrowserPage, PageContext
from convmem_app.browser.paged_model import KEY_ROLE, ROW_ROLE
from convmem_app.browser.sessions_model import (
    COL_STARTED,
    COL_SUMMARY,
    SessionsModel,
    SessionsProxy,
)
from convmem_engine.domain import NotFoundError

if TYPE_CHECKING:
    from convmem_engine.service import ChangeEvent

DETAIL_MESSAGE, DETAIL_EDIT, DETAIL_CONTEXT = range(3)
SESSIONS_SOON_MS: Final = 250
"""The session list shows a change that comes alone this soon."""
SESSIONS_EVERY_MS: Final = 1000
"""While hosts keep writing, the session list re-reads its rows at most this often."""


def setup_table(view: QTableView, mode: QAbstractItemView.SelectionMode) -> None:
    """The browser's table look: whole rows, alternating colours, no editing, compact rows."""
    view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    view.setSelectionMode(mode)
    view.setAlternatingRowColors(True)
    view.setWordWrap(False)
    view.verticalHeader().hide()
    view.verticalHeader().setDefaultSectionSize(view.fontMetrics().height() + 8)
    view.horizontalHeader().setStretchLastSection(True)
    view.setTabKeyNavigation(False)
    view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)


class BrowsePanel(BrowserPage):
    """Sessions | history of the selected session | the selected message."""

    name = "browse"
    title = "&Browse"

    messageOpened = Signal(str)  # message id now current in the history view

    def __init__(self, context: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(context, parent)
        self._build()
        self._wire()
        # the session list re-reads its rows SESSIONS_SOON_MS after a change that comes alone,
        # and at most once per SESSIONS_EVERY_MS while hosts keep writing (each re-read is a
        # store read and a merge on the GUI thread: docs/benchmarks.md, "The app's CPU per
        # write")
        self._sessions_timer = self._single_shot(SESSIONS_SOON_MS, self._refresh_sessions)
        self._sessions_read = QElapsedTimer()  # since the last re-read (invalid: never)
        self._select_timer = self._single_shot(120, self._apply_session_selection)

    # ---- construction ----

    def _single_shot(self, msecs: int, slot: Any) -> QTimer:
        timer = QTimer(self)
        timer.setSingleShot(True)
        timer.setInterval(msecs)
        timer.timeout.connect(slot)
        return timer

    def _build(self) -> None:
        service, runner = self._service, self._runner
        self.sessions_model = SessionsModel(service, runner, self)
        self.sessions_proxy = SessionsProxy(self)
        self.sessions_proxy.setSourceModel(self.sessions_model)
        self.session_filter = QLineEdit()
        self.session_filter.setPlaceholderText("Filter sessions by id or summary  (Ctrl+L)")
        self.session_filter.setClearButtonEnabled(True)
        self.sessions_view = QTableView()
        self.sessions_view.setObjectName("sessionsView")
        self.sessions_view.setModel(self.sessions_proxy)
        setup_table(self.sessions_view, QAbstractItemView.SelectionMode.SingleSelection)
        # The service pages sessions by start time; that order needs no loading ahead. Any
        # other sort, and any filter, loads the remaining pages in the background first.
        self.sessions_view.setSortingEnabled(True)
        self.sessions_view.sortByColumn(COL_STARTED, Qt.SortOrder.AscendingOrder)
        for col, width in enumerate((150, 70, 120, 220, 120, 120)):
            self.sessions_view.setColumnWidth(col, width)
        self.sessions_view.horizontalHeader().setSectionResizeMode(
            COL_SUMMARY, QHeaderView.ResizeMode.Interactive
        )
        sessions_box = QWidget()
        sb = QVBoxLayout(sessions_box)
        sb.setContentsMargins(0, 0, 0, 0)
        self.sessions_label = QLabel("Sessions")
        sb.addWidget(self.sessions_label)
        sb.addWidget(self.session_filter)
        sb.addWidget(self.sessions_view, 1)

        self.history_model = HistoryModel(service, runner, self)
        self.history_view = QTableView()
        self.history_view.setObjectName("historyView")
        self.history_view.setModel(self.history_model)
        setup_table(self.history_view, QAbstractItemView.SelectionMode.ExtendedSelection)
        for col, width in enumerate((140, 70, 95, 60, 45, 140)):
            self.history_view.setColumnWidth(col, width)
        self.history_view.horizontalHeader().setStretchLastSection(True)
        self.history_label = QLabel("History")
        history_box = QWidget()
        hb = QVBoxLayout(history_box)
        hb.setContentsMargins(0, 0, 0, 0)
        hb.addWidget(self.history_label)
        hb.addWidget(self.history_view, 1)

        self.detail = MessageDetail(service, runner)
        self.editor = MetadataEditor(service, runner)
        self.context_panel = ContextPanel(service, runner)
        self.detail_tabs = QTabWidget()
        self.detail_tabs.addTab(self.detail, "Message")
        editor_scroll = QScrollArea()
        editor_scroll.setWidgetResizable(True)
        editor_scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        editor_scroll.setWidget(self.editor)
        self.detail_tabs.addTab(editor_scroll, "Edit metadata")
        self.detail_tabs.addTab(self.context_panel, "Context && relations")

        self.right_split = QSplitter(Qt.Orientation.Vertical)
        self.right_split.setObjectName("rightSplit")
        self.right_split.addWidget(history_box)
        self.right_split.addWidget(self.detail_tabs)
        self.right_split.setStretchFactor(0, 1)
        self.right_split.setStretchFactor(1, 1)
        self.main_split = QSplitter(Qt.Orientation.Horizontal)
        self.main_split.setObjectName("mainSplit")
        self.main_split.addWidget(sessions_box)
        self.main_split.addWidget(self.right_split)
        self.main_split.setStretchFactor(0, 2)
        self.main_split.setStretchFactor(1, 3)
        self.main_split.setSizes([560, 840])  # until a saved state says otherwise
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.main_split)

    def _wire(self) -> None:
        self.session_filter.textChanged.connect(self._filter_sessions)
        self.sessions_view.horizontalHeader().sortIndicatorChanged.connect(self._sessions_sorted)
        sel = self.sessions_view.selectionModel()
        sel.currentRowChanged.connect(lambda _c, _p: self._select_timer.start())
        self.sessions_view.activated.connect(lambda _i: self.history_view.setFocus())
        self.sessions_model.pageLoaded.connect(self.update_labels)
        self.sessions_model.refreshed.connect(self.update_labels)
        self.sessions_model.rowsRemoved.connect(self.update_labels)
        self.sessions_model.loadFailed.connect(self.statusMessage.emit)
        self.history_model.pageLoaded.connect(self.update_labels)
        self.history_model.rowsRemoved.connect(self.update_labels)
        self.history_model.rowsInserted.connect(self.update_labels)
        self.history_model.modelReset.connect(self.update_labels)
        self.history_model.loadFailed.connect(self.statusMessage.emit)
        self.history_model.located.connect(self._select_history_row)
        self.history_model.notFound.connect(
            lambda _mid: self.statusMessage.emit("That message is no longer in its session.")
        )
        hsel = self.history_view.selectionModel()
        hsel.currentRowChanged.connect(self._history_current_changed)
        hsel.selectionChanged.connect(lambda _a, _b: self.selectionChanged.emit())
        self.history_view.activated.connect(lambda _i: self.detail_tabs.setFocus())
        self.editor.saved.connect(self._message_saved)
        self.context_panel.openRequested.connect(self.openRequested.emit)

    # ---- the page's public face ----

    def load(self) -> None:
        """Read the first page of sessions (the window calls it once it is set up)."""
        self.sessions_model.reload()

    def focus(self) -> None:
        self.focus_filter()

    def focus_filter(self) -> None:
        self.session_filter.setFocus()
        self.session_filter.selectAll()

    def current_session(self) -> str | None:
        return self.history_model.session_id

    def current_message(self) -> dict[str, Any] | None:
        index = self.history_view.currentIndex()
        if not index.isValid():
            return None
        row = index.data(ROW_ROLE)
        return row if isinstance(row, dict) else None

    def can_save(self) -> bool:
        """The metadata editor holds a message (the Save action is enabled)."""
        return self.editor.message is not None

    def save_metadata(self) -> None:
        self.editor.save()

    def select_session(self, session_id: str) -> bool:
        """Make `session_id` current in the sessions view (if loaded) and show its history."""
        if self.history_model.session_id != session_id:
            self.history_model.set_session(session_id)
            self._session_changed()
        row = self.sessions_model.row_of(session_id)
        if row < 0:
            self.sessions_view.selectionModel().clearSelection()
            return False
        proxy_index = self.sessions_proxy.mapFromSource(self.sessions_model.index(row, 0))
        if proxy_index.isValid():
            self.sessions_view.selectionModel().setCurrentIndex(
                proxy_index,
                QItemSelectionModel.SelectionFlag.ClearAndSelect
                | QItemSelectionModel.SelectionFlag.Rows,
            )
            self.sessions_view.scrollTo(proxy_index)
        return True

    def open_message(self, message_id: str, session_id: str) -> None:
        """Show a message in its session: select the session, then find the message."""
        self.select_session(session_id)
        self.history_model.locate(message_id)

    def refresh(self, current: bool) -> None:
        self.sessions_model.refresh()
        if self.history_model.session_id is not None:
            self.history_model.refresh()
        edited = self.editor.message
        if edited is not None:  # changed or deleted meanwhile (say while the window was hidden)
            self._reload(str(edited["message_id"]))

    def _reload(self, message_id: str) -> None:
        """Read an open message again: follow its changes, or take it out if it is gone."""
        service = self._service

        def failed(exc: BaseException) -> None:
            if isinstance(exc, NotFoundError):
                self._messages_gone({message_id})
            else:
                self.statusMessage.emit(str(exc))

        self._runner.run(
            lambda _j: fetch_message(service, message_id), self._message_updated, failed
        )

    def delete_targets(self) -> list[Target]:
        targets = []
        for index in sorted(
            self.history_view.selectionModel().selectedRows(), key=lambda i: i.row()
        ):
            row = index.data(ROW_ROLE)
            if isinstance(row, dict):
                targets.append(
                    Target(str(row["message_id"]), int(row["revision"]), str(row["session_id"]))
                )
        return targets

    def messages_deleted(self, message_ids: set[str]) -> None:
        self._messages_gone(message_ids)

    def on_changes(self, changes: Sequence[ChangeEvent]) -> None:
        """One batch of changes: at most one read of new messages in the open session, one of
        changed messages shown, one removal of deleted ones; the session list re-read on its
        throttle (see `_sessions_timer`)."""
        history = self.history_model
        current = history.session_id
        edited = self.editor.message
        edited_id = edited.get("message_id") if edited is not None else None
        gone: set[str] = set()
        written: list[str] = []  # new messages of the open session
        updated: dict[str, None] = {}  # changed messages shown (in order, once each)
        rebuilt = False
        for change in changes:
            kind, mid = change.kind, change.message_id
            if mid is None:
                rebuilt = rebuilt or kind == "rebuild"
            elif kind == "write":
                if current is not None and change.session_id == current:
                    written.append(mid)
            elif kind == "update":
                if mid == edited_id or history.row_of(mid) >= 0:
                    updated[mid] = None
            elif kind == "delete":
                gone.add(mid)
        self._messages_gone(gone)
        if written and history.exhausted:  # else they come with the next page
            self._fetch_then(written, history.on_written)
        if updated:
            self._fetch_then(list(updated), self._message_updated)
        if rebuilt:
            if current is not None:
                history.refresh()
            self.update_labels()
        # throttled, not debounced: a steady stream of writes still refreshes every interval
        if not self._sessions_timer.isActive():
            since = self._sessions_read.elapsed() if self._sessions_read.isValid() else None
            wait = SESSIONS_SOON_MS if since is None else SESSIONS_EVERY_MS - since
            self._sessions_timer.start(max(SESSIONS_SOON_MS, wait))

    def _refresh_sessions(self) -> None:
        self._sessions_read.start()
        self.sessions_model.refresh()

    def restore_state(self, settings: QSettings) -> None:
        for key, splitter in (
            ("mainSplit", self.main_split),
            ("rightSplit", self.right_split),
            ("detailSplit", self.detail.split),
        ):
            value = settings.value(f"browser/{key}")
            if isinstance(value, QByteArray):
                splitter.restoreState(value)
        for key, view in (
            ("sessionsHeader", self.sessions_view),
            ("historyHeader", self.history_view),
        ):
            value = settings.value(f"browser/{key}")
            if isinstance(value, QByteArray):
                view.horizontalHeader().restoreState(value)

    def save_state(self, settings: QSettings) -> None:
        settings.setValue("browser/mainSplit", self.main_split.saveState())
        settings.setValue("browser/rightSplit", self.right_split.saveState())
        settings.setValue("browser/detailSplit", self.detail.split.saveState())
        header = self.sessions_view.horizontalHeader().saveState()
        settings.setValue("browser/sessionsHeader", header)
        settings.setValue("browser/historyHeader", self.history_view.horizontalHeader().saveState())

    def stop(self) -> None:
        self.detail.cancel_loading()

    def update_labels(self, *_args: object) -> None:
        n = self.sessions_model.rowCount()
        more = "" if self.sessions_model.exhausted else "+"
        self.sessions_label.setText(f"Sessions ({n}{more})")
        sid = self.history_model.session_id
        if sid is None:
            self.history_label.setText("History — select a session")
        else:
            m = self.history_model.rowCount()
            more = "" if self.history_model.exhausted else "+"
            self.history_label.setText(f"History of {sid} ({m}{more} messages)")
        self.statusMessage.emit(
            f"{n}{'' if self.sessions_model.exhausted else '+'} sessions loaded"
        )

    # ---- internals ----

    def _apply_session_selection(self) -> None:
        index = self.sessions_view.currentIndex()
        session_id = index.data(KEY_ROLE) if index.isValid() else None
        if session_id is not None and session_id != self.history_model.session_id:
            self.history_model.set_session(str(session_id))
            self._session_changed()

    def _session_changed(self) -> None:
        self._clear_detail("")
        self.sessionChanged.emit(self.history_model.session_id)
        self.update_labels()

    def _select_history_row(self, row: int) -> None:
        index = self.history_model.index(row, 0)
        self.history_view.selectionModel().setCurrentIndex(
            index,
            QItemSelectionModel.SelectionFlag.ClearAndSelect
            | QItemSelectionModel.SelectionFlag.Rows,
        )
        self.history_view.scrollTo(index, QAbstractItemView.ScrollHint.PositionAtCenter)
        self.history_view.setFocus()

    def _history_current_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        row = current.data(ROW_ROLE) if current.isValid() else None
        if not isinstance(row, dict):
            self._clear_detail("")
            return
        self.detail.show_message(row)
        self.editor.follow(row)
        self.context_panel.set_message(str(row["message_id"]))
        self.messageOpened.emit(str(row["message_id"]))
        self.selectionChanged.emit()

    def _clear_detail(self, note: str) -> None:
        self.detail.clear(note)
        self.editor.follow(None)  # keeps unsaved edits of a message that still exists
        self.context_panel.set_message(None)
        self.selectionChanged.emit()

    def _message_saved(self, message: dict[str, Any]) -> None:
        self.history_model.on_updated(message)
        current = self.current_message()
        if current is not None and current.get("message_id") == message.get("message_id"):
            self.detail.show_message(current)
            self.context_panel.reload()

    def _filter_sessions(self, text: str) -> None:
        self.sessions_proxy.setFilterFixedString(text)
        if text:
            self.sessions_model.load_all()

    def _sessions_sorted(self, column: int, order: Qt.SortOrder) -> None:
        if (column, order) != (COL_STARTED, Qt.SortOrder.AscendingOrder):
            self.sessions_model.load_all()

    def _fetch_then(self, message_ids: list[str], then: Any) -> None:
        """Read these messages in one background job, then call `then(message)` for each that
        still exists, in order (one deleted meanwhile is skipped: its own event follows)."""
        service = self._service

        def done(messages: list[dict[str, Any]]) -> None:
            for message in messages:
                then(message)

        self._runner.run(
            lambda _j: fetch_messages(service, message_ids),
            done,
            lambda exc: self.statusMessage.emit(str(exc)),
        )

    def _message_updated(self, message: dict[str, Any]) -> None:
        self.history_model.on_updated(message)
        self.editor.on_external_update(message)
        current = self.current_message()
        if current is not None and current.get("message_id") == message.get("message_id"):
            self.detail.show_message(current)
            self.context_panel.reload()

    def _messages_gone(self, message_ids: set[str]) -> None:
        """Take deleted messages out of the views: one batch, one context reload."""
        if not message_ids:
            return
        shown = self.detail.message is not None and (
            self.detail.message.get("message_id") in message_ids
        )
        self.history_model.remove_keys(message_ids)
        edited = self.editor.message
        if edited is not None and edited.get("message_id") in message_ids:
            self.editor.set_message(None)  # its edits can no longer be saved
        if shown:
            self._clear_detail("This message was deleted.")
        elif self.context_panel.message_id is not None:
            self.context_panel.reload()
