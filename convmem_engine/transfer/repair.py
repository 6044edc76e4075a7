"""Repair: a store refused after a power cut, made to open again with everything before the damage.

When the disk kept a later block of the last, unsynced writes without an earlier one (a power
cut on a filesystem or device that makes a file's size durable before its data), the log holds
zeros before records and opening refuses with CORRUPT_STORE naming `active.log` and an offset
(docs/storage-format.md, "Recovery on open"). Every acknowledged write lies before that offset
then, but the store cannot tell such a hole from damage to synced records, so it changes nothing
and a person decides. `repair_store` is what the person runs:

1. The store is opened as it is; if it opens, there is nothing to repair (that open is the
   ordinary one any start makes).
2. A refusal that does not name a record of `active.log` (a log that ends before what its
   snapshot proves durable, a newer format, a log that lost its start) is not repaired here:
   RepairError, nothing changed.
3. With the data dir's lock held: a private copy of the log's first N bytes and the snapshot is
   opened; if that does not open, RepairError and nothing changed.
4. The damaged files are copied aside, to `<data dir>.before-repair-<UTC time>` (fsynced; never
   overwritten or deleted), then `active.log` is cut at N in place (fsynced), still under the
   lock: the data dir then holds the very store files the copy of step 3 opened with. Every
   other file of the data dir (the agent's, the HTTP token, search.idx, which describes the
   unchanged snapshot) stays as it was. The next start opens it as after any crash.

If the damage came from a failing disk rather than a power cut, what followed the offset was
acknowledged too: it is in the copy aside, and the report says how many bytes were cut.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from convmem_engine.domain.errors import ConvMemError, CorruptStoreError
from convmem_engine.service.ids import utc_millis
from convmem_engine.storage.fs import FileSystem
from convmem_engine.storage.lock import DataDirLock
from convmem_engine.storage.store import LOG_NAME, SNAPSHOT_NAME, Store
from convmem_engine.transfer.backup import utc_stamp
from convmem_engine.transfer.files import DIR_MODE, FILE_MODE, fsync_dir

_DAMAGED_RECORD: Final = re.compile(re.escape(LOG_NAME) + r": corrupt record at offset (\d+): ")
_CHUNK: Final = 4 << 20
_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)  # a symlink planted at a store file: refused
_BLOCK: Final = 4096
_LOOK_AHEAD: Final = 16 << 20
_ZERO_RUN: Final = 16  # zeros before a block boundary no record holds (a header: < 10)


class RepairError(ConvMemError):
    """The store could not be repaired here; nothing in the data dir was changed."""

    code = "CORRUPT_STORE"


@dataclass(frozen=True)
class RepairReport:
    """What `repair_store` did. `offset` None: the store opened, nothing was repaired."""

    messages: int  # live messages in the store now
    offset: int | None = None  # where active.log was cut
    cut_bytes: int = 0  # how much of active.log was cut off (kept in `aside`)
    aside: str | None = None  # the damaged files, as they were


def _messages(data_dir: str) -> int:
    """Open the store (recovering it as any start does), count its messages, close it."""
    store = Store.open(data_dir)
    try:
        return len(store.messages)
    finally:
        store.close()


def _copy(src: str, dst: str, length: int | None = None) -> None:
    """Copy `src` (its first `length` bytes) to the new file `dst`, user-only, fsynced."""
    binary = getattr(os, "O_BINARY", 0)
    fd = os.open(src, os.O_RDONLY | binary | _NOFOLLOW)
    try:
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | binary, FILE_MODE)
        try:
            left = os.fstat(fd).st_size if length is None else length
            while left > 0:
                chunk = os.read(fd, min(_CHUNK, left))
                if not chunk:
                    break
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view) :]
                left -= len(chunk)
            os.fsync(out)
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _truncate(path: str, length: int) -> None:
    fd = os.open(path, os.O_RDWR | getattr(os, "O_BINARY", 0) | _NOFOLLOW)
    try:
        os.ftruncate(fd, length)
        os.fsync(fd)
    finally:
        os.close(fd)


def damaged_log_offset(error: ConvMemError) -> int | None:
    """The offset of the damaged record a CORRUPT_STORE refusal names in `active.log`; None
    when it names no record of the log (repair cannot help)."""
    found = _DAMAGED_RECORD.match(error.message) if isinstance(error, CorruptStoreError) else None
    return int(found[1]) if found else None


def looks_like_a_power_cut(data_dir: str | os.PathLike[str], offset: int) -> bool:
    """Whether the log, from the damaged record at `offset` on (within `_LOOK_AHEAD`), has a
    stretch of zeros that ends at a 4 KiB block boundary: what a power cut leaves when the disk
    kept a later block of the unsynced tail without an earlier one (the earlier block reads as
    zeros, or as the synced bytes followed by zeros when it held the synced end). That is: the
    damaged record starts with zeros up to the boundary, or `_ZERO_RUN` zeros end at one.
    Records never hold such a stretch (a payload is JSON, which writes U+0000 as an escape; a
    header's longest run of zero bytes is under 10); a flipped byte or garbage (a failing disk,
    another program) leaves none.
    (A power cut whose synced end lay inside a record fewer than `_ZERO_RUN` bytes before a
    boundary is missed: `convmem repair` still repairs it.) The app offers its Repair button
    only when this is true."""
    path = os.path.join(os.fspath(data_dir), LOG_NAME)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | _NOFOLLOW)
    except OSError:
        return False
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        data = os.read(fd, _LOOK_AHEAD)
    finally:
        os.close(fd)
    first = _BLOCK - offset % _BLOCK  # the first block boundary after `offset`, in `data`
    if len(data) > first and not data[:first].strip(b"\0"):
        return True  # the damaged record starts with zeros (a record's magic is not zero)
    zeros = bytes(_ZERO_RUN)
    return any(
        data[end - _ZERO_RUN : end] == zeros
        for end in range(first, len(data) + 1, _BLOCK)
        if end >= _ZERO_RUN
    )


def _store_files(data_dir: str) -> list[str]:
    return [n for n in (LOG_NAME, SNAPSHOT_NAME) if os.path.isfile(os.path.join(data_dir, n))]


def repair_store(
    data_dir: str | os.PathLike[str], *, now_ms: Callable[[], int] = utc_millis
) -> RepairReport:
    """Make a store refused for a damaged record of its log open again, keeping every record
    before the damage and the damaged files aside (the module doc). BusyError while another
    process holds the data dir; RepairError (nothing changed) when cutting the log does not
    help or the damage is elsewhere."""
    target = os.path.abspath(os.fspath(data_dir)).rstrip("/\\")
    if not os.path.isfile(os.path.join(target, LOG_NAME)):
        raise RepairError(f"data dir: has no {LOG_NAME} (not a ConvMem data dir)")
    try:
        return RepairReport(_messages(target))
    except CorruptStoreError as e:
        damaged = damaged_log_offset(e)
        if damaged is None:
            raise RepairError(
                f"repair: the damage is not in a record of {LOG_NAME} ({e.message}); "
                "nothing was changed: restore a backup"
            ) from None
        offset = damaged
    log = os.path.join(target, LOG_NAME)
    size = os.path.getsize(log)
    parent = os.path.dirname(target)
    lock = DataDirLock(FileSystem(), target)
    lock.acquire()  # BusyError naming the holder: nobody opens the store while it changes
    try:
        work = tempfile.mkdtemp(prefix=".convmem-repair-", dir=parent)
        try:
            os.chmod(work, DIR_MODE)
            _copy(log, os.path.join(work, LOG_NAME), offset)
            if os.path.isfile(os.path.join(target, SNAPSHOT_NAME)):
                _copy(os.path.join(target, SNAPSHOT_NAME), os.path.join(work, SNAPSHOT_NAME))
            try:
                messages = _messages(work)  # the very files the data dir will hold
            except ConvMemError as e:
                raise RepairError(
                    f"repair: {LOG_NAME} cut at offset {offset} does not open either "
                    f"({e.message}); nothing was changed: restore a backup"
                ) from None
        finally:
            shutil.rmtree(work, ignore_errors=True)
        aside = f"{target}.before-repair-{utc_stamp(now_ms())}"
        os.mkdir(aside, DIR_MODE)
        for name in _store_files(target):
            _copy(os.path.join(target, name), os.path.join(aside, name))
        fsync_dir(aside)
        fsync_dir(parent)
        _truncate(log, offset)
    finally:
        lock.release()
    return RepairReport(messages, offset, size - offset, aside)
