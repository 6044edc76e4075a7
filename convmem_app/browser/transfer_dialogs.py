"""Import, export and backup dialogs: every run on a worker thread, with progress and Cancel.

Import: pick a file (format detected, or forced), **Check** runs the dry run (conversations and
messages it would store, skipped records by reason with their positions), **Import** stores
(durable batches; a cancelled import keeps what it stored and can be run again to finish).
Export: everything, the current session, or the current search results, as JSONL or Markdown.
Backup: back up now (folder or single file: path, size, time, **Open folder**), the automatic
schedule (on, every N hours, keep N), the backups kept with **Verify** and **Restore into a new
folder** and **Restore in place** (inside the app: it stops the runtime, restores, reopens;
a bare browser without the app shows the `convmem restore --in-place` command instead).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from convmem_app.browser import format as fmt
from convmem_app.browser.jobs import Job, JobRunner
from convmem_engine.transfer import (
    FORMATS,
    BackupInfo,
    ExportReport,
    ImportReport,
    export_jsonl,
    export_markdown,
    list_backups,
    restore_backup,
    run_import,
    verify_backup,
    write_jsonl,
)

if TYPE_CHECKING:
    from convmem_app.backup_schedule import BackupScheduler
    from convmem_engine.service import MemoryService


def _error_text(error: BaseException) -> str:
    message = getattr(error, "message", None)
    if isinstance(message, str):
        return message
    if isinstance(error, OSError):
        return f"{error.strerror or error}"
    return type(error).__name__


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).astimezone().strftime("%Y-%m-%d %H:%M")


class _JobDialog(QDialog):
    """A dialog with a progress bar and a Cancel button for its one running job."""

    def __init__(self, runner: JobRunner, parent: QWidget | None) -> None:
        super().__init__(parent)
        self.runner = runner
        self.job: Job | None = None
        self.progress = QProgressBar()
        self.progress.hide()
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.hide()
        self.cancel_button.clicked.connect(self.cancel)
        self.status = QLabel()
        self.status.setWordWrap(True)

    def footer(self) -> QHBoxLayout:
        row = QHBoxLayout()
        row.addWidget(self.progress, 1)
        row.addWidget(self.cancel_button)
        return row

    def start(self, fn: Any, done: Any, *, cancellable: bool = True) -> Job:
        job = Job(fn)
        job.progress.connect(self._progress)
        job.succeeded.connect(done)
        job.failed.connect(self._failed)
        job.finished.connect(self._finished)
        self.job = job
        self.progress.setRange(0, 0)
        self.progress.show()
        self.cancel_button.setVisible(cancellable)
        self.set_busy(True)
        return self.runner.start(job)

    def _progress(self, done: int, total: int) -> None:
        if total > 0:
            self.progress.setRange(0, total)
            self.progress.setValue(min(done, total))

    def _failed(self, error: BaseException) -> None:
        self.status.setText(f"Failed: {_error_text(error)}")

    def _finished(self) -> None:
        self.job = None
        self.progress.hide()
        self.cancel_button.hide()
        self.set_busy(False)

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.status.setText("Cancelling…")

    def set_busy(self, busy: bool) -> None:
        """Subclasses enable and disable their buttons."""

    def reject(self) -> None:
        self.cancel()
        super().reject()


# -- import ---------------------------------------------------------------------------------------


class ImportDialog(_JobDialog):
    checked = Signal(object)  # ImportReport of the dry run
    imported = Signal(object)  # ImportReport of the import

    def __init__(self, service: MemoryService, runner: JobRunner, parent: QWidget | None = None):
        super().__init__(runner, parent)
        self.setWindowTitle("Import memories")
        self.service = service
        self.path = QLineEdit()
        self.path.setPlaceholderText(
            "conversations.json or the export .zip (ChatGPT, Claude), memory.json, a .jsonl"
        )
        browse = QPushButton("Choose…")
        browse.clicked.connect(self._choose)
        self.format = QComboBox()
        self.format.addItem("Detect from the content", None)
        for f in FORMATS:
            self.format.addItem(f, f)
        self.check_button = QPushButton("Check (dry run)")
        self.check_button.clicked.connect(self.dry_run)
        self.import_button = QPushButton("Import")
        self.import_button.setEnabled(False)
        self.import_button.clicked.connect(self.run)
        self.problems = QPlainTextEdit()
        self.problems.setReadOnly(True)
        self.problems.setPlaceholderText("Skipped records and why appear here.")
        self.path.textChanged.connect(lambda _t: self.import_button.setEnabled(False))
        self.format.currentIndexChanged.connect(lambda _i: self.import_button.setEnabled(False))
        row = QHBoxLayout()
        row.addWidget(self.path, 1)
        row.addWidget(browse)
        form = QFormLayout()
        form.addRow("File", row)
        form.addRow("Format", self.format)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.check_button)
        buttons.addWidget(self.import_button)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.status)
        layout.addWidget(self.problems, 1)
        layout.addLayout(self.footer())
        self.resize(720, 420)

    def _choose(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import memories")
        if path:
            self.path.setText(path)

    def set_busy(self, busy: bool) -> None:
        self.check_button.setEnabled(not busy)
        if busy:
            self.import_button.setEnabled(False)

    def _args(self) -> tuple[str, str | None]:
        return self.path.text().strip(), self.format.currentData()

    def dry_run(self) -> Job:
        path, forced = self._args()
        service = self.service

        def work(job: Job) -> ImportReport:
            return run_import(
                path,
                service=service,
                fmt=forced,
                dry_run=True,
                progress=job.report,
                cancel=job.cancel_event,
            )

        self.status.setText("Checking…")
        return self.start(work, self._checked)

    def _checked(self, report: object) -> None:
        assert isinstance(report, ImportReport)
        self.status.setText(
            f"{report.format}: {report.messages:,} messages in {report.conversations:,} "
            f"conversations would be stored; {report.skipped_total:,} skipped."
        )
        self._show_problems(report)
        self.import_button.setEnabled(report.messages > 0 and not report.cancelled)
        self.checked.emit(report)

    def _show_problems(self, report: ImportReport) -> None:
        lines = [f"skipped {n:,}: {reason}" for reason, n in report.skipped.most_common()]
        lines += [f"{p.position}: {p.reason}" for p in report.problems]
        self.problems.setPlainText("\n".join(lines))

    def run(self) -> Job:
        path, forced = self._args()
        service = self.service

        def work(job: Job) -> ImportReport:
            return run_import(
                path, service=service, fmt=forced, progress=job.report, cancel=job.cancel_event
            )

        self.status.setText("Importing…")
        return self.start(work, self._imported)

    def _imported(self, report: object) -> None:
        assert isinstance(report, ImportReport)
        stop = " Cancelled: run it again to import the rest." if report.cancelled else ""
        self.status.setText(
            f"Stored {report.messages:,} messages in {report.conversations:,} conversations "
            f"(on disk); {report.skipped_total:,} skipped.{stop}"
        )
        self._show_problems(report)
        self.imported.emit(report)


# -- export ---------------------------------------------------------------------------------------


class ExportDialog(_JobDialog):
    exported = Signal(object)  # ExportReport, or an int (messages) for search results

    SCOPE_ALL, SCOPE_SESSION, SCOPE_RESULTS = range(3)

    def __init__(
        self,
        service: MemoryService,
        runner: JobRunner,
        parent: QWidget | None = None,
        *,
        session_id: str | None = None,
        results: Sequence[dict[str, Any]] = (),
    ) -> None:
        super().__init__(runner, parent)
        self.setWindowTitle("Export memories")
        self.service = service
        self.session_id = session_id
        self.results = list(results)
        self.scope = QComboBox()
        self.scope.addItem("Everything", self.SCOPE_ALL)
        if session_id is not None:
            self.scope.addItem("The current session", self.SCOPE_SESSION)
        if self.results:
            self.scope.addItem(f"The search results ({len(self.results)})", self.SCOPE_RESULTS)
        self.format = QComboBox()
        self.format.addItem("JSONL (lossless, re-importable)", "jsonl")
        self.format.addItem("Markdown (readable, a file a session)", "markdown")
        self.path = QLineEdit()
        browse = QPushButton("Choose…")
        browse.clicked.connect(self._choose)
        self.export_button = QPushButton("Export")
        self.export_button.clicked.connect(self.run)
        row = QHBoxLayout()
        row.addWidget(self.path, 1)
        row.addWidget(browse)
        form = QFormLayout()
        form.addRow("What", self.scope)
        form.addRow("Format", self.format)
        form.addRow("To", row)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.export_button)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.status)
        layout.addLayout(self.footer())
        self.scope.currentIndexChanged.connect(self._scope_changed)
        self.resize(640, 200)

    def _scope_changed(self) -> None:
        results = self.scope.currentData() == self.SCOPE_RESULTS
        self.format.setEnabled(not results)
        if results:
            self.format.setCurrentIndex(0)

    def _choose(self) -> None:
        if self.format.currentData() == "markdown":
            path = QFileDialog.getExistingDirectory(self, "Export to folder")
        else:
            path, _ = QFileDialog.getSaveFileName(self, "Export to", "memories.jsonl")
        if path:
            self.path.setText(path)

    def set_busy(self, busy: bool) -> None:
        self.export_button.setEnabled(not busy)

    def run(self) -> Job | None:
        out = self.path.text().strip()
        if not out:
            self.status.setText("Choose where to export to.")
            return None
        scope, kind, service = self.scope.currentData(), self.format.currentData(), self.service
        session = self.session_id if scope == self.SCOPE_SESSION else None
        results = list(self.results)

        def work(job: Job) -> ExportReport:
            if scope == self.SCOPE_RESULTS:
                n = write_jsonl(out, results, cancel=job.cancel_event)
                return ExportReport("jsonl", out, len({m["session_id"] for m in results}), n, 1)
            run = export_jsonl if kind == "jsonl" else export_markdown
            return run(
                service, out, session_id=session, progress=job.report, cancel=job.cancel_event
            )

        self.status.setText("Exporting…")
        return self.start(work, self._done)

    def _done(self, report: object) -> None:
        assert isinstance(report, ExportReport)
        self.status.setText(
            f"Exported {report.messages:,} messages of {report.sessions:,} sessions to "
            f"{report.path}"
        )
        self.exported.emit(report)


# -- backup ---------------------------------------------------------------------------------------


class BackupDialog(_JobDialog):
    backupMade = Signal(object)  # BackupInfo
    verified = Signal(object)  # BackupInfo
    restored = Signal(str)  # the new data dir
    restoreConfirmationShown = Signal(object)  # the QMessageBox asking to restore in place

    def __init__(
        self,
        data_dir: Path,
        scheduler: BackupScheduler,
        runner: JobRunner,
        parent: QWidget | None = None,
        *,
        restore_in_place: Callable[[str], object] | None = None,
    ) -> None:
        super().__init__(runner, parent)
        self.setWindowTitle("Backup and restore")
        self.data_dir = data_dir
        # the app's restore in place (stop, restore, reopen); None: only the command is shown
        self._restore_in_place = restore_in_place
        self.restore_confirmation: QMessageBox | None = None
        self.scheduler = scheduler
        self.single_file = QCheckBox("One file (.zip)")
        self.backup_button = QPushButton("Back up now")
        self.backup_button.clicked.connect(self.backup_now)
        self.last = QLabel("No backup made in this session yet.")
        self.last.setWordWrap(True)
        self.open_button = QPushButton("Open folder")
        self.open_button.setEnabled(False)
        self.open_button.clicked.connect(self._open_folder)
        self._last_info: BackupInfo | None = None
        self.enabled = QCheckBox("Back up automatically")
        self.interval = QSpinBox()
        self.interval.setRange(1, 24 * 30)
        self.interval.setSuffix(" hours")
        self.keep = QSpinBox()
        self.keep.setRange(1, 1000)
        self.folder = QLineEdit()
        self.enabled.setChecked(scheduler.enabled)
        self.interval.setValue(scheduler.interval_hours)
        self.keep.setValue(scheduler.keep)
        self.folder.setText(scheduler.folder)
        for w in (self.enabled,):
            w.toggled.connect(lambda _v: self._save_options())
        for s in (self.interval, self.keep):
            s.valueChanged.connect(lambda _v: self._save_options())
        self.folder.editingFinished.connect(self._save_options)
        self.backups = QListWidget()
        self.verify_button = QPushButton("Verify")
        self.verify_button.clicked.connect(self.verify_selected)
        self.restore_button = QPushButton("Restore into a new folder…")
        self.restore_button.clicked.connect(self._choose_restore)
        self.in_place_button = QPushButton("Restore in place…")
        self.in_place_button.setVisible(restore_in_place is not None)
        self.in_place_button.clicked.connect(self.confirm_restore_in_place)
        self.in_place = QLabel()
        self.in_place.setWordWrap(True)
        self.in_place.setTextInteractionFlags(self.in_place.textInteractionFlags())

        now = QHBoxLayout()
        now.addWidget(self.backup_button)
        now.addWidget(self.single_file)
        now.addStretch(1)
        now.addWidget(self.open_button)
        form = QFormLayout()
        form.addRow(self.enabled)
        form.addRow("Every", self.interval)
        form.addRow("Keep the newest", self.keep)
        form.addRow("Folder", self.folder)
        kept = QHBoxLayout()
        kept.addWidget(self.verify_button)
        kept.addWidget(self.restore_button)
        kept.addWidget(self.in_place_button)
        kept.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addLayout(now)
        layout.addWidget(self.last)
        layout.addLayout(form)
        layout.addWidget(QLabel("<b>Backups kept</b>"))
        layout.addWidget(self.backups, 1)
        layout.addLayout(kept)
        layout.addWidget(self.in_place)
        layout.addWidget(self.status)
        layout.addLayout(self.footer())
        scheduler.backupMade.connect(self._made)
        scheduler.backupFailed.connect(lambda text: self.status.setText(f"Backup failed: {text}"))
        self.backups.currentItemChanged.connect(lambda _a, _b: self._selection_changed())
        self.reload()
        self.resize(680, 520)

    def _save_options(self) -> None:
        self.scheduler.set_options(
            enabled=self.enabled.isChecked(),
            interval_hours=self.interval.value(),
            keep=self.keep.value(),
            folder=self.folder.text().strip() or None,
        )

    def reload(self) -> None:
        self.backups.clear()
        for path, created in list_backups(self.scheduler.folder):
            item = QListWidgetItem(f"{_when(created)}   {os.path.basename(path)}")
            item.setData(256, path)
            self.backups.addItem(item)
        if self.backups.count():
            self.backups.setCurrentRow(0)
        self._selection_changed()

    def _selected(self) -> str | None:
        item = self.backups.currentItem()
        return None if item is None else str(item.data(256))

    def _selection_changed(self) -> None:
        path = self._selected()
        self.verify_button.setEnabled(path is not None)
        self.restore_button.setEnabled(path is not None)
        self.in_place_button.setEnabled(path is not None)
        if path is None or self._restore_in_place is not None:
            self.in_place.setText("")
            return
        self.in_place.setText(
            "To restore in place (the current store is kept aside), quit ConvMem and run:\n"
            f'convmem restore --in-place --data-dir "{self.data_dir}" "{path}"'
        )

    def set_busy(self, busy: bool) -> None:
        self.backup_button.setEnabled(not busy)
        self.verify_button.setEnabled(not busy and self._selected() is not None)
        self.restore_button.setEnabled(not busy and self._selected() is not None)
        self.in_place_button.setEnabled(not busy and self._selected() is not None)

    def backup_now(self) -> None:
        job = self.scheduler.backup_now(single_file=self.single_file.isChecked())
        if job is None:
            self.status.setText("A backup is already running.")
            return
        self.status.setText("Backing up…")
        self.job = job
        job.progress.connect(self._progress)
        job.finished.connect(self._finished)
        self.progress.setRange(0, 0)
        self.progress.show()
        self.cancel_button.show()
        self.set_busy(True)

    def _made(self, info: object) -> None:
        assert isinstance(info, BackupInfo)
        self._last_info = info
        self.last.setText(
            f"Last backup: {_when(info.created_at)}, {fmt.bytes_text(info.size)}, "
            f"{info.messages:,} messages, verified.\n{info.path}"
        )
        self.open_button.setEnabled(True)
        self.status.setText("Backup made and verified.")
        self.reload()
        self.backupMade.emit(info)

    def _open_folder(self) -> None:
        info = self._last_info
        if info is not None:
            folder = info.path if not info.single_file else os.path.dirname(info.path)
            QDesktopServices.openUrl(QUrl.fromLocalFile(folder))

    def verify_selected(self) -> Job | None:
        path = self._selected()
        if path is None:
            return None
        self.status.setText("Verifying…")

        def done(info: object) -> None:
            assert isinstance(info, BackupInfo)
            self.status.setText(
                f"Backup OK: {info.messages:,} messages in {info.sessions:,} sessions."
            )
            self.verified.emit(info)

        return self.start(lambda _job: verify_backup(path), done, cancellable=False)

    def _choose_restore(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Restore into (an empty folder)")
        if folder:
            self.restore_into(folder)

    def restore_into(self, folder: str) -> Job | None:
        path = self._selected()
        if path is None:
            return None
        self.status.setText("Restoring…")

        def done(result: object) -> None:
            self.status.setText(
                f"Restored into {folder}. Start ConvMem with --data-dir there to use it."
            )
            clipboard = QGuiApplication.clipboard()
            if clipboard is not None:
                clipboard.setText(folder)
            self.restored.emit(folder)

        return self.start(lambda _job: restore_backup(path, folder), done, cancellable=False)

    def confirm_restore_in_place(self) -> QMessageBox | None:
        """Ask once; on Yes the app stops, puts the selected backup in place and reopens."""
        path = self._selected()
        if path is None or self._restore_in_place is None or self.restore_confirmation:
            return None
        restore = self._restore_in_place
        box = QMessageBox(self)
        box.setIcon(QMessageBox.Icon.Warning)
        box.setWindowTitle("Restore in place")
        box.setText(f"Replace the current store with the backup {os.path.basename(path)}?")
        box.setInformativeText(
            "ConvMem stops serving hosts for a moment, puts the backup in place of the current "
            "store and opens it again. The current store is kept aside at\n"
            f"{self.data_dir}.before-restore-<UTC time>\n"
            "never overwritten or deleted. If anything fails, the current store is opened "
            "again as it was."
        )
        box.setStandardButtons(QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.button(QMessageBox.StandardButton.Yes).setText("Restore in place")
        self.restore_confirmation = box

        def finished(result: int) -> None:
            self.restore_confirmation = None
            box.deleteLater()
            if result == QMessageBox.StandardButton.Yes:
                self.status.setText("Restoring in place…")
                self.set_busy(True)
                restore(path)

        box.finished.connect(finished)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.open()
        self.restoreConfirmationShown.emit(box)
        return box
