"""The filesystem seam: every open, write, fsync, truncate, replace and unlink of the store.

Tests subclass `FileSystem` to inject failures (a failed or short write, a failed fsync or
rename) or a simulated crash between any two steps. The logical I/O counters reported by
`get_system_health` are counted here, so they count exactly what the store asked for.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import sys
import threading
from dataclasses import dataclass
from typing import IO, Any

from convmem_engine.domain.errors import UnsafeDataDirError

_BINARY = getattr(os, "O_BINARY", 0)
_NOINHERIT = getattr(os, "O_NOINHERIT", 0) | getattr(os, "O_CLOEXEC", 0)
# Never follow a symlink planted at one of our names (POSIX). Windows has no O_NOFOLLOW:
# there `_refuse_link` checks for a reparse point first, and O_EXCL (CREATE_NEW) refuses any
# existing name, a link included.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_REPARSE_POINT = getattr(stat, "FILE_ATTRIBUTE_REPARSE_POINT", 0x400)

DIR_MODE = 0o700
FILE_MODE = 0o600


def _refuse_link(path: str) -> None:
    """Where the OS cannot refuse a link in open() itself (Windows), refuse it here."""
    if _NOFOLLOW:
        return
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or getattr(st, "st_file_attributes", 0) & _REPARSE_POINT:
        raise OSError(errno.ELOOP, "is a symbolic link or reparse point; refusing to follow it")


def check_private_dir(path: str) -> None:
    """Refuse a data dir that another user owns or may change; make it user-only (0700).

    POSIX: the directory (a symlink given as the path is followed: the user chose it) must be
    owned by the effective user and not writable by group or others; read/search bits for
    group and others are removed. Windows: the owner must be the current user (or the
    Administrators group, as for folders an elevated installer made) and no ACE may grant
    write access to anyone but the user, SYSTEM and Administrators.
    """
    if sys.platform == "win32":
        from convmem_engine.storage import win_acl

        try:
            problem = win_acl.dir_problem(path)
        except Exception as e:  # the security API failed (not: the folder is unsafe)
            logging.getLogger(__name__).warning(
                "data dir: cannot read the folder's owner and permissions (%s); not checked",
                type(e).__name__,
            )
            return
        if problem:
            raise UnsafeDataDirError(f"data dir: {path} {problem}")
        return
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDataDirError(f"data dir: {path} is not a directory")
    uid = os.geteuid()
    if st.st_uid != uid:
        raise UnsafeDataDirError(
            f"data dir: {path} is owned by another user (uid {st.st_uid}; you are uid {uid}): "
            "ConvMem keeps memory only in a folder of your own; choose another data folder"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        raise UnsafeDataDirError(
            f"data dir: {path} is writable by group or others (mode {mode:04o}): another user "
            f"could plant or replace files in it; run `chmod 700 {path}` if it is yours"
        )
    if mode & 0o077:
        os.chmod(path, DIR_MODE)  # readable by others (older versions made it 0755)


@dataclass(frozen=True, slots=True)
class IOCounters:
    """Logical I/O done by the store since it was opened (reads are not counted)."""

    write_bytes: int = 0
    write_calls: int = 0
    flush_calls: int = 0
    truncate_calls: int = 0
    replace_calls: int = 0

    def to_json(self) -> dict[str, int]:
        return {
            "write_bytes": self.write_bytes,
            "write_calls": self.write_calls,
            "flush_calls": self.flush_calls,
            "truncate_calls": self.truncate_calls,
            "replace_calls": self.replace_calls,
        }


class FileSystem:
    """Plain OS file operations on raw descriptors, with counters.

    Override a method in a subclass to inject a failure; call `super()` to do the real work.
    Failures are `OSError`; the store translates them into `StoreIOError` in one place.
    """

    def __init__(self) -> None:
        self._counter_lock = threading.Lock()
        self._write_bytes = 0
        self._write_calls = 0
        self._flush_calls = 0
        self._truncate_calls = 0
        self._replace_calls = 0

    # -- counters -------------------------------------------------------------------------

    def counters(self) -> IOCounters:
        with self._counter_lock:
            return IOCounters(
                write_bytes=self._write_bytes,
                write_calls=self._write_calls,
                flush_calls=self._flush_calls,
                truncate_calls=self._truncate_calls,
                replace_calls=self._replace_calls,
            )

    # -- descriptors ----------------------------------------------------------------------

    def open_append(self, path: str) -> int:
        """Open (creating if missing) for appending; the descriptor is positioned at the end.
        A symlink at `path` is refused (ELOOP), never followed."""
        _refuse_link(path)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _BINARY | _NOINHERIT
        return os.open(path, flags, FILE_MODE)

    def open_new(self, path: str) -> int:
        """Create a new file for writing (temporary files only), user-only. Whatever is at
        `path` (a leftover, a planted symlink) is unlinked first, then the file is created
        exclusively (O_EXCL: an entry planted meanwhile makes it fail, nothing is followed)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # removes a symlink itself, never its target
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY | _NOINHERIT
        return os.open(path, flags, FILE_MODE)

    def open_read(self, path: str) -> int:
        _refuse_link(path)
        return os.open(path, os.O_RDONLY | _NOFOLLOW | _BINARY | _NOINHERIT)

    def read(self, fd: int, size: int) -> bytes:
        return os.read(fd, size)

    def read_exact(self, fd: int, size: int) -> bytes:
        """Exactly `size` bytes through `read` (looping over short reads); EOFError when the
        file ends first."""
        parts = []
        have = 0
        while have < size:
            chunk = self.read(fd, size - have)
            if not chunk:
                raise EOFError
            parts.append(chunk)
            have += len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def seek(self, fd: int, offset: int) -> None:
        os.lseek(fd, offset, os.SEEK_SET)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def write(self, fd: int, data: bytes | memoryview) -> int:
        """One write call; returns the number of bytes written (may be short)."""
        written = os.write(fd, data)
        with self._counter_lock:
            self._write_calls += 1
            self._write_bytes += written
        return written

    def write_all(self, fd: int, data: bytes | memoryview) -> None:
        """Write every byte of `data`, continuing after short writes.

        A short write is not an error by itself (a signal, a nearly full disk): the next call
        either writes the rest or raises the real reason (ENOSPC, EIO, EFBIG), which is what
        the user needs to see. A call that writes nothing is reported as a full disk.
        """
        view = memoryview(data)
        while view:
            n = self.write(fd, view)
            if n <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view = view[n:]

    def fsync(self, fd: int) -> None:
        with self._counter_lock:
            self._flush_calls += 1
        os.fsync(fd)

    def truncate(self, fd: int, size: int) -> None:
        with self._counter_lock:
            self._truncate_calls += 1
        os.ftruncate(fd, size)

    def close(self, fd: int) -> None:
        os.close(fd)

    # -- names ----------------------------------------------------------------------------

    def replace(self, src: str, dst: str) -> None:
        with self._counter_lock:
            self._replace_calls += 1
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def makedirs(self, path: str) -> None:
        """Create `path` and missing parents user-only (0700), each new entry made durable
        (fsync of its parent), then check that it is private (`check_private_dir`)."""
        path = os.path.abspath(path)
        missing: list[str] = []
        p = path
        while not os.path.isdir(p):
            missing.append(p)
            parent = os.path.dirname(p)
            if parent == p:
                break
            p = parent
        for d in reversed(missing):
            try:
                self.mkdir(d)
            except FileExistsError:
                if not os.path.isdir(d):
                    raise
                continue
            self.fsync_dir(os.path.dirname(d))
        check_private_dir(path)

    def mkdir(self, path: str) -> None:
        os.mkdir(path, DIR_MODE)

    def fsync_dir(self, path: str) -> None:
        """Make a create/replace/unlink in `path` durable. Impossible (and unneeded) on Windows."""
        if os.name == "nt":
            return
        fd = os.open(path, os.O_RDONLY | _NOINHERIT)
        try:
            with self._counter_lock:
                self._flush_calls += 1
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- the lock file --------------------------------------------------------------------

    def open_lock_file(self, path: str) -> IO[Any]:
        """The file object portalocker locks. Closing it (or process death) releases the lock.
        Created user-only, never through a symlink; an older 0644 one is made 0600."""
        _refuse_link(path)
        flags = os.O_RDWR | os.O_CREAT | _NOFOLLOW | _BINARY | _NOINHERIT
        fd = os.open(path, flags, FILE_MODE)
        try:
            if sys.platform != "win32" and stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
                os.fchmod(fd, FILE_MODE)
            return os.fdopen(fd, "a+b")
        except BaseException:
            os.close(fd)
            raise

    def write_small_file(self, path: str, data: bytes) -> None:
        """Write a tiny informational file (the lock holder's pid); no durability needed.
        Whatever is at `path` is unlinked and the file created exclusively: a planted symlink
        is removed, never written through."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY | _NOINHERIT
        fd = os.open(path, flags, FILE_MODE)
        try:
            os.write(fd, data)  # not the store's data: not counted
        finally:
            os.close(fd)

    def read_small_file(self, path: str) -> bytes:
        _refuse_link(path)
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _BINARY | _NOINHERIT)
        try:
            return os.read(fd, 4096)
        finally:
            os.close(fd)
