"""MemoryBrowser: the main window. It holds the pages (convmem_app/browser/pages.py), one tab
each, found by name, and what they share: the background-job runner, the live change events,
the menus and toolbar, the Delete action, the status bar and the saved layout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from PySide6.QtCore import QByteArray, QEvent, QSettings, Qt, Signal
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QGuiApplication,
    QHideEvent,
    QKeySequence,
    QShowEvent,
)
from PySide6.QtWidgets import (
    QApplication,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QTabWidget,
    QToolBar,
    QWidget,
)

from convmem_app.browser import icons, theme
from convmem_app.browser.browse_panel import BrowsePanel
from convmem_app.browser.bulk import BulkResult, Target, delete_messages
from convmem_app.browser.changes import ChangeBridge
from convmem_app.browser.jobs import Job, JobRunner
from convmem_app.browser.maintenance_panel import MaintenancePanel
from convmem_app.browser.page import BrowserPage, PageContext
from convmem_app.browser.pages import PAGES

if TYPE_CHECKING:
    from convmem_engine.runtime import Runtime
    from convmem_engine.service import ChangeEvent, MemoryService

SETTINGS_ORG = "ConvMem"
SETTINGS_APP = "ConvMem"

P = TypeVar("P", bound=BrowserPage)


def default_settings() -> QSettings:
    """Ini-format user settings under the ConvMem organisation/application name."""
    return QSettings(
        QSettings.Format.IniFormat, QSettings.Scope.UserScope, SETTINGS_ORG, SETTINGS_APP
    )


class MemoryBrowser(QMainWindow):
    """Browse, search, curate and maintain one MemoryService, live."""

    messageOpened = Signal(str)  # message id now current in the Browse page's history
    deleteConfirmationShown = Signal(object)  # the QMessageBox asking to confirm a delete
    deleted = Signal(int)  # messages deleted by a confirmed delete
    deleteFinished = Signal(object)  # its BulkResult: deleted, kept (changed meanwhile), gone

    def __init__(
        self,
        service: MemoryService,
        parent: QWidget | None = None,
        *,
        settings: QSettings | None = None,
        runtime: Runtime | None = None,
        pages: Sequence[type[BrowserPage]] = PAGES,
    ) -> None:
        super().__init__(parent)
        self.service = service
        self.settings = settings if settings is not None else default_settings()
        self.setWindowTitle("ConvMem — Memory browser")
        self.setObjectName("MemoryBrowser")
        self.runner = JobRunner(self, max_threads=4)
        self.bridge = ChangeBridge(service, self)
        # emitted on the GUI thread (the bridge carries writer threads' events over in batches)
        self.bridge.listen(self._on_changes)
        self.delete_confirmation: QMessageBox | None = None
        self._delete_job: Job | None = None
        self.last_delete: BulkResult | None = None

        context = PageContext(service, self.runner, self.settings, runtime)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.pages: list[BrowserPage] = []
        for page_class in pages:
            self._add_page(page_class(context))
        self.browse = self.page_of(BrowsePanel)
        self.browse.messageOpened.connect(self.messageOpened.emit)
        self.setCentralWidget(self.tabs)
        self._build_actions()
        self._build_status_bar()
        self.tabs.currentChanged.connect(self._tab_changed)
        self.runner.busyChanged.connect(self.busy.setVisible)
        self._update_actions()

        hints = QGuiApplication.styleHints()
        if hints is not None:
            hints.colorSchemeChanged.connect(self.apply_color_scheme)
        self.apply_color_scheme(theme.system_scheme())
        self._default_size()
        self.restore_state()
        self.bridge.start()
        self.browse.load()

    # --- pages ---

    def _add_page(self, page: BrowserPage) -> None:
        if not page.name or any(p.name == page.name for p in self.pages):
            raise ValueError(f"a browser page needs a unique name: {page.name!r}")
        self.pages.append(page)
        self.tabs.addTab(page, page.title)
        page.openRequested.connect(self.open_message)
        page.sessionChanged.connect(self._session_changed)
        page.selectionChanged.connect(self._update_actions)
        page.statusMessage.connect(self._show_status)

    def page(self, name: str) -> BrowserPage:
        """The page called `name` (KeyError when there is none)."""
        for page in self.pages:
            if page.name == name:
                return page
        raise KeyError(f"no browser page named {name!r}")

    def page_of(self, page_class: type[P]) -> P:
        """The page of class `page_class` (KeyError when there is none)."""
        for page in self.pages:
            if isinstance(page, page_class):
                return page
        raise KeyError(f"no browser page of class {page_class.__name__}")

    def current_page(self) -> BrowserPage | None:
        """The page whose tab is shown (None for a tab that holds no page)."""
        shown = self.tabs.currentWidget()
        for page in self.pages:
            if shown is not None and (shown is page or shown.isAncestorOf(page)):
                return page
        return None

    def _tab_of(self, page: BrowserPage) -> QWidget:
        """The tab holding `page`: the page itself, or a container it was put into."""
        for index in range(self.tabs.count()):
            tab = self.tabs.widget(index)
            if tab is not None and (tab is page or tab.isAncestorOf(page)):
                return tab
        raise KeyError(f"browser page {page.name!r} has no tab")

    def show_page(self, name: str) -> BrowserPage:
        """Make the tab of page `name` current and return the page."""
        page = self.page(name)
        self.tabs.setCurrentWidget(self._tab_of(page))
        return page

    def focus_page(self, name: str) -> None:
        """Show page `name` and put the keyboard focus where work on it starts."""
        self.show_page(name).focus()

    # --- construction ---

    def _default_size(self) -> None:
        screen = QGuiApplication.primaryScreen()
        if screen is None:
            self.resize(1280, 800)
            return
        area = screen.availableGeometry()
        self.resize(min(1280, area.width() * 9 // 10), min(800, area.height() * 9 // 10))

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
        self.act_find = self._action(
            "&Find…", "search", Std.Find, lambda: self.focus_page("search")
        )
        self.act_filter = self._action(
            "Filter &sessions", None, "Ctrl+L", lambda: self.focus_page("browse")
        )
        self.act_delete = self._action("&Delete…", "delete", Std.Delete, self.delete_selected)
        self.act_save = self._action("&Save metadata", "save", Std.Save, self.browse.save_metadata)
        self.act_rebuild = self._action("Re&build index…", "rebuild", None, self._rebuild)
        self.act_health = self._action(
            "&Health", "health", None, lambda: self.show_page("maintenance")
        )
        self.act_close = self._action("&Close window", None, Std.Close, self.close)
        self.act_tabs = [
            self._action(
                page.title,
                None,
                f"Ctrl+{i + 1}" if i < 9 else None,
                lambda _c=False, name=page.name: self.show_page(name),
            )
            for i, page in enumerate(self.pages)
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

    def _refresh_icons(self) -> None:
        if not hasattr(self, "toolbar"):
            return
        color = self.palette().color(self.palette().ColorRole.WindowText)
        for act in self.findChildren(QAction):
            name = act.data()
            if isinstance(name, str) and name in icons.SVG:
                act.setIcon(icons.make_icon(name, color))
        self.setWindowIcon(icons.make_icon("app", color))
        for page in self.pages:
            page.apply_palette()

    # --- state ---

    def restore_state(self) -> None:
        s = self.settings
        geometry = s.value("browser/geometry")
        if isinstance(geometry, QByteArray):
            self.restoreGeometry(geometry)
        state = s.value("browser/windowState")
        if isinstance(state, QByteArray):
            self.restoreState(state)
        for page in self.pages:
            page.restore_state(s)
        tab = str(s.value("browser/tab", ""))
        if tab.isdigit():  # saved by a version that stored the tab's position
            self.tabs.setCurrentIndex(int(tab) if int(tab) < len(self.pages) else 0)
        elif any(page.name == tab for page in self.pages):
            self.show_page(tab)

    def save_state(self) -> None:
        s = self.settings
        s.setValue("browser/geometry", self.saveGeometry())
        s.setValue("browser/windowState", self.saveState())
        for page in self.pages:
            page.save_state(s)
        current = self.current_page()
        s.setValue("browser/tab", current.name if current is not None else "")
        s.sync()

    # The window follows the service's changes only while it is seen: hidden (closed to the
    # tray) or minimized, it stops (hosts writing then cost the GUI nothing: no change events
    # carried over, no models refreshed) and catches up when shown again (every page re-reads
    # what it shows, as F5 does). A window never shown follows from the start.

    @property
    def following(self) -> bool:
        """Changes reach the pages live (False while hidden or minimized)."""
        return self.bridge.active

    def _follow(self) -> None:
        if not self.bridge.active:
            self.bridge.start()
            self.refresh()  # catch up with what changed meanwhile

    def _stop_following(self) -> None:
        self.bridge.stop()

    def showEvent(self, event: QShowEvent) -> None:
        if not self.isMinimized():
            self._follow()
        super().showEvent(event)

    def hideEvent(self, event: QHideEvent) -> None:
        self._stop_following()
        super().hideEvent(event)

    def changeEvent(self, event: QEvent) -> None:
        if event.type() == QEvent.Type.PaletteChange:
            self._refresh_icons()
        elif event.type() == QEvent.Type.WindowStateChange:
            if self.isMinimized():
                self._stop_following()
            elif self.isVisible():
                self._follow()
        super().changeEvent(event)

    def closeEvent(self, event: QCloseEvent) -> None:
        """Closing only hides: stop following the service (showing again catches up). Work in
        flight (say a rebuild) finishes in the background; nothing here blocks the GUI."""
        self.save_state()
        self._stop_following()
        for page in self.pages:
            page.stop()
        self.runner.cancel_all()
        super().closeEvent(event)

    def shutdown(self, timeout_ms: int = 30000) -> bool:
        """Stop following the service and wait for background calls to end; call it before
        `service.close()`. Returns False if they did not end within `timeout_ms`."""
        self.bridge.stop()
        for page in self.pages:
            page.stop()
        return self.runner.shutdown(timeout_ms)

    # --- navigation ---

    def open_message(self, message_id: str, session_id: str) -> None:
        """Jump to a message in its session (search results, relations, context)."""
        self.show_page(self.browse.name)
        self.browse.open_message(message_id, session_id)

    def _session_changed(self, session_id: object) -> None:
        sid = str(session_id) if session_id is not None else None
        for page in self.pages:
            page.set_current_session(sid)

    def _tab_changed(self, _index: int) -> None:
        page = self.current_page()
        if page is not None:
            page.page_shown()
        self._update_actions()

    def refresh(self) -> None:
        """F5: every page re-reads what it shows."""
        current = self.current_page()
        for page in self.pages:
            page.refresh(page is current)

    def _rebuild(self) -> None:
        maintenance = self.page_of(MaintenancePanel)
        self.show_page(maintenance.name)
        maintenance.rebuild()

    # --- live updates ---

    def _on_changes(self, changes: list[ChangeEvent]) -> None:
        for page in self.pages:
            page.on_changes(changes)

    # --- delete ---

    def selected_targets(self) -> list[Target]:
        """The messages selected on the current page (history rows, search results), each with
        the revision the user sees: what Delete and bulk curation work on."""
        page = self.current_page()
        return page.delete_targets() if page is not None else []

    def _update_actions(self) -> None:
        self.act_delete.setEnabled(bool(self.selected_targets()) and self._delete_job is None)
        self.act_save.setEnabled(self.browse.can_save())

    def delete_selected(self) -> None:
        """One confirmation stating the count, then a revision-checked delete off the GUI
        thread: a message a host changed after it was selected is kept and reported."""
        targets = self.selected_targets()
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
            "removes it physically. A message another client changes before the delete reaches "
            "it is kept and reported."
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

    def _run_delete(self, targets: list[Target]) -> None:
        service = self.service

        def work(job: Job) -> BulkResult:
            return delete_messages(service, targets, progress=job.report, cancel=job.cancel_event)

        def succeeded(result: BulkResult) -> None:
            # also when the window stopped following the events meanwhile
            gone = set(result.changed) | set(result.missing)
            for page in self.pages:
                page.messages_deleted(gone)
            n = len(result.changed)
            text = f"Deleted {n} message{'s' if n != 1 else ''}"
            skipped = result.summary("deleted").split(", ")[1:]
            text += f" ({', '.join(skipped)})" if skipped else ""
            if result.conflicts:
                self.refresh()  # show the kept messages as the host left them
            self.status_text.setText(f"{text}. Rebuild index removes the content from disk.")
            self.last_delete = result
            self.deleted.emit(n)
            self.deleteFinished.emit(result)

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
        job.failed.connect(lambda exc: self._show_status(f"Delete failed: {exc}"))
        job.finished.connect(finished)
        self._delete_job = job
        self._update_actions()
        self.runner.start(job)

    def cancel_delete(self) -> None:
        """Stop a multi-delete between two messages; those already deleted stay deleted."""
        if self._delete_job is not None:
            self._delete_job.cancel()

    # --- status ---

    def _show_status(self, text: str) -> None:
        self.status_text.setText(text)


__all__ = ["SETTINGS_APP", "SETTINGS_ORG", "MemoryBrowser", "default_settings"]
