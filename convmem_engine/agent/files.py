"""Small durable file operations for the agent's files in the data dir.

Every file is created user-only (0600) in a user-only directory (0700); no open follows a
symbolic link (a planted link is refused, never written through); a replace is write to a
temporary file, fsync, rename, fsync of the directory, so a crash leaves the old file or the
new one, never half of one.
"""

from __future__ import annotations

import contextlib
import os
import stat

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_BINARY = getattr(os, "O_BINARY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOINHERIT", 0)


def ensure_dir(path: str) -> None:
    """Create `path` user-only if missing; refuse a symbolic link or a non-directory."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{path} is not a plain directory")
    if os.name != "nt" and st.st_mode & 0o077:
        os.chmod(path, 0o700)


def fsync_dir(path: str) -> None:
    if os.name == "nt":
        return
    fd = os.open(path, os.O_RDONLY | _CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path: str) -> bytes:
    """The whole file; a symbolic link is refused (`OSError`)."""
    fd = os.open(path, os.O_RDONLY | _BINARY | _NOFOLLOW | _CLOEXEC)
    try:
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_atomic(path: str, data: bytes) -> None:
    """Replace `path` with `data` durably and atomically (user-only)."""
    directory = os.path.dirname(path) or "."
    tmp = f"{path}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a leftover (or planted) temporary file
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _BINARY | _NOFOLLOW | _CLOEXEC
    fd = os.open(tmp, flags, 0o600)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            os.unlink(path)  # never write through a planted link; replace it
    except FileNotFoundError:
        pass
    os.replace(tmp, path)
    fsync_dir(directory)


class AppendFile:
    """An append-only file, each record fsynced before `append` returns."""

    def __init__(self, path: str) -> None:
        self.path = path
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | _BINARY | _NOFOLLOW | _CLOEXEC
        existed = os.path.lexists(path)
        self._fd = os.open(path, flags, 0o600)
        if not existed:
            fsync_dir(os.path.dirname(path) or ".")

    def append(self, data: bytes) -> None:
        _write_all(self._fd, data)
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fsync_dir(os.path.dirname(path) or ".")
