"""The app's automatic backups: due when the newest is older than the interval, then pruned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QSettings

from convmem_app.backup_schedule import BackupScheduler
from convmem_engine.service import MemoryService
from convmem_engine.transfer import BackupInfo, list_backups, verify_backup

pytestmark = pytest.mark.gui


def test_first_check_makes_a_verified_backup_then_nothing_until_due(
    qtbot: Any, service: MemoryService, settings: QSettings, tmp_path: Path
) -> None:
    service.write_message(session_id="s", role="user", content="remember me")
    sched = BackupScheduler(str(tmp_path / "data"), settings)
    assert (sched.enabled, sched.interval_hours, sched.keep) == (True, 24, 7)
    assert sched.folder == str(tmp_path / "data") + "-backups"
    assert sched.due()
    with qtbot.waitSignal(sched.backupMade, timeout=60_000) as made:
        sched.start(first_check_ms=0)
    info = made.args[0]
    assert isinstance(info, BackupInfo) and info.messages == 1
    assert verify_backup(info.path).messages == 1
    assert not sched.due()  # the newest is fresh
    sched.check_now()
    assert not sched.busy
    sched.stop()


def test_retention_keeps_the_newest_and_disabled_never_runs(
    qtbot: Any, service: MemoryService, settings: QSettings, tmp_path: Path
) -> None:
    service.write_message(session_id="s", role="user", content="x")
    sched = BackupScheduler(str(tmp_path / "data"), settings)
    sched.set_options(enabled=True, interval_hours=1, keep=2, folder=str(tmp_path / "b"))
    for _ in range(3):
        with qtbot.waitSignal(sched.backupMade, timeout=60_000):
            assert sched.backup_now() is not None
        qtbot.wait(5)  # distinct millisecond names
    assert len(list_backups(tmp_path / "b")) == 2
    sched.set_options(enabled=False, interval_hours=1, keep=2, folder=str(tmp_path / "c"))
    assert not sched.due()
    sched.stop()


def test_a_failed_backup_is_reported(
    qtbot: Any, service: MemoryService, settings: QSettings, tmp_path: Path
) -> None:
    sched = BackupScheduler(str(tmp_path / "no-such-data-dir"), settings)
    with qtbot.waitSignal(sched.backupFailed, timeout=60_000) as failed:
        sched.backup_now()
    assert "not a ConvMem data dir" in failed.args[0]
    assert not sched.busy
    sched.stop()
