"""The bearer token of the HTTP transport: where it comes from, where it lives, how it is checked.

- `CONVMEM_HTTP_TOKEN`, when set, is the token (at least `MIN_TOKEN_CHARS` characters of the
  RFC 6750 token alphabet); the app then cannot regenerate it.
- Otherwise a token of `TOKEN_BYTES` random bytes (`secrets`, 256 bits) is generated on first
  use and kept in one file, `TOKEN_FILE_NAME` in the data dir, readable by the user only. It
  survives restarts. A file that is not a regular file of ours with user-only permissions (a
  planted symlink, a file others could read) is never trusted: a fresh token replaces it.
- `matches()` compares in constant time. Nothing here logs a token or echoes a presented one.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import logging
import os
import re
import secrets
import stat
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Final

logger = logging.getLogger(__name__)

ENV_VAR: Final = "CONVMEM_HTTP_TOKEN"
TOKEN_FILE_NAME: Final = "http-token"
TOKEN_BYTES: Final = 32
"""256 bits; `secrets.token_urlsafe(32)` spells them in 43 characters."""
MIN_TOKEN_CHARS: Final = 32
"""The shortest token accepted from `CONVMEM_HTTP_TOKEN`."""
MAX_TOKEN_CHARS: Final = 512

_B64TOKEN: Final = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
"""RFC 6750 `b64token`: what may follow `Bearer ` in an Authorization header."""
_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_NOINHERIT: Final = getattr(os, "O_NOINHERIT", 0) | getattr(os, "O_CLOEXEC", 0)
_BINARY: Final = getattr(os, "O_BINARY", 0)

TOKEN_RULE: Final = (
    f"{MIN_TOKEN_CHARS} to {MAX_TOKEN_CHARS} characters of A-Z a-z 0-9 - . _ ~ + / "
    "(optionally ending in =)"
)


class TokenError(Exception):
    """The token cannot be used or stored; the message names the cause, never the token."""


def valid_token(value: str) -> bool:
    return MIN_TOKEN_CHARS <= len(value) <= MAX_TOKEN_CHARS and bool(_B64TOKEN.fullmatch(value))


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


class HttpToken:
    """The token one data dir's HTTP listener accepts. Thread-safe: the app's GUI thread may
    regenerate it while the engine thread checks requests against it."""

    def __init__(self, data_dir: Path, environ: Mapping[str, str] | None = None) -> None:
        self.path = Path(data_dir) / TOKEN_FILE_NAME
        env = os.environ if environ is None else environ
        self._from_env = env.get(ENV_VAR) or None
        if self._from_env is not None and not valid_token(self._from_env):
            raise TokenError(f"{ENV_VAR} must be {TOKEN_RULE}")
        self._lock = threading.Lock()
        self._value: str | None = self._from_env

    @property
    def from_environment(self) -> bool:
        """True when `CONVMEM_HTTP_TOKEN` sets the token (it cannot be regenerated then)."""
        return self._from_env is not None

    def value(self) -> str:
        """The token, read from its file or generated and stored on first use."""
        with self._lock:
            if self._value is None:
                stored = self._read()
                if stored is None:
                    stored = new_token()
                    self._store(stored)
                self._value = stored
            return self._value

    def regenerate(self) -> str:
        """Replace the stored token with a fresh one; the old one stops working at once."""
        if self.from_environment:
            raise TokenError(f"the token comes from {ENV_VAR}; change or unset it instead")
        with self._lock:
            fresh = new_token()
            self._store(fresh)
            self._value = fresh
            return fresh

    def matches(self, presented: str) -> bool:
        """Constant-time comparison of a presented token with ours."""
        expected = self.value().encode("ascii")
        try:
            given = presented.encode("ascii")
        except UnicodeEncodeError:
            given = b""
        return hmac.compare_digest(given, expected)

    # -- the file -------------------------------------------------------------------------

    def _read(self) -> str | None:
        """The stored token, or None when there is none we can trust."""
        if not _NOFOLLOW and self.path.is_symlink():  # Windows: no O_NOFOLLOW
            logger.warning("the HTTP token file is a symbolic link; replacing it")
            return None
        try:
            fd = os.open(self.path, os.O_RDONLY | _NOFOLLOW | _NOINHERIT | _BINARY)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno == errno.ELOOP:  # a symlink where our file should be
                logger.warning("the HTTP token file is a symbolic link; replacing it")
                return None
            raise TokenError(f"cannot read {self.path}: {error.strerror}") from None
        try:
            info = os.fstat(fd)
            data = os.read(fd, MAX_TOKEN_CHARS + 2)
        finally:
            os.close(fd)
        if not self._trusted(info):
            logger.warning("the HTTP token file was not private to this user; replacing it")
            return None
        text = data.decode("ascii", errors="replace").strip()
        if not valid_token(text):
            logger.warning("the HTTP token file did not hold a valid token; replacing it")
            return None
        return text

    def _trusted(self, info: os.stat_result) -> bool:
        if not stat.S_ISREG(info.st_mode):
            return False
        if sys.platform == "win32":  # the per-user data folder's ACL protects it
            return True
        return info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077 == 0

    def _store(self, token: str) -> None:
        """Atomically: a fresh user-only temp file, fsync, rename over, fsync the directory.
        A symlink planted at the path is replaced, never followed."""
        directory = self.path.parent
        temp = directory / f".{TOKEN_FILE_NAME}.{secrets.token_hex(8)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _NOINHERIT | _BINARY
        try:
            fd = os.open(temp, flags, 0o600)
            try:
                os.write(fd, token.encode("ascii") + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, self.path)
        except OSError as error:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise TokenError(
                f"cannot store the HTTP token in {directory}: {error.strerror}"
            ) from None
        _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    if sys.platform == "win32":
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
