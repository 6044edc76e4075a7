"""Automatic backups in the app: on a schedule (default daily), keeping the newest N (default 7).

Settings (the app's QSettings, group `backup`): `enabled` (default true), `interval_hours`
(24), `keep` (7), `folder` (default `<data dir>-backups`). Every `CHECK_MS` (and a minute after
start), the scheduler looks at the newest backup in the folder; when it is older than the
interval (or there is none) it makes one on a worker thread (transfer.create_backup: online,
verified) and then deletes all but the newest `keep`. The store is only read, so hosts keep
writing meanwhile. Results are signals on the GUI thread; a failure is reported and retried at
the next check.
"""

from __future__ import annotations

import os
from typing import Any, Final

from PySide6.QtCore import QObject, QSettings, QTimer, Signal

from convmem_app.browser.jobs import Job, JobRunner
from convmem_engine.service.ids import utc_millis
from convmem_engine.transfer import (
    BackupInfo,
    create_backup,
    default_backup_dir,
    list_backups,
    prune_backups,
)
from convmem_engine.transfer.backup import DEFAULT_INTERVAL_HOURS, DEFAULT_KEEP

CHECK_MS: Final = 15 * 60 * 1000
FIRST_CHECK_MS: Final = 60 * 1000
"""The first check waits a minute: a start (at login, by a host's shim) is not slowed down."""
_HOUR_MS: Final = 3_600_000


class BackupScheduler(QObject):
    backupStarted = Signal()
    backupMade = Signal(object)  # BackupInfo
    backupFailed = Signal(str)

    def __init__(self, data_dir: str, settings: QSettings, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._data_dir = data_dir
        self._settings = settings
        self._runner = JobRunner(self, max_threads=1)
        self._timer = QTimer(self)
        self._timer.setInterval(CHECK_MS)
        self._timer.timeout.connect(self.check_now)
        self._first: QTimer | None = None
        self._job: Job | None = None
        self.last: BackupInfo | None = None
        self.last_error = ""

    # -- settings -------------------------------------------------------------------------

    def _value(self, key: str, default: Any) -> Any:
        return self._settings.value(f"backup/{key}", default)

    @property
    def enabled(self) -> bool:
        return str(self._value("enabled", "true")).lower() not in ("false", "0")

    @property
    def interval_hours(self) -> int:
        try:
            return max(1, int(self._value("interval_hours", DEFAULT_INTERVAL_HOURS)))
        except (TypeError, ValueError):
            return DEFAULT_INTERVAL_HOURS

    @property
    def keep(self) -> int:
        try:
            return max(1, int(self._value("keep", DEFAULT_KEEP)))
        except (TypeError, ValueError):
            return DEFAULT_KEEP

    @property
    def folder(self) -> str:
        value = self._value("folder", "")
        return str(value) if value else default_backup_dir(self._data_dir)

    def set_options(
        self, *, enabled: bool, interval_hours: int, keep: int, folder: str | None
    ) -> None:
        self._settings.setValue("backup/enabled", "true" if enabled else "false")
        self._settings.setValue("backup/interval_hours", int(interval_hours))
        self._settings.setValue("backup/keep", int(keep))
        self._settings.setValue("backup/folder", folder or "")

    # -- running ----------------------------------------------------------------------------

    def start(self, first_check_ms: int = FIRST_CHECK_MS) -> None:
        self._timer.start()
        self._first = QTimer(self)
        self._first.setSingleShot(True)
        self._first.timeout.connect(self.check_now)
        self._first.start(first_check_ms)

    def stop(self, msecs: int = 30_000) -> None:
        self._timer.stop()
        if self._first is not None:
            self._first.stop()
        self._runner.shutdown(msecs)

    @property
    def busy(self) -> bool:
        return self._job is not None

    def due(self) -> bool:
        if not self.enabled:
            return False
        backups = list_backups(self.folder)
        if not backups:
            return True
        return utc_millis() - backups[0][1] >= self.interval_hours * _HOUR_MS

    def check_now(self) -> None:
        if self._job is None and self.due():
            self.backup_now()

    def backup_now(self, *, single_file: bool = False) -> Job | None:
        """Start a backup now (also from the browser's Backup button); None while one runs."""
        if self._job is not None:
            return None
        folder, keep = self.folder, self.keep

        def work(job: Job) -> BackupInfo:
            info = create_backup(
                self._data_dir, folder, single_file=single_file, progress=job.report
            )
            prune_backups(folder, keep)
            return info

        self._job = self._runner.run(work, self._made, self._failed)
        self.backupStarted.emit()
        return self._job

    def _made(self, info: object) -> None:
        assert isinstance(info, BackupInfo)
        self._job = None
        self.last, self.last_error = info, ""
        self.backupMade.emit(info)

    def _failed(self, error: BaseException) -> None:
        self._job = None
        message = getattr(error, "message", None) or f"{type(error).__name__}"
        if isinstance(error, OSError):
            message = f"backup: {error.strerror or error}"
        self.last_error = str(message)
        self.backupFailed.emit(self.last_error)


def open_folder_target(info: BackupInfo) -> str:
    """The folder to show for a backup (its own folder, or the one holding its zip)."""
    return info.path if not info.single_file else os.path.dirname(info.path)
