"""Add ConvMem to a host's configuration, remove it, and tell its state. No Qt.

Every edit: read the file; parse it (refused, saying why and where, when it does not parse);
set or remove only the `convmem` entry, splicing the text so other entries, comments, key
order, indentation, line endings and a BOM stay as they were; check the result parses to the
same document except that entry; copy the original next to it
(`<name>.convmem-backup-<UTC time>`); write the new text atomically (temp file, fsync,
rename) with the original's permissions; refuse if the host rewrote the file meanwhile.
A symlinked config file (a dotfiles setup) is edited at its target.

States: `configured` (the entry runs this install's shim with this data dir), `stale` (there
is a convmem entry, but its command is missing or it points elsewhere, e.g. after moving the
install), `not-configured`, `unreadable` (the file does not parse; `detail` says where).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from convmem_app.hosts import jsonc, toml_edit
from convmem_app.hosts.locations import (
    HOSTS,
    SERVER_NAME,
    Env,
    HostSpec,
    config_path,
    installed,
    spec,
)

State = Literal["configured", "not-configured", "stale", "unreadable"]
BACKUP_INFIX: Final = ".convmem-backup-"
_BOM: Final = "\ufeff"


class HostConfigError(Exception):
    """A host file cannot be edited safely; the message says why (and where)."""


def shim_command(data_dir: Path) -> list[str]:
    """The absolute command a host runs: the installed `convmem-shim` if there is one next to
    our interpreter (or our bundled executable), else `python -m convmem_app shim`."""
    here = Path(sys.executable).resolve().parent
    unresolved = Path(sys.executable).parent  # a venv's bin/ holds the scripts
    name = "convmem-shim.exe" if sys.platform == "win32" else "convmem-shim"
    for folder in (unresolved, here, unresolved / "Scripts"):
        candidate = folder / name
        if candidate.is_file():
            return [str(candidate), "--data-dir", str(data_dir)]
    return [sys.executable, "-m", "convmem_app", "shim", "--data-dir", str(data_dir)]


def entry_for(host: HostSpec, command: list[str]) -> dict[str, Any]:
    entry: dict[str, Any] = {"command": command[0], "args": list(command[1:])}
    if host.key in ("vscode", "claude-code"):
        entry = {"type": "stdio", **entry}
    return entry


@dataclass(frozen=True)
class HostStatus:
    key: str
    title: str
    installed: bool
    path: Path
    state: State
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.key,
            "title": self.title,
            "installed": self.installed,
            "path": str(self.path),
            "state": self.state,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class EditResult:
    path: Path
    changed: bool
    backup: Path | None


# -- reading ----------------------------------------------------------------------------------


@dataclass
class _Doc:
    raw: bytes
    text: str  # without the BOM
    bom: bool
    newline: str


def _read(path: Path) -> _Doc | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise HostConfigError(f"{path}: cannot read it: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HostConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
    bom = text.startswith(_BOM)
    text = text.removeprefix(_BOM)
    newline = "\r\n" if "\r\n" in text else "\n"
    return _Doc(raw, text, bom, newline)


def _parse_json(host: HostSpec, path: Path, text: str) -> jsonc.Node:
    try:
        root = jsonc.parse(text, comments=host.format == "jsonc")
    except jsonc.JsoncError as e:
        raise HostConfigError(
            f"{path}: does not parse: {e.why} at line {e.line}, column {e.column}"
        ) from None
    if not isinstance(root.value, dict):
        raise HostConfigError(f"{path}: the top level is not a JSON object")
    return root


def _servers_node(host: HostSpec, path: Path, root: jsonc.Node) -> jsonc.Node | None:
    for m in root.members:
        if m.key == host.servers_key:
            if not isinstance(m.value.value, dict):
                raise HostConfigError(f"{path}: {host.servers_key} is not a JSON object")
            return m.value
    return None


def current_entry(host: HostSpec, path: Path) -> Any:
    """The convmem entry in the host's file (None when absent). Raises HostConfigError."""
    doc = _read(path)
    if doc is None or not doc.text.strip():
        return None
    if host.format == "toml":
        try:
            data = toml_edit.parse(doc.text)
        except toml_edit.TomlEditError as e:
            raise HostConfigError(f"{path}: {e}") from None
        servers = data.get(host.servers_key)
        return servers.get(SERVER_NAME) if isinstance(servers, dict) else None
    servers = _servers_node(host, path, _parse_json(host, path, doc.text))
    return None if servers is None else servers.value.get(SERVER_NAME)


def status(key: str, command: list[str], env: Env | None = None) -> HostStatus:
    env = env or Env.current()
    host = spec(key)
    path = config_path(key, env)
    found = installed(key, env)
    try:
        entry = current_entry(host, path)
    except HostConfigError as e:
        return HostStatus(key, host.title, found, path, "unreadable", str(e))
    if entry is None:
        return HostStatus(key, host.title, found, path, "not-configured")
    want = entry_for(host, command)
    if isinstance(entry, dict) and all(entry.get(k) == v for k, v in want.items()):
        return HostStatus(key, host.title, found, path, "configured")
    cmd = entry.get("command") if isinstance(entry, dict) else None
    if not isinstance(cmd, str) or not os.path.exists(cmd):
        detail = "its command no longer exists (was the install moved?)"
    else:
        detail = "it runs another command or data dir than this install"
    return HostStatus(key, host.title, found, path, "stale", detail)


