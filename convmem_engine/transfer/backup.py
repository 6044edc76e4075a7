"""Backups: a consistent copy of a data dir taken while hosts keep writing, verified, restorable.

How a backup is consistent without stopping anyone: the log (`active.log`) is append-only and
holds the whole state (compaction writes every live message into a new log and renames it
over the old one). A copy of its first N bytes, read through one open descriptor, is a prefix
of the records the store wrote; if a record was being appended at that moment, the copy ends
in a torn record, which opening the copy cuts off exactly as crash recovery does. A compaction
that renames a new log over the old one meanwhile does not disturb the copy: the descriptor
still reads the old, complete file. So the copy is the store's state at one moment.

Every backup is verified before it is kept: the copy is opened as a store (the torn tail cut,
a fresh snapshot written so a restore opens fast) and must pass the full self-check (store
against its files, every index against a fresh build). A backup is a folder
`convmem-backup-<UTC time>` holding `active.log`, `snapshot.bin` and `backup.json`, or the same
files in one zip file `convmem-backup-<UTC time>.zip`. Both appear only complete (built under
a temporary name, fsynced, renamed).

Restore: into a new (missing or empty) data dir, or in place: the current data dir is renamed
aside to `<data dir>.before-restore-<UTC time>` (never overwritten or deleted) and the backup
put in its place. Both refuse while a process holds the data dir's lock.

Windows: while the copy runs, a compaction (`rebuild_index`) in the app cannot rename its new
log over the open file and reports IO_ERROR (the store stays as it was; run it again).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from convmem_engine.domain.errors import ConvMemError
from convmem_engine.service import MemoryService
from convmem_engine.service.ids import utc_millis
from convmem_engine.storage.lock import LOCK_NAME, PID_NAME
from convmem_engine.storage.store import LOG_NAME, SNAPSHOT_NAME
from convmem_engine.transfer.files import (
    DIR_MODE,
    FILE_MODE,
    atomic_file,
    fsync_dir,
    make_private_dir,
)

PREFIX: Final = "convmem-backup-"
MANIFEST: Final = "backup.json"
BACKUP_VERSION: Final = 1
DEFAULT_KEEP: Final = 7
DEFAULT_INTERVAL_HOURS: Final = 24
_CHUNK: Final = 4 << 20
_NAME_RE: Final = re.compile(re.escape(PREFIX) + r"(\d{8}T\d{6}(?:\d{3})?Z)(\.zip)?")
_STORE_FILES: Final = (LOG_NAME, SNAPSHOT_NAME)

Progress = Callable[[int, int], None]


class BackupError(ConvMemError):
    """A backup could not be made, verified or restored (the message says why)."""

    code = "IO_ERROR"


class BackupCancelled(BackupError):
    """Cancelled: nothing was kept."""


@dataclass(frozen=True, slots=True)
class BackupInfo:
    path: str
    single_file: bool
    created_at: int  # UTC milliseconds
    size: int  # bytes on disk
    messages: int
    sessions: int

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "single_file": self.single_file,
            "created_at": self.created_at,
            "size": self.size,
            "messages": self.messages,
            "sessions": self.sessions,
        }


def utc_stamp(ms: int) -> str:
    """A UTC time as it appears in backup and aside names: 20261201T162700123Z."""
    dt = datetime.fromtimestamp(ms / 1000, UTC)
    return dt.strftime("%Y%m%dT%H%M%S") + f"{ms % 1000:03d}Z"


def default_backup_dir(data_dir: str | os.PathLike[str]) -> str:
    """Next to the data dir, so a backup never lands inside the store it copies."""
    return os.path.abspath(os.fspath(data_dir)).rstrip("/\\") + "-backups"


# -- making a backup --------------------------------------------------------------------------


def _copy_log(src_dir: str, dst_dir: str, progress: Progress | None, cancel: Any) -> None:
    src = os.path.join(src_dir, LOG_NAME)
    try:
        fd = os.open(src, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise BackupError(f"data dir: has no {LOG_NAME} (not a ConvMem data dir)") from None
    try:
        total = os.fstat(fd).st_size  # the prefix to copy: fixed now
        out = os.open(
            os.path.join(dst_dir, LOG_NAME),
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
            FILE_MODE,
        )
        try:
            done = 0
            while done < total:
                if cancel is not None and cancel.is_set():
                    raise BackupCancelled("backup: cancelled; nothing was kept")
                chunk = os.read(fd, min(_CHUNK, total - done))
                if not chunk:
                    break
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view) :]
                done += len(chunk)
                if progress is not None:
                    progress(done, total)
            os.fsync(out)
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _open_and_check(folder: str) -> tuple[int, int]:
    """Open a store copy, run the full self-check, close (writing its snapshot).
    Returns (messages, sessions); raises BackupError naming the first problem."""
    try:
        svc = MemoryService.open(folder, background_search_from=1 << 62, keep_search_index=False)
    except ConvMemError as e:
        raise BackupError(f"verify: the copy does not open: {e.message}") from None
    try:
        problems = svc.check()
        health = svc.get_system_health()
    finally:
        svc.close()
    for name in (LOCK_NAME, PID_NAME):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, name))
    if problems:
        raise BackupError(f"verify: self-check failed: {problems[0]}")
    return int(health["active_messages"]), int(health["session_count"])


def _folder_size(folder: str) -> int:
    return sum(
        os.path.getsize(os.path.join(folder, n))
        for n in os.listdir(folder)
        if os.path.isfile(os.path.join(folder, n))
    )


def create_backup(
    data_dir: str | os.PathLike[str],
    dest_dir: str | os.PathLike[str],
    *,
    single_file: bool = False,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    now_ms: Callable[[], int] = utc_millis,
) -> BackupInfo:
    """Copy, verify and keep a backup of `data_dir` in `dest_dir` (created user-only). Safe
    while another process (the app, `convmem serve`) writes to the data dir."""
    src = os.fspath(data_dir)
    dest = os.path.abspath(os.fspath(dest_dir))
    if os.path.realpath(dest).startswith(os.path.realpath(src) + os.sep):
        raise BackupError("backup folder: must not be inside the data dir")
    make_private_dir(dest)
    created = now_ms()
    name = PREFIX + utc_stamp(created)
    work = tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=dest)
    try:
        _copy_log(src, work, progress, cancel)
        messages, sessions = _open_and_check(work)
        _write_manifest(work, created, messages, sessions)
        if single_file:
            target = os.path.join(dest, name + ".zip")
            with atomic_file(target) as f, zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as z:
                for n in sorted(os.listdir(work)):
                    z.write(os.path.join(work, n), n)
            size = os.path.getsize(target)
        else:
            target = os.path.join(dest, name)
            for n in os.listdir(work):
                _fsync_file(os.path.join(work, n))
            fsync_dir(work)
            os.rename(work, target)
            fsync_dir(dest)
            size = _folder_size(target)
    except OSError as e:
        raise BackupError(f"backup: cannot write the backup: {e.strerror or e}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return BackupInfo(target, single_file, created, size, messages, sessions)


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_manifest(folder: str, created: int, messages: int, sessions: int) -> None:
    manifest = {
        "convmem_backup": BACKUP_VERSION,
        "created_at": created,
        "messages": messages,
        "sessions": sessions,
    }
    with atomic_file(os.path.join(folder, MANIFEST)) as f:
        f.write(json.dumps(manifest, indent=2).encode() + b"\n")


@contextlib.contextmanager
def open_copy(data_dir: str | os.PathLike[str]) -> Iterator[MemoryService]:
    """A MemoryService over a temporary copy of a data dir's log: to look without changing
    anything (no lock taken, no recovery or snapshot written in the data dir), also while
    the app runs. The copy is removed afterwards."""
    work = tempfile.mkdtemp(prefix="convmem-look-")
    try:
        _copy_log(os.fspath(data_dir), work, None, None)
        with MemoryService.open(
            work, background_search_from=1 << 62, keep_search_index=False
        ) as service:
            yield service
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- reading, verifying, listing --------------------------------------------------------------


def _extract(backup: str, into: str) -> None:
    """Put the store files of a backup (folder or zip) into the empty folder `into`."""
    if os.path.isdir(backup):
        if not os.path.isfile(os.path.join(backup, LOG_NAME)):
            raise BackupError(f"backup: has no {LOG_NAME} (not a ConvMem backup)")
        for n in (*_STORE_FILES, MANIFEST):
            p = os.path.join(backup, n)
            if os.path.isfile(p) and not os.path.islink(p):
                shutil.copyfile(p, os.path.join(into, n))
                os.chmod(os.path.join(into, n), FILE_MODE)
        return
    if not zipfile.is_zipfile(backup):
        raise BackupError("backup: neither a backup folder nor a backup zip file")
    with zipfile.ZipFile(backup) as z:
        names = set(z.namelist())
        if LOG_NAME not in names:
            raise BackupError(f"backup: the zip holds no {LOG_NAME} (not a ConvMem backup)")
        for n in (*_STORE_FILES, MANIFEST):
            if n in names:  # fixed names only: nothing in the zip can name another path
                with z.open(n) as r, open(os.path.join(into, n), "wb") as w:
                    shutil.copyfileobj(r, w, _CHUNK)
                os.chmod(os.path.join(into, n), FILE_MODE)


def verify_backup(backup: str | os.PathLike[str]) -> BackupInfo:
    """Open a copy of the backup (the backup itself is only read) and run the self-check.
    Raises BackupError naming the problem."""
    path = os.path.abspath(os.fspath(backup))
    if not os.path.exists(path):
        raise BackupError("backup: does not exist")
    work = tempfile.mkdtemp(prefix="convmem-verify-")
    try:
        _extract(path, work)
        messages, sessions = _open_and_check(work)
        created = _manifest_time(work) or int(os.path.getmtime(path) * 1000)
    except OSError as e:
        raise BackupError(f"backup: cannot read it: {e.strerror or e}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = _folder_size(path) if os.path.isdir(path) else os.path.getsize(path)
    return BackupInfo(path, not os.path.isdir(path), created, size, messages, sessions)


def _manifest_time(folder: str) -> int | None:
    try:
        with open(os.path.join(folder, MANIFEST), "rb") as f:
            data = json.loads(f.read())
        value = data.get("created_at")
        return value if isinstance(value, int) else None
    except (OSError, ValueError, AttributeError):
        return None


def list_backups(dest_dir: str | os.PathLike[str]) -> list[tuple[str, int]]:
    """(path, created UTC ms) of the backups in a folder, newest first (by their names)."""
    folder = os.fspath(dest_dir)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    found: list[tuple[str, int]] = []
    for n in names:
        m = _NAME_RE.fullmatch(n)
        if m is None:
            continue
        stamp = m.group(1)
        dt = datetime.strptime(stamp[:15], "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
        ms = int(dt.timestamp()) * 1000 + (int(stamp[15:18]) if len(stamp) > 16 else 0)
        found.append((os.path.join(folder, n), ms))
    found.sort(key=lambda t: t[1], reverse=True)
    return found


def prune_backups(dest_dir: str | os.PathLike[str], keep: int = DEFAULT_KEEP) -> list[str]:
    """Delete all but the `keep` newest backups (only names this module made). Returns them."""
    removed: list[str] = []
    for path, _ in list_backups(dest_dir)[max(keep, 1) :]:
        if os.path.islink(path):
            continue
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        removed.append(path)
    return removed


# -- restoring ----------------------------------------------------------------------------------


def _refuse_if_in_use(data_dir: str) -> None:
    """BusyError when a process holds the data dir's lock (it is briefly taken and released)."""
    from convmem_engine.storage.fs import FileSystem
    from convmem_engine.storage.lock import DataDirLock

    lock = DataDirLock(FileSystem(), data_dir)
    lock.acquire()  # raises BusyError naming the holder
    lock.release()


