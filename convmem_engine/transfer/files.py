"""Files written by export and backup: user-only, complete or absent (temp + fsync + rename)."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from typing import IO, Final

FILE_MODE: Final = 0o600
DIR_MODE: Final = 0o700


def fsync_dir(path: str) -> None:
    if os.name == "nt":  # directories cannot be opened for fsync on Windows; NTFS journals it
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_private_dir(path: str) -> None:
    """Create `path` (and parents) user-only; an existing directory is kept as it is."""
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)


@contextlib.contextmanager
def atomic_file(path: str) -> Iterator[IO[bytes]]:
    """Write `path` through a new temp file next to it; on success it is fsynced and renamed
    over `path` (then the directory fsynced); on any exception the temp file is removed and
    `path` is untouched. Never follows a symlink planted at the temp name (O_EXCL)."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    fd = os.open(tmp, flags, FILE_MODE)
    ok = False
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        ok = True
        fsync_dir(folder)
    finally:
        if not ok:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
