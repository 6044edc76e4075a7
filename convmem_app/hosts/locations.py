"""Where each LLM host keeps its MCP server configuration. Standard library only, no Qt.

One table, shared by host setup (`convmem hosts`, the welcome page) and the Windows shim work
(packaged MSIX installs of Claude Desktop keep their files in a redirected folder). Every path
is derived from an `Env` (home folder, environment, platform) so tests can point it anywhere.

Claude Desktop: `claude_desktop_config.json`, key `mcpServers`, JSON. macOS
  `~/Library/Application Support/Claude/`; Windows `%APPDATA%\\Claude\\` (classic installer) or
  `%LOCALAPPDATA%\\Packages\\Claude_<id>\\LocalCache\\Roaming\\Claude\\` (the MSIX package: its
  writes to %APPDATA% are redirected there); Linux `$XDG_CONFIG_HOME/Claude/` (community builds).
Claude Code: `~/.claude.json` (user scope; same as `claude mcp add --scope user`), `mcpServers`.
Cursor: `~/.cursor/mcp.json`, `mcpServers`.
Codex: `$CODEX_HOME/config.toml`, default `~/.codex/config.toml`, tables `[mcp_servers.<name>]`.
VS Code: the user `mcp.json` (Windows `%APPDATA%\\Code\\User\\`, macOS
  `~/Library/Application Support/Code/User/`, Linux `$XDG_CONFIG_HOME/Code/User/`), key
  `servers` with `"type": "stdio"`; JSON with comments and trailing commas.
Windsurf: `~/.codeium/windsurf/mcp_config.json`, `mcpServers`.

A host counts as installed when its configuration folder exists (or its CLI is on PATH for the
CLI hosts); the file itself may not exist yet.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

Format = Literal["json", "jsonc", "toml"]
SERVER_NAME: Final = "convmem"


@dataclass(frozen=True)
class Env:
    home: Path
    environ: Mapping[str, str]
    platform: str  # sys.platform: "win32", "darwin", "linux"

    @classmethod
    def current(cls) -> Env:
        return cls(Path.home(), dict(os.environ), sys.platform)

    def var(self, name: str, default: Path) -> Path:
        value = self.environ.get(name)
        return Path(value) if value else default

    @property
    def appdata(self) -> Path:  # Windows roaming
        return self.var("APPDATA", self.home / "AppData" / "Roaming")

    @property
    def local_appdata(self) -> Path:
        return self.var("LOCALAPPDATA", self.home / "AppData" / "Local")

    @property
    def mac_support(self) -> Path:
        return self.home / "Library" / "Application Support"

    @property
    def xdg_config(self) -> Path:
        return self.var("XDG_CONFIG_HOME", self.home / ".config")

    def which(self, name: str) -> str | None:
        return shutil.which(name, path=self.environ.get("PATH", ""))


@dataclass(frozen=True)
class HostSpec:
    key: str  # the CLI name: claude-desktop, claude-code, cursor, codex, vscode, windsurf
    title: str
    format: Format
    servers_key: str  # "mcpServers", "servers", or "mcp_servers" (TOML table)
    cli: str | None = None  # a command whose presence means the host is installed


HOSTS: Final = (
    HostSpec("claude-desktop", "Claude Desktop", "json", "mcpServers"),
    HostSpec("claude-code", "Claude Code", "json", "mcpServers", cli="claude"),
    HostSpec("cursor", "Cursor", "json", "mcpServers", cli="cursor"),
    HostSpec("codex", "Codex", "toml", "mcp_servers", cli="codex"),
    HostSpec("vscode", "VS Code", "jsonc", "servers", cli="code"),
    HostSpec("windsurf", "Windsurf", "json", "mcpServers", cli="windsurf"),
)
HOST_KEYS: Final = tuple(h.key for h in HOSTS)


def spec(key: str) -> HostSpec:
    for h in HOSTS:
        if h.key == key:
            return h
    raise KeyError(key)


def claude_desktop_msix_dirs(env: Env) -> list[Path]:
    """Claude Desktop's redirected config folders of MSIX (packaged) installs, newest first."""
    pattern = str(env.local_appdata / "Packages" / "Claude_*" / "LocalCache" / "Roaming" / "Claude")
    found = [Path(p) for p in glob.glob(pattern)]
    return sorted(found, key=lambda p: p.stat().st_mtime if p.exists() else 0, reverse=True)


def config_candidates(key: str, env: Env) -> list[Path]:
    """The config files a host may use on this platform, the preferred one first."""
    if key == "claude-desktop":
        name = "claude_desktop_config.json"
        if env.platform == "win32":
            return [d / name for d in claude_desktop_msix_dirs(env)] + [
                env.appdata / "Claude" / name
            ]
        if env.platform == "darwin":
            return [env.mac_support / "Claude" / name]
        return [env.xdg_config / "Claude" / name]
    if key == "claude-code":
        return [env.home / ".claude.json"]
    if key == "cursor":
        return [env.home / ".cursor" / "mcp.json"]
    if key == "codex":
        return [env.var("CODEX_HOME", env.home / ".codex") / "config.toml"]
    if key == "vscode":
        if env.platform == "win32":
            base = env.appdata
        elif env.platform == "darwin":
            base = env.mac_support
        else:
            base = env.xdg_config
        return [base / "Code" / "User" / "mcp.json"]
    if key == "windsurf":
        return [env.home / ".codeium" / "windsurf" / "mcp_config.json"]
    raise KeyError(key)


def config_path(key: str, env: Env) -> Path:
    """The file to read and edit: the first candidate that exists, else the first whose folder
    exists, else the preferred one."""
    candidates = config_candidates(key, env)
    for p in candidates:
        if p.is_file():
            return p
    for p in candidates:
        if p.parent.is_dir():
            return p
    return candidates[0]


def installed(key: str, env: Env) -> bool:
    """The host looks installed: its config file or folder exists, or its CLI is on PATH."""
    path = config_path(key, env)
    if key == "claude-code":
        found = path.is_file() or (env.home / ".claude").is_dir()
    else:
        found = path.is_file() or path.parent.is_dir()
    cli = spec(key).cli
    return found or (cli is not None and env.which(cli) is not None)