def restore_backup(
    backup: str | os.PathLike[str],
    data_dir: str | os.PathLike[str],
    *,
    in_place: bool = False,
    now_ms: Callable[[], int] = utc_millis,
) -> tuple[BackupInfo, str | None]:
    """Verify `backup`, then make it the store of `data_dir`. Without `in_place`, `data_dir`
    must be missing or empty. With it, the current data dir is kept aside (renamed) and its
    new name returned. Nothing is overwritten or deleted."""
    src = os.path.abspath(os.fspath(backup))
    target = os.path.abspath(os.fspath(data_dir)).rstrip("/\\")
    exists = os.path.isdir(target)
    if exists and os.listdir(target) and not in_place:
        raise BackupError(
            "data dir: is not empty; restore into a new data dir, or in place (--in-place)"
        )
    if exists and os.listdir(target):
        _refuse_if_in_use(target)
    parent = os.path.dirname(target)
    make_private_dir(parent)
    work = tempfile.mkdtemp(prefix=".convmem-restore-", dir=parent)
    aside: str | None = None
    try:
        os.chmod(work, DIR_MODE)
        _extract(src, work)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(work, MANIFEST))
        messages, sessions = _open_and_check(work)
        if exists and os.listdir(target):
            aside = f"{target}.before-restore-{utc_stamp(now_ms())}"
            os.rename(target, aside)
        elif exists:
            os.rmdir(target)
        os.rename(work, target)
        fsync_dir(parent)
    except OSError as e:
        if aside is not None and not os.path.exists(target):
            with contextlib.suppress(OSError):  # put the current store back where it was
                os.rename(aside, target)
                fsync_dir(parent)
        raise BackupError(f"restore: cannot put the backup in place: {e.strerror or e}") from None
    finally:
        if os.path.isdir(work):
            shutil.rmtree(work, ignore_errors=True)
    created = int(os.path.getmtime(src) * 1000)
    size = _folder_size(src) if os.path.isdir(src) else os.path.getsize(src)
    info = BackupInfo(src, not os.path.isdir(src), created, size, messages, sessions)
    return info, aside
