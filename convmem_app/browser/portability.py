"""What issue 16 adds to the memory browser, attached in one place (`Portability.attach`).

- File → Import…, Export…, Backup and restore… (transfer_dialogs).
- The Browse tab shows the welcome page (what ConvMem does, the hosts found with an
  **Add to host** button each) while the store is empty.
- A Hosts tab (Ctrl+4): connected clients, the live activity feed, host setup.
- Message → Change selected… (Ctrl+E): tier, kind, importance, tags added or removed, on every
  message selected in the history or the search results, revision-checked; Undo bulk change.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QMenu,
    QSpinBox,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from convmem_app.browser.bulk import BulkChange, BulkResult, Target, apply_change, undo_change
from convmem_app.browser.host_setup import HostSetup, WelcomePage
from convmem_app.browser.hosts_page import HostsPage
from convmem_app.browser.jobs import Job
from convmem_app.browser.search_panel import SearchPanel
from convmem_app.browser.transfer_dialogs import BackupDialog, ExportDialog, ImportDialog
from convmem_app.hosts import Env
from convmem_engine.domain.message import MEMORY_KINDS, MEMORY_TIERS

if TYPE_CHECKING:
    from collections.abc import Callable

    from convmem_app.backup_schedule import BackupScheduler
    from convmem_app.browser.window import MemoryBrowser
    from convmem_engine.runtime.activity import ActivityLog
    from convmem_engine.runtime.clients import ClientInfo

UNCHANGED = "(unchanged)"


class BulkEditDialog(QDialog):
    def __init__(self, count: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Change selected messages")
        self.tier = QComboBox()
        self.tier.addItems([UNCHANGED, *MEMORY_TIERS])
        self.kind = QComboBox()
        self.kind.addItems([UNCHANGED, *MEMORY_KINDS])
        self.set_importance = QCheckBox("Set to")
        self.importance = QSpinBox()
        self.importance.setRange(0, 100)
        self.importance.setValue(50)
        self.add_tags = QLineEdit()
        self.add_tags.setPlaceholderText("comma-separated")
        self.remove_tags = QLineEdit()
        self.remove_tags.setPlaceholderText("comma-separated")
        importance = QWidget()
        row = QVBoxLayout(importance)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.set_importance)
        row.addWidget(self.importance)
        form = QFormLayout()
        form.addRow("Tier", self.tier)
        form.addRow("Kind", self.kind)
        form.addRow("Importance", importance)
        form.addRow("Add tags", self.add_tags)
        form.addRow("Remove tags", self.remove_tags)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        ok = buttons.button(QDialogButtonBox.StandardButton.Ok)
        ok.setText(f"Change {count} message{'s' if count != 1 else ''}")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        note = QLabel(
            "A message another client changed since you selected it is left as it is and reported."
        )
        note.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(note)
        layout.addWidget(buttons)

    @staticmethod
    def _tags(text: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))

    def change(self) -> BulkChange:
        tier, kind = self.tier.currentText(), self.kind.currentText()
        return BulkChange(
            memory_tier=None if tier == UNCHANGED else tier,
            memory_kind=None if kind == UNCHANGED else kind,
            importance=self.importance.value() if self.set_importance.isChecked() else None,
            add_tags=self._tags(self.add_tags.text()),
            remove_tags=self._tags(self.remove_tags.text()),
        )


class Portability(QObject):
    bulkDone = Signal(object)  # BulkResult
    undoDone = Signal(object)  # BulkResult

    def __init__(
        self,
        browser: MemoryBrowser,
        *,
        data_dir: Path,
        scheduler: BackupScheduler | None = None,
        clients: Callable[[], list[ClientInfo]] | None = None,
        activity: ActivityLog | None = None,
        env_factory: Callable[[], Env] = Env.current,
        restore_in_place: Callable[[str], object] | None = None,
    ) -> None:
        super().__init__(browser)
        self.browser = browser
        self.data_dir = data_dir
        self.scheduler = scheduler
        self.restore_in_place = restore_in_place  # the app's: stop, restore, reopen
        self.last_bulk: BulkResult | None = None
        self.dialog: QDialog | None = None
        runner = browser.runner
        # welcome page in the Browse tab while the store is empty
        self.welcome_setup = HostSetup(data_dir, runner, env_factory=env_factory)
        self.welcome = WelcomePage(self.welcome_setup)
        self.browse_stack = QStackedWidget()
        tabs = browser.tabs
        index = tabs.indexOf(browser.browse)
        title = tabs.tabText(index)
        tabs.removeTab(index)
        self.browse_stack.addWidget(browser.browse)
        self.browse_stack.addWidget(self.welcome)
        tabs.insertTab(index, self.browse_stack, title)
        tabs.setCurrentIndex(index)
        model = browser.browse.sessions_model
        for signal in (model.refreshed, model.pageLoaded, model.rowsInserted, model.rowsRemoved):
            signal.connect(self._update_welcome)
        model.modelReset.connect(self._update_welcome)
        model.loadingChanged.connect(self._update_welcome)
        # the Hosts tab
        self.hosts_setup = HostSetup(data_dir, runner, env_factory=env_factory)
        self.hosts_page = HostsPage(self.hosts_setup, clients, activity)
        self.hosts_page.openRequested.connect(browser.open_message)
        tabs.addTab(self.hosts_page, "&Hosts")
        self._build_actions()
        self._update_welcome()

    # -- actions ------------------------------------------------------------------------------

    def _act(self, text: str, shortcut: str | None, slot: Any) -> QAction:
        action = QAction(text, self.browser)
        if shortcut:
            action.setShortcut(QKeySequence(shortcut))
        action.triggered.connect(slot)
        self.browser.addAction(action)
        return action

    def _build_actions(self) -> None:
        b = self.browser
        self.act_import = self._act("&Import…", "Ctrl+I", self.open_import)
        self.act_export = self._act("&Export…", "Ctrl+Shift+E", self.open_export)
        self.act_backup = self._act("&Backup and restore…", None, self.open_backup)
        self.act_backup.setEnabled(self.scheduler is not None)
        self.act_bulk = self._act("&Change selected…", "Ctrl+E", self.open_bulk)
        self.act_undo = self._act("&Undo bulk change", None, self.undo_bulk)
        self.act_undo.setEnabled(False)
        self.act_hosts = self._act(
            "&Hosts", "Ctrl+4", lambda: b.tabs.setCurrentWidget(self.hosts_page)
        )
        menus = {
            m.title().replace("&", ""): m
            for m in (a.menu() for a in b.menuBar().actions())
            if isinstance(m, QMenu)
        }
        file_menu = menus.get("File")
        if file_menu is not None:
            existing = file_menu.actions()
            if existing:
                for act in (self.act_import, self.act_export, self.act_backup):
                    file_menu.insertAction(existing[0], act)
                file_menu.insertSeparator(existing[0])
            else:
                file_menu.addActions([self.act_import, self.act_export, self.act_backup])
        msg_menu = menus.get("Message")
        if msg_menu is not None:
            msg_menu.addSeparator()
            msg_menu.addAction(self.act_bulk)
            msg_menu.addAction(self.act_undo)
        view_menu = menus.get("View")
        if view_menu is not None:
            view_menu.addAction(self.act_hosts)

    def _update_welcome(self, *_args: Any) -> None:
        model = self.browser.browse.sessions_model
        empty = model.rowCount() == 0 and not getattr(model, "loading", False)
        self.browse_stack.setCurrentWidget(self.welcome if empty else self.browser.browse)
        if empty:
            self.welcome_setup.refresh()

    @property
    def showing_welcome(self) -> bool:
        return self.browse_stack.currentWidget() is self.welcome

    # -- dialogs ------------------------------------------------------------------------------

    def _show(self, dialog: QDialog) -> QDialog:
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.dialog = dialog
        dialog.show()
        return dialog

    def open_import(self) -> ImportDialog:
        d = ImportDialog(self.browser.service, self.browser.runner, self.browser)
        d.imported.connect(lambda _r: self.browser.refresh())
        self._show(d)
        return d

    def open_export(self) -> ExportDialog:
        b = self.browser
        session = b.browse.current_session()
        results = list(b.page_of(SearchPanel).model.results)
        d = ExportDialog(b.service, b.runner, b, session_id=session, results=results)
        self._show(d)
        return d

    def open_backup(self) -> BackupDialog | None:
        if self.scheduler is None:
            return None
        d = BackupDialog(
            self.data_dir,
            self.scheduler,
            self.browser.runner,
            self.browser,
            restore_in_place=self.restore_in_place,
        )
        self._show(d)
        return d

    # -- bulk curation ------------------------------------------------------------------------

    def targets(self) -> list[Target]:
        """The messages selected in the current view (search results or history)."""
        return self.browser.selected_targets()

    def open_bulk(self) -> BulkEditDialog | None:
        targets = self.targets()
        if not targets:
            self.browser.status_text.setText("Select messages in the history or search first.")
            return None
        d = BulkEditDialog(len(targets), self.browser)
        d.accepted.connect(lambda: self.apply_bulk(targets, d.change()))
        self._show(d)
        return d

    def apply_bulk(self, targets: list[Target], change: BulkChange) -> Job | None:
        if change.empty:
            return None
        service = self.browser.service

        def done(result: object) -> None:
            assert isinstance(result, BulkResult)
            if result.undo:
                self.last_bulk = result
                self.act_undo.setEnabled(True)
            self.browser.status_text.setText(result.summary("changed"))
            self.bulkDone.emit(result)

        def work(job: Job) -> BulkResult:
            return apply_change(
                service, targets, change, progress=job.report, cancel=job.cancel_event
            )

        return self.browser.runner.run(work, done, self._failed)

    def undo_bulk(self) -> Job | None:
        last = self.last_bulk
        if last is None:
            return None
        self.last_bulk = None
        self.act_undo.setEnabled(False)
        service = self.browser.service

        def done(result: object) -> None:
            assert isinstance(result, BulkResult)
            self.browser.status_text.setText("Undo: " + result.summary("restored"))
            self.undoDone.emit(result)

        return self.browser.runner.run(lambda _job: undo_change(service, last), done, self._failed)

    def _failed(self, error: BaseException) -> None:
        self.browser.status_text.setText(
            f"Failed: {getattr(error, 'message', None) or type(error).__name__}"
        )

    def stop(self) -> None:
        self.hosts_page.stop()
