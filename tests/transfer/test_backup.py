"""Backups taken while another process keeps writing, verified, pruned and restored."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from convmem_engine.domain.errors import BusyError
from convmem_engine.service import MemoryService
from convmem_engine.transfer import (
    BackupError,
    create_backup,
    list_backups,
    prune_backups,
    restore_backup,
    verify_backup,
)

ROOT = Path(__file__).resolve().parents[2]

WRITER = """
import sys
sys.path.insert(0, sys.argv[2])
from convmem_engine.domain.errors import ConvMemError
from convmem_engine.service import MemoryService
svc = MemoryService.open(sys.argv[1])
print("READY", flush=True)
i = 0
while True:
    r = svc.write_message(session_id=f"s{i % 7}", role="user", content=f"message {i} " * 20)
    mid = r["message"]["message_id"]
    if i % 40 == 0:
        svc.update_message(message_id=mid, content="updated " * 10)
    if i % 150 == 149:
        try:
            svc.rebuild_index()
        except ConvMemError:  # Windows: the backup's open log cannot be replaced; retried later
            pass
    print("A", mid, flush=True)
    i += 1
"""


class Writer:
    """A child process writing (and compacting) as fast as it can; `acked` grows live."""

    def __init__(self, data_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(data_dir), str(ROOT)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "READY"
        self.acked: list[str] = []
        self.enough = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            # Only whole lines count: the kill in stop() can cut the last one short ("A" with
            # no id), which is no acknowledgement (and used to raise here: a thread exception).
            words = line.split()
            if line.endswith("\n") and len(words) == 2 and words[0] == "A":
                self.acked.append(words[1])
                if len(self.acked) >= 200:
                    self.enough.set()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(30)
        self.thread.join(30)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def ids_in(data_dir: Path | str) -> set[str]:
    with MemoryService.open(data_dir) as svc:
        out: set[str] = set()
        for s in svc.read_messages(view="sessions", limit=1000)["sessions"]:
            cursor = None
            while True:
                page = svc.read_messages(
                    view="history", session_id=s["session_id"], limit=1000, cursor=cursor
                )
                out.update(m["message_id"] for m in page["history"])
                cursor = page.get("nextCursor")
                if cursor is None:
                    break
        return out


def test_online_backups_while_another_process_writes_and_compacts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    writer = Writer(data)
    try:
        assert writer.enough.wait(120)
        backups = []
        for single in (False, True, False):
            before = set(writer.acked)
            info = create_backup(data, tmp_path / "backups", single_file=single)
            backups.append((info, before))
    finally:
        writer.stop()
    written = set(writer.acked)
    for n, (info, before) in enumerate(backups):
        assert info.single_file == info.path.endswith(".zip")
        assert verify_backup(info.path).messages == info.messages
        restored = tmp_path / f"restored{n}"
        restore_backup(info.path, restored)
        got = ids_in(restored)
        # everything acknowledged before the backup started is in it; nothing invented
        assert before <= got
        assert len(got - written) <= 1  # at most the write in flight when the writer died
        assert len(got) == info.messages
    assert [p for p, _ in list_backups(tmp_path / "backups")] == [
        b.path for b, _ in reversed(backups)
    ]
    # the data dir itself is intact and consistent after all this
    with MemoryService.open(data) as svc:
        assert svc.check() == []


def test_backup_files_are_user_only_and_restore_in_place_keeps_the_old_store(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with MemoryService.open(data) as svc:
        for i in range(20):
            svc.write_message(session_id="old", role="user", content=f"kept {i}")
    info = create_backup(data, tmp_path / "b")
    if os.name != "nt":
        assert os.stat(info.path).st_mode & 0o777 == 0o700
        assert all(os.stat(p).st_mode & 0o777 == 0o600 for p in Path(info.path).iterdir())
    assert sorted(os.listdir(info.path)) == ["active.log", "backup.json", "snapshot.bin"]
    with MemoryService.open(data) as svc:
        svc.write_message(session_id="new", role="user", content="after the backup")
    with pytest.raises(BackupError, match="not empty"):
        restore_backup(info.path, data)
    with MemoryService.open(data), pytest.raises(BusyError):  # the app runs: refused
        restore_backup(info.path, data, in_place=True)
    _, aside = restore_backup(info.path, data, in_place=True)
    assert aside is not None and os.path.basename(aside).startswith("data.before-restore-")
    assert len(ids_in(data)) == 20
    assert len(ids_in(aside)) == 21  # the previous store, untouched


def test_a_damaged_backup_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with MemoryService.open(data) as svc:
        for i in range(50):
            svc.write_message(session_id="s", role="user", content=f"message {i} " * 30)
    info = create_backup(data, tmp_path / "b", single_file=False)
    log = Path(info.path) / "active.log"
    raw = bytearray(log.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    log.write_bytes(bytes(raw))
    (Path(info.path) / "snapshot.bin").unlink()
    with pytest.raises(BackupError, match="corrupt record at offset"):
        verify_backup(info.path)
    with pytest.raises(BackupError, match="corrupt record"):
        restore_backup(info.path, tmp_path / "new")
    assert not (tmp_path / "new").exists()
    assert [n for n in os.listdir(tmp_path) if n.startswith(".convmem")] == []


def test_prune_keeps_the_newest(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with MemoryService.open(data) as svc:
        svc.write_message(session_id="s", role="user", content="x")
    clock = iter(range(1_700_000_000_000, 1_800_000_000_000, 86_400_000))
    made = [
        create_backup(data, tmp_path / "b", single_file=i % 2 == 1, now_ms=lambda: next(clock))
        for i in range(5)
    ]
    (tmp_path / "b" / "unrelated.txt").write_text("mine", encoding="utf-8")
    removed = prune_backups(tmp_path / "b", keep=2)
    assert sorted(removed) == sorted(m.path for m in made[:3])
    assert sorted(os.listdir(tmp_path / "b")) == sorted(
        [os.path.basename(made[3].path), os.path.basename(made[4].path), "unrelated.txt"]
    )


def test_backup_and_restore_commands(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with MemoryService.open(data) as svc:
        svc.write_message(session_id="s", role="user", content="remember the tram")

    def convmem(*args: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "convmem_app", *map(str, args)],
            capture_output=True,
            text=True,
            timeout=120,
        )

    made = convmem("backup", "--data-dir", data, "--single-file", "--keep", "3")
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("backup made and verified: 1 messages in 1 sessions")
    [(path, _)] = list_backups(str(data) + "-backups")
    ok = convmem("backup", "--verify", path)
    assert ok.returncode == 0 and ok.stdout.startswith("backup OK: 1 messages")
    back = convmem("restore", "--data-dir", tmp_path / "copy", path)
    assert back.returncode == 0, back.stderr
    assert ids_in(tmp_path / "copy") == ids_in(data)
    refused = convmem("restore", "--data-dir", data, path)
    assert refused.returncode == 1 and "not empty" in refused.stderr
    missing = convmem("backup", "--verify", tmp_path / "nothing")
    assert (missing.returncode, missing.stderr) == (1, "convmem backup: backup: does not exist\n")
