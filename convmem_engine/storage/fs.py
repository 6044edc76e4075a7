"""The filesystem seam: every open, write, fsync, truncate, replace and unlink of the store.

Tests subclass `FileSystem` to inject failures (a failed or short write, a failed fsync or
rename) or a simulated crash between any two steps. The logical I/O counters reported by
`get_system_health` are counted here, so they count exactly what the store asked for.
"""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass
from typing import IO, Any

_BINARY = getattr(os, "O_BINARY", 0)
_NOINHERIT = getattr(os, "O_NOINHERIT", 0) | getattr(os, "O_CLOEXEC", 0)


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
        """Open (creating if missing) for appending; the descriptor is positioned at the end."""
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _BINARY | _NOINHERIT, 0o600)

    def open_new(self, path: str) -> int:
        """Create or truncate a file for writing (used for temporary files only)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _BINARY | _NOINHERIT
        return os.open(path, flags, 0o600)

    def open_read(self, path: str) -> int:
        return os.open(path, os.O_RDONLY | _BINARY | _NOINHERIT)

    def read(self, fd: int, size: int) -> bytes:
        return os.read(fd, size)

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
        os.makedirs(path, exist_ok=True)

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
        """The file object portalocker locks. Closing it (or process death) releases the lock."""
        return open(path, "a+b")

    def write_small_file(self, path: str, data: bytes) -> None:
        """Write a tiny informational file (the lock holder's pid); no durability needed."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _BINARY | _NOINHERIT, 0o600)
        try:
            os.write(fd, data)  # not the store's data: not counted
        finally:
            os.close(fd)

    def read_small_file(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read(4096)