def statuses(command: list[str], env: Env | None = None) -> list[HostStatus]:
    env = env or Env.current()
    return [status(h.key, command, env) for h in HOSTS]


# -- editing ----------------------------------------------------------------------------------


def _edited_json(host: HostSpec, path: Path, doc: _Doc | None, entry: Any) -> str | None:
    """The new text (entry None: remove), or None when nothing changes."""
    text = doc.text if doc is not None and doc.text.strip() else ""
    newline = doc.newline if doc is not None else "\n"
    if not text:
        if entry is None:
            return None
        return jsonc.render({host.servers_key: {SERVER_NAME: entry}}, "", "  ", newline) + newline
    root = _parse_json(host, path, text)
    servers = _servers_node(host, path, root)
    if entry is None:
        if servers is None or SERVER_NAME not in servers.value:
            return None
        new = jsonc.remove_member(text, servers, SERVER_NAME)
    elif servers is None:
        new = jsonc.set_member(text, root, host.servers_key, {SERVER_NAME: entry}, newline)
    else:
        if servers.value.get(SERVER_NAME) == entry:
            return None
        new = jsonc.set_member(text, servers, SERVER_NAME, entry, newline)
    # the safety net: the result parses, and only our entry differs
    try:
        after = jsonc.parse(new, comments=host.format == "jsonc").value
    except jsonc.JsoncError as e:  # a bug in the splicing: never write it
        raise HostConfigError(f"{path}: the edit would not parse ({e}); nothing written") from None
    before = dict(root.value)
    want = dict(before)
    servers_after = dict(before.get(host.servers_key) or {})
    if entry is None:
        servers_after.pop(SERVER_NAME, None)
    else:
        servers_after[SERVER_NAME] = entry
    want[host.servers_key] = servers_after
    if after != want:
        raise HostConfigError(f"{path}: the edit would change more than the convmem entry")
    return new


def _edited_toml(path: Path, doc: _Doc | None, entry: Any) -> str | None:
    text = doc.text if doc is not None else ""
    newline = doc.newline if doc is not None else "\n"
    try:
        current = toml_edit.parse(text).get("mcp_servers") or {}
        if entry is None:
            if SERVER_NAME not in current:
                return None
            return toml_edit.remove_server(text, SERVER_NAME)
        if current.get(SERVER_NAME) == entry:
            return None
        return toml_edit.set_server(text, SERVER_NAME, entry, newline)
    except toml_edit.TomlEditError as e:
        raise HostConfigError(f"{path}: {e}") from None


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _write(path: Path, doc: _Doc | None, text: str) -> Path | None:
    """Back up the original next to it, then replace it atomically. Returns the backup."""
    real = Path(os.path.realpath(path))
    data = ((_BOM if doc is not None and doc.bom else "") + text).encode("utf-8")
    folder = real.parent
    backup: Path | None = None
    mode = 0o600
    if doc is not None:
        mode = stat.S_IMODE(real.stat().st_mode)
        backup = folder / f"{real.name}{BACKUP_INFIX}{_stamp()}"
        n = 1
        while backup.exists():
            backup = folder / f"{real.name}{BACKUP_INFIX}{_stamp()}-{n}"
            n += 1
        _write_new(backup, doc.raw, mode)
    else:
        folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{real.name}.{secrets.token_hex(4)}.tmp"
    _write_new(tmp, data, mode)
    try:
        now = real.read_bytes() if real.exists() else None
        if now != (doc.raw if doc is not None else None):
            raise HostConfigError(
                f"{path}: changed by another program while editing; nothing written, try again"
            )
        os.replace(tmp, real)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    _fsync_dir(folder)
    return backup


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    if os.name == "nt":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _edit(key: str, entry: Any, env: Env | None) -> EditResult:
    env = env or Env.current()
    host = spec(key)
    path = config_path(key, env)
    doc = _read(path)
    if doc is None and entry is None:
        return EditResult(path, False, None)
    if doc is None and not installed(key, env):
        raise HostConfigError(f"{host.title}: not found on this computer ({path.parent} missing)")
    if host.format == "toml":
        new = _edited_toml(path, doc, entry)
    else:
        new = _edited_json(host, path, doc, entry)
    if new is None:
        return EditResult(path, False, None)
    try:
        backup = _write(path, doc, new)
    except OSError as e:
        raise HostConfigError(f"{path}: cannot write it: {e.strerror or e}") from None
    return EditResult(path, True, backup)


def add(key: str, command: list[str], env: Env | None = None) -> EditResult:
    """Add (or replace) the convmem entry of host `key` with `command`."""
    return _edit(key, entry_for(spec(key), command), env)


def remove(key: str, env: Env | None = None) -> EditResult:
    """Remove the convmem entry of host `key` (nothing else)."""
    return _edit(key, None, env)
