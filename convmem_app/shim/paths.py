"""Where ConvMem keeps its data and where an app listens for its hosts. Standard library only.

- `default_data_dir()`: `CONVMEM_DATA_DIR`, else the platform's per-user data folder
  (Windows `%LOCALAPPDATA%\\ConvMem`, macOS `~/Library/Application Support/ConvMem`,
  elsewhere `$XDG_DATA_HOME/convmem` or `~/.local/share/convmem`).
- `endpoint(data_dir)`: the local pipe for one data dir and one user. Windows: a named pipe
  `convmem-<user>-<hash>`; elsewhere an absolute Unix socket path inside a private (0700)
  directory owned by the user, so no other user can reach it.
"""

from __future__ import annotations

import getpass
import hashlib
import ntpath
import os
import stat
import sys
import tempfile
from pathlib import Path

APP_DIR_NAME = "ConvMem"


def default_data_dir() -> Path:
    override = os.environ.get("CONVMEM_DATA_DIR")
    if override:
        return Path(override).expanduser()
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / APP_DIR_NAME
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / APP_DIR_NAME
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / APP_DIR_NAME.lower()


def resolve_data_dir(value: str | os.PathLike[str] | None) -> Path:
    """The canonical absolute data dir: the same directory always maps to the same endpoint."""
    path = Path(value).expanduser() if value else default_data_dir()
    return Path(os.path.realpath(os.path.abspath(path)))


def _user() -> str:
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = str(os.getuid()) if hasattr(os, "getuid") else "user"
    return pipe_user(name)


def pipe_user(name: str) -> str:
    """The user name as it appears in a pipe name: letters, digits, `-` and `_`, at most 32."""
    return "".join(ch for ch in name if ch.isalnum() or ch in "-_")[:32] or "user"


def _digest(data_dir: Path | str, windows: bool) -> str:
    # Windows paths are case-insensitive and take either slash: one folder, one name.
    key = ntpath.normcase(str(data_dir)) if windows else str(data_dir)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


class SocketDirError(PermissionError):
    """The private socket directory cannot be used; the message says which one, why and what
    to do (the shim prints it, the app shows it)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(
            f"socket directory {path} {reason}: remove it, or set XDG_RUNTIME_DIR to a private "
            "folder of yours"
        )
        self.path = path
        self.reason = reason


def runtime_dir() -> Path:
    """A private directory for sockets: 0700 and owned by the current user, or SocketDirError."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(xdg) / "convmem" if xdg else Path(tempfile.gettempdir()) / f"convmem-{os.getuid()}"
    try:
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = base.lstat()
    except OSError as exc:
        raise SocketDirError(base, f"cannot be created ({exc.strerror or exc})") from exc
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise SocketDirError(base, "is not a directory owned by this user")
    if stat.S_IMODE(info.st_mode) != 0o700:
        try:
            os.chmod(base, 0o700)
        except OSError as exc:
            raise SocketDirError(base, f"cannot be made private ({exc.strerror or exc})") from exc
    return base


def windows_pipe_name(data_dir: Path | str, user: str) -> str:
    """The pipe name (QLocalServer's, which listens on `\\\\.\\pipe\\<name>`) for a data dir and
    a user: `convmem-<user>-<16 hex digits of the folder's SHA-256>`."""
    return f"convmem-{pipe_user(user)}-{_digest(data_dir, windows=True)}"


def endpoint(data_dir: Path) -> str:
    """The QLocalServer name / socket path the app for `data_dir` listens on."""
    if sys.platform == "win32":
        return windows_pipe_name(data_dir, _user())
    return str(runtime_dir() / f"{_digest(data_dir, windows=False)}.sock")


def windows_pipe_path(name: str) -> str:
    return rf"\\.\pipe\{name}"
