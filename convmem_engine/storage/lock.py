"""The data-dir lock: exclusive, non-blocking, released by the OS when the holder dies.

The holder's pid lives in a separate file (`lock.pid`): on Windows the lock is mandatory, so
nobody could read a pid written into the locked file itself.

On POSIX the lock is `fcntl.flock(LOCK_EX | LOCK_NB)`, called directly: exactly what portalocker
does there (its default locker), without importing portalocker, which reads its own package
metadata at import (tens of milliseconds on the way to `convmem serve`'s first answer). On
Windows portalocker's msvcrt lock.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import IO, Any

from convmem_engine.domain.errors import BusyError, StoreIOError
from convmem_engine.storage.fs import FileSystem

LOCK_NAME = "lock"
PID_NAME = "lock.pid"


def _lock(f: IO[Any]) -> bool:
    """Take the exclusive lock without waiting; False when another process holds it."""
    if sys.platform == "win32":
        import portalocker

        try:
            portalocker.lock(
                f, portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING
            )
        except portalocker.LockException:
            return False
        return True
    import fcntl

    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # (portalocker reports every failure of the call as "locked")
        return False
    return True


def _unlock(f: IO[Any]) -> None:
    if sys.platform == "win32":
        import portalocker

        with contextlib.suppress(portalocker.LockException):
            portalocker.unlock(f)
        return
    import fcntl

    with contextlib.suppress(OSError):
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class DataDirLock:
    def __init__(self, fs: FileSystem, data_dir: str) -> None:
        self._fs = fs
        self._path = os.path.join(data_dir, LOCK_NAME)
        self._pid_path = os.path.join(data_dir, PID_NAME)
        self._file: IO[Any] | None = None

    def acquire(self) -> None:
        try:
            f = self._fs.open_lock_file(self._path)
        except OSError as e:
            raise StoreIOError(f"{LOCK_NAME}: cannot open the lock file: {e.strerror}") from e
        if not _lock(f):
            f.close()
            raise BusyError(
                f"data dir: locked by another process ({self._holder()}); "
                "only one process may open a data dir"
            )
        self._file = f
        with contextlib.suppress(OSError):  # informational only; the lock protects the data
            self._fs.write_small_file(self._pid_path, f"{os.getpid()}\n".encode("ascii"))

    def _holder(self) -> str:
        try:
            text = self._fs.read_small_file(self._pid_path).decode("ascii", "replace").strip()
        except OSError:
            return "pid unknown"
        return f"pid {text}" if text.isdigit() else "pid unknown"

    def release(self) -> None:
        f, self._file = self._file, None
        if f is None:
            return
        with contextlib.suppress(OSError):
            self._fs.unlink(self._pid_path)
        _unlock(f)
        f.close()

    @property
    def held(self) -> bool:
        return self._file is not None
