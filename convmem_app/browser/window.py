"""MemoryBrowser: the main window that puts the views together and keeps them live."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtCore import (
    QByteArray,
    QEvent,
    QItemSelectionModel,
    QModelIndex,
    QSettings,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import QAction, QCloseEvent, QGuiApplication, QKeySequence, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTableView,
    QTabWidget,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from convmem_app.browser import icons, theme
from convmem_app.browser.calls import fetch_message
from convmem_app.browser.changes import ChangeBridge
from convmem_app.browser.context_panel import ContextPanel
from convmem_app.browser.detail_view import MessageDetail
from convmem_app.browser.history_model import HistoryModel
from convmem_app.browser.jobs import Job, JobRunner
from convmem_app.browser.maintenance_panel import MaintenancePanel
from convmem_app.browser.metadata_editor import MetadataEditor
from convmem_app.browser.paged_model import KEY_ROLE, ROW_ROLE
from convmem_app.browser.search_panel import SearchPanel
from convmem_app.browser.sessions_model import (
    COL_STARTED,
    COL_SUMMARY,
    SessionsModel,
    SessionsProxy,
)
from convmem_engine.domain import NotFoundError

if TYPE_CHECKING:
    from convmem_engine.service import MemoryService

SETTINGS_ORG = "ConvMem"
SETTINGS_APP = "ConvMem"
TAB_BROWSE, TAB_SEARCH, TAB_MAINTENANCE = range(3)
DETAIL_MESSAGE, DETAIL_EDIT, DETAIL_CONTEXT = range(3)


def default_settings() -> QSettings:
    """Ini-format user settings under the ConvMem organisation/application name."""
    return QSettings(
        QSettings.Format.IniFormat, QSettings.Scope.UserScope, SETTINGS_ORG, SETTINGS_APP
    )


class MemoryBrowser(QMainWindow):
    """Browse, search, curate and maintain one MemoryService, live."""

    messageOpened = Signal(str)  # message id now current in the history view
    deleteConfirmationShown = Signal(object)  # the QMessageBox asking to confirm a delete
    deleted = Signal(int)  # messages deleted by a confirmed delete

    def __init__(
        self,
        service: MemoryService,
        parent: QWidget | None = None,
        *,
        settings: QSettings | None = None,
    ) -> None:
        super().__init__(parent)
        self.service = service
        self.settings = settings if settings is not None else default_settings()
        self.setWindowTitle("ConvMem — Memory browser")
        self.setObjectName("MemoryBrowser")
        self.runner = JobRunner(self, max_threads=4)
        self.bridge = ChangeBridge(service, self)
        # emitted on writer threads: queued, so `_on_change` runs on the GUI thread
        self.bridge.changed.connect(self._on_change, Qt.ConnectionType.QueuedConnection)
        self._gone: set[str] = set()  # deleted message ids not yet taken out of the views
        self.delete_confirmation: QMessageBox | None = None
        self._delete_job: Job | None = None
        self._health_stale = True

        self._build_browse()
        self.search_panel = SearchPanel(service, self.runner)
        self.maintenance = MaintenancePanel(service, self.runner)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(self.browse_page, "&Browse")
        self.tabs.addTab(self.search_panel, "Sea&rch")
        self.tabs.addTab(self.maintenance, "&Maintenance")
        self.setCentralWidget(self.tabs)
        self._build_actions()
        self._build_status_bar()
        self._wire()

        self._sessions_timer = self._single_shot(250, self.sessions_model.refresh)
        self._health_timer = self._single_shot(1000, self._refresh_health_if_visible)
        self._select_timer = self._single_shot(120, self._apply_session_selection)
        # a multi-delete's events come in bursts: take their messages out of the views together
        self._gone_timer = self._single_shot(0, self._flush_gone)

        hints = QGuiApplication.styleHints()
        if hints is not None:
            hints.colorSchemeChanged.connect(self.apply_color_scheme)
        self.apply_color_scheme(theme.system_scheme())
        self._default_size()
        self.restore_state()
        self.bridge.start()
        self.sessions_model.reload()

    # --- construction ---

    def _default_size(self) -> None:
        screen = QGuiApplication.primaryScreen()
        if screen is None:
            self.resize(1280, 800)
            return
        area = screen.availableGeometry()
        self.resize(min(1280, area.width() * 9 // 10), min(800, area.height() * 9 // 10))

    def _single_shot(self, msecs: int, slot: Any) -> QTimer:
        timer = QTimer(self)
        timer.setSingleShot(True)
        timer.setInterval(msecs)
        timer.timeout.connect(slot)
        return timer

    def _build_browse(self) -> None:
        service, runner = self.service, self.runner
        self.sessions_model = SessionsModel(service, runner, self)
        self.sessions_proxy = SessionsProxy(self)
        self.sessions_proxy.setSourceModel(self.sessions_model)
        self.session_filter = QLineEdit()
        self.session_filter.setPlaceholderText("Filter sessions by id or summary  (Ctrl+L)")
        self.session_filter.setClearButtonEnabled(True)
        self.sessions_view = QTableView()
        self.sessions_view.setObjectName("sessionsView")
        self.sessions_view.setModel(self.sessions_proxy)
        self._setup_table(self.sessions_view, QAbstractItemView.SelectionMode.SingleSelection)
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
        self._setup_table(self.history_view, QAbstractItemView.SelectionMode.ExtendedSelection)
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
        self.browse_page = self.main_split

    @staticmethod
    def _setup_table(view: QTableView, mode: QAbstractItemView.SelectionMode) -> None:
        view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        view.setSelectionMode(mode)
        view.setAlternatingRowColors(True)
        view.setWordWrap(False)
        view.verticalHeader().hide()
        view.verticalHeader().setDefaultSectionSize(view.fontMetrics().height() + 8)
        view.horizontalHeader().setStretchLastSection(True)
        view.setTabKeyNavigation(False)
        view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)

    def _action(self, text: str, icon: str | None, shortcut: Any, slot: Any) -> QAction:
        action = QAction(text, self)
        action.setData(icon)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
            action.setToolTip(
                f"{text.replace('&', '').rstrip('…')} ({action.shortcut().toString()})"
            )
        action.triggered.connect(slot)
        self.addAction(action)
        return action

    def _build_actions(self) -> None:
        Std = QKeySequence.StandardKey
        self.act_refresh = self._action("&Refresh", "refresh", Std.Refresh, self.refresh)
        if self.act_refresh.shortcut().isEmpty():
            self.act_refresh.setShortcut(QKeySequence(Qt.Key.Key_F5))
        self.act_find = self._action("&Find…", "search", Std.Find, self.focus_search)
        self.act_filter = self._action("Filter &sessions", None, "Ctrl+L", self.focus_filter)
        self.act_delete = self._action("&Delete…", "delete", Std.Delete, self.delete_selected)
        self.act_save = self._action("&Save metadata", "save", Std.Save, self.editor.save)
        self.act_rebuild = self._action("Re&build index…", "rebuild", None, self._rebuild)
        self.act_health = self._action("&Health", "health", None, self.show_maintenance)
        self.act_close = self._action("&Close window", None, Std.Close, self.close)
        self.act_tabs = [
            self._action(
                name, None, f"Ctrl+{i + 1}", lambda _c=False, t=i: self.tabs.setCurrentIndex(t)
            )
            for i, name in enumerate(("&Browse", "Sea&rch", "&Maintenance"))
        ]
        self.act_delete.setShortcutContext(Qt.ShortcutContext.WindowShortcut)

        menu = self.menuBar()
        file_menu = menu.addMenu("&File")
        file_menu.addAction(self.act_close)
        view_menu = menu.addMenu("&View")
        view_menu.addAction(self.act_refresh)
        view_menu.addAction(self.act_find)
        view_menu.addAction(self.act_filter)
        view_menu.addSeparator()
        for act in self.act_tabs:
            view_menu.addAction(act)
        msg_menu = menu.addMenu("M&essage")
        msg_menu.addAction(self.act_save)
        msg_menu.addAction(self.act_delete)
        maint_menu = menu.addMenu("M&aintenance")
        maint_menu.addAction(self.act_rebuild)
        maint_menu.addAction(self.act_health)

        self.toolbar = QToolBar("Main")
        self.toolbar.setObjectName("mainToolbar")
        self.toolbar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        for act in (self.act_refresh, self.act_find, self.act_delete, self.act_rebuild):
            self.toolbar.addAction(act)
        self.addToolBar(self.toolbar)

    def _build_status_bar(self) -> None:
        self.status_text = QLabel()
        self.busy = QProgressBar()
        self.busy.setRange(0, 0)
        self.busy.setMaximumWidth(120)
        self.busy.setMaximumHeight(14)
        self.busy.setTextVisible(False)
        self.busy.hide()
        self.cancel_delete_button = QPushButton("Cancel delete")
        self.cancel_delete_button.hide()
        self.cancel_delete_button.clicked.connect(self.cancel_delete)
        bar = self.statusBar()
        bar.addWidget(self.status_text, 1)
        bar.addPermanentWidget(self.cancel_delete_button)
        bar.addPermanentWidget(self.busy)

    def _wire(self) -> None:
        self.session_filter.textChanged.connect(self._filter_sessions)
        self.sessions_view.horizontalHeader().sortIndicatorChanged.connect(self._sessions_sorted)
        sel = self.sessions_view.selectionModel()
        sel.currentRowChanged.connect(lambda _c, _p: self._select_timer.start())
        self.sessions_view.activated.connect(lambda _i: self.history_view.setFocus())
        self.sessions_model.pageLoaded.connect(self._update_labels)
        self.sessions_model.refreshed.connect(self._update_labels)
        self.sessions_model.rowsRemoved.connect(self._update_labels)
        self.sessions_model.loadFailed.connect(self._show_error)
        self.history_model.pageLoaded.connect(self._update_labels)
        self.history_model.rowsRemoved.connect(self._update_labels)
        self.history_model.rowsInserted.connect(self._update_labels)
        self.history_model.modelReset.connect(self._update_labels)
        self.history_model.loadFailed.connect(self._show_error)
        self.history_model.located.connect(self._select_history_row)
        self.history_model.notFound.connect(
            lambda mid: self._show_error("That message is no longer in its session.")
        )
        hsel = self.history_view.selectionModel()
        hsel.currentRowChanged.connect(self._history_current_changed)
        hsel.selectionChanged.connect(lambda _a, _b: self._update_actions())
        self.history_view.activated.connect(lambda _i: self.detail_tabs.setFocus())
        self.editor.saved.connect(self._message_saved)
        self.context_panel.openRequested.connect(self.open_message)
        self.search_panel.openRequested.connect(self.open_message)
        self.search_panel.view.selectionModel().selectionChanged.connect(
            lambda _a, _b: self._update_actions()
        )
        self.tabs.currentChanged.connect(self._tab_changed)
        self.runner.busyChanged.connect(self.busy.setVisible)
        self.maintenance.rebuildFinished.connect(lambda _r: self._update_labels())
        self._update_actions()

    # --- palette and icons ---

    def apply_color_scheme(self, scheme: Qt.ColorScheme) -> None:
        """Follow the system: dark palette when the scheme is dark and the style did not adapt."""
        app = QApplication.instance()
        base = app.palette() if isinstance(app, QApplication) else self.palette()
        palette = theme.palette_for(scheme, base)
        if palette is None and scheme == Qt.ColorScheme.Light and theme.is_dark(self.palette()):
            palette = base
        if palette is not None:
            self.setPalette(palette)
        self._refresh_icons()

    def changeEvent(self, event: QEvent) -> None:
        if event.type() == QEvent.Type.PaletteChange:
            self._refresh_icons()
        super().changeEvent(event)

    def _refresh_icons(self) -> None:
        if not hasattr(self, "toolbar"):
            return
        color = self.palette().color(self.palette().ColorRole.WindowText)
        for act in self.findChildren(QAction):
            name = act.data()
            if isinstance(name, str) and name in icons.SVG:
                act.setIcon(icons.make_icon(name, color))
        self.setWindowIcon(icons.make_icon("app", color))
        self.search_panel.apply_palette()

    # --- state ---

    def restore_state(self) -> None:
        s = self.settings
        geometry = s.value("browser/geometry")
        if isinstance(geometry, QByteArray):
            self.restoreGeometry(geometry)
        state = s.value("browser/windowState")
        if isinstance(state, QByteArray):
            self.restoreState(state)
        for key, splitter in (
            ("mainSplit", self.main_split),
            ("rightSplit", self.right_split),
            ("detailSplit", self.detail.split),
        ):
            value = s.value(f"browser/{key}")
            if isinstance(value, QByteArray):
                splitter.restoreState(value)
        for key, view in (
            ("sessionsHeader", self.sessions_view),
            ("historyHeader", self.history_view),
        ):
            value = s.value(f"browser/{key}")
            if isinstance(value, QByteArray):
                view.horizontalHeader().restoreState(value)
        tab = str(s.value("browser/tab", 0))
        self.tabs.setCurrentIndex(int(tab) if tab.isdigit() else 0)

    def save_state(self) -> None:
        s = self.settings
        s.setValue("browser/geometry", self.saveGeometry())
        s.setValue("browser/windowState", self.saveState())
        s.setValue("browser/mainSplit", self.main_split.saveState())
        s.setValue("browser/rightSplit", self.right_split.saveState())
        s.setValue("browser/detailSplit", self.detail.split.saveState())
        s.setValue("browser/sessionsHeader", self.sessions_view.horizontalHeader().saveState())
        s.setValue("browser/historyHeader", self.history_view.horizontalHeader().saveState())
        s.setValue("browser/tab", self.tabs.currentIndex())
        s.sync()

    def showEvent(self, event: QShowEvent) -> None:
        if not self.bridge.active:  # shown again after a close: catch up and follow live again
            self.bridge.start()
            self.refresh()
        super().showEvent(event)

    def closeEvent(self, event: QCloseEvent) -> None:
        """Closing only hides: stop following the service (showing again catches up). Work in
        flight (say a rebuild) finishes in the background; nothing here blocks the GUI."""
        self.save_state()
        self.bridge.stop()
        self.detail.cancel_loading()
        self.runner.cancel_all()
        super().closeEvent(event)

    def shutdown(self, timeout_ms: int = 30000) -> bool:
        """Stop following the service and wait for background calls to end; call it before
        `service.close()`. Returns False if they did not end within `timeout_ms`."""
        self.bridge.stop()
        self.detail.cancel_loading()
        return self.runner.shutdown(timeout_ms)

    # --- navigation ---

    def current_session(self) -> str | None:
        return self.history_model.session_id

    def current_message(self) -> dict[str, Any] | None:
        index = self.history_view.currentIndex()
        if not index.isValid():
            return None
        row = index.data(ROW_ROLE)
        return row if isinstance(row, dict) else None

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
        """Jump to a message in its session (search results, relations, context)."""
        self.tabs.setCurrentIndex(TAB_BROWSE)
        self.select_session(session_id)
        self.history_model.locate(message_id)

    def _apply_session_selection(self) -> None:
        index = self.sessions_view.currentIndex()
        session_id = index.data(KEY_ROLE) if index.isValid() else None
        if session_id is not None and session_id != self.history_model.session_id:
            self.history_model.set_session(str(session_id))
            self._session_changed()

    def _session_changed(self) -> None:
        self._clear_detail("")
        self.search_panel.set_current_session(self.history_model.session_id)
        self._update_labels()

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
        self._update_actions()

    def _clear_detail(self, note: str) -> None:
        self.detail.clear(note)
        self.editor.follow(None)  # keeps unsaved edits of a message that still exists
        self.context_panel.set_message(None)
        self._update_actions()

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

    def focus_search(self) -> None:
        self.tabs.setCurrentIndex(TAB_SEARCH)
        self.search_panel.query.setFocus()
        self.search_panel.query.selectAll()

    def focus_filter(self) -> None:
        self.tabs.setCurrentIndex(TAB_BROWSE)
        self.session_filter.setFocus()
        self.session_filter.selectAll()

    def show_maintenance(self) -> None:
        self.tabs.setCurrentIndex(TAB_MAINTENANCE)

    def _tab_changed(self, index: int) -> None:
        if index == TAB_MAINTENANCE and self._health_stale:
            self._refresh_health_if_visible()
        self._update_actions()

    def _refresh_health_if_visible(self) -> None:
        if self.tabs.currentIndex() == TAB_MAINTENANCE:
            self._health_stale = False
            self.maintenance.refresh_health()
        else:
            self._health_stale = True

    def refresh(self) -> None:
        """F5: re-read sessions, the current history and the health panel."""
        self.sessions_model.refresh()
        if self.history_model.session_id is not None:
            self.history_model.refresh()
        self._health_stale = True
        self._refresh_health_if_visible()
        if self.search_panel.query.text().strip() and self.tabs.currentIndex() == TAB_SEARCH:
            self.search_panel.search()

    def _rebuild(self) -> None:
        self.show_maintenance()
        self.maintenance.rebuild()

    # --- live updates ---

    def _on_change(self, kind: str, message_id: object, session_id: object) -> None:
        mid = str(message_id) if message_id is not None else None
        sid = str(session_id) if session_id is not None else None
        if kind == "delete" and mid is not None:
            self._gone.add(mid)
            self._gone_timer.start()
        elif kind == "write" and mid is not None and sid == self.history_model.session_id:
            if self.history_model.exhausted:
                self._fetch_then(mid, self.history_model.on_written)
        elif (
            kind == "update"
            and mid is not None
            and (self.history_model.row_of(mid) >= 0 or self.editor.message is not None)
        ):
            self._fetch_then(mid, self._message_updated)
        elif kind == "rebuild" and self.history_model.session_id is not None:
            self.history_model.refresh()
        # throttled, not debounced: a steady stream of writes still refreshes every interval
        if not self._sessions_timer.isActive():
            self._sessions_timer.start()
        self._health_stale = True
        if not self._health_timer.isActive():
            self._health_timer.start()

    def _fetch_then(self, message_id: str, then: Any) -> None:
        service = self.service

        def failed(exc: BaseException) -> None:
            if isinstance(exc, NotFoundError):  # deleted meanwhile; its own event follows
                return
            self._show_error(str(exc))

        self.runner.run(lambda _j: fetch_message(service, message_id), then, failed)

    def _message_updated(self, message: dict[str, Any]) -> None:
        self.history_model.on_updated(message)
        self.editor.on_external_update(message)
        current = self.current_message()
        if current is not None and current.get("message_id") == message.get("message_id"):
            self.detail.show_message(current)
            self.context_panel.reload()

    def _flush_gone(self) -> None:
        gone, self._gone = self._gone, set()
        self._messages_gone(gone)

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

    # --- delete ---

    def _delete_targets(self) -> list[tuple[str, str]]:
        if self.tabs.currentIndex() == TAB_SEARCH:
            rows = {i.row() for i in self.search_panel.view.selectionModel().selectedRows()}
            results = self.search_panel.model.results
            return [(str(results[r]["message_id"]), str(results[r]["session_id"])) for r in rows]
        if self.tabs.currentIndex() != TAB_BROWSE:
            return []
        targets = []
        for index in sorted(
            self.history_view.selectionModel().selectedRows(), key=lambda i: i.row()
        ):
            row = index.data(ROW_ROLE)
            if isinstance(row, dict):
                targets.append((str(row["message_id"]), str(row["session_id"])))
        return targets

    def _update_actions(self) -> None:
        self.act_delete.setEnabled(bool(self._delete_targets()) and self._delete_job is None)
        self.act_save.setEnabled(self.editor.message is not None)

    def delete_selected(self) -> None:
        targets = self._delete_targets()
        if not targets or self._delete_job is not None or self.delete_confirmation is not None:
            return
        n = len(targets)
        box = QMessageBox(self)
        box.setIcon(QMessageBox.Icon.Warning)
        box.setWindowTitle("Delete messages")
        box.setText(f"Delete {n} message{'s' if n != 1 else ''}?")
        box.setInformativeText(
            "Deleted messages disappear from reads and search at once, for every connected "
            "host. Their content stays in the log file until the next Rebuild index, which "
            "removes it physically."
        )
        box.setStandardButtons(QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.button(QMessageBox.StandardButton.Yes).setText(f"Delete {n}")
        self.delete_confirmation = box

        def finished(result: int) -> None:
            self.delete_confirmation = None
            box.deleteLater()
            if result == QMessageBox.StandardButton.Yes:
                self._run_delete(targets)

        box.finished.connect(finished)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.open()
        self.deleteConfirmationShown.emit(box)

    def _run_delete(self, targets: list[tuple[str, str]]) -> None:
        service = self.service

        def work(job: Job) -> list[str]:
            done: list[str] = []
            for i, (mid, sid) in enumerate(targets):
                if job.cancelled:
                    break
                if service.delete_message(message_id=mid, session_id=sid).get("status") == "OK":
                    done.append(mid)
                job.report(i + 1, len(targets))
            return done

        def succeeded(done: list[str]) -> None:
            # also when the window stopped following the events meanwhile
            self._gone.update(done)
            self._flush_gone()
            self.search_panel.model.set_results(
                [r for r in self.search_panel.model.results if r["message_id"] not in done],
                self.search_panel.query.text(),
            )
            stopped = " (cancelled)" if len(done) < len(targets) and job.cancelled else ""
            self.status_text.setText(
                f"Deleted {len(done)} message{'s' if len(done) != 1 else ''}{stopped}. "
                "Rebuild index removes the content from disk."
            )
            self.deleted.emit(len(done))

        def finished() -> None:
            self._delete_job = None
            self.cancel_delete_button.hide()
            self._update_actions()

        def progress(done: int, total: int) -> None:
            self.status_text.setText(f"Deleting… {done} of {total}")

        job = Job(work)
        job.progress.connect(progress)
        if len(targets) > 1:
            self.cancel_delete_button.show()
        job.succeeded.connect(succeeded)
        job.failed.connect(lambda exc: self._show_error(f"Delete failed: {exc}"))
        job.finished.connect(finished)
        self._delete_job = job
        self._update_actions()
        self.runner.start(job)

    def cancel_delete(self) -> None:
        """Stop a multi-delete between two messages; those already deleted stay deleted."""
        if self._delete_job is not None:
            self._delete_job.cancel()

    # --- status ---

    def _update_labels(self, *_args: object) -> None:
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
        self.status_text.setText(
            f"{n}{'' if self.sessions_model.exhausted else '+'} sessions loaded"
        )

    def _show_error(self, text: str) -> None:
        self.status_text.setText(text)


__all__ = ["SETTINGS_APP", "SETTINGS_ORG", "MemoryBrowser", "default_settings"]
