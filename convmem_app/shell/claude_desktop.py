"""Where Claude Desktop reads its MCP server list, `claude_desktop_config.json`, so that **Copy
host configuration** can name the right file. Standard library only.

- Windows, current installer (an MSIX package, `Claude_<publisher id>`): the app runs with a
  virtualised AppData and reads
  `%LOCALAPPDATA%\\Packages\\Claude_<id>\\LocalCache\\Roaming\\Claude\\claude_desktop_config.json`;
  a file at the classic path is never read (its Settings → Developer → Edit Config has opened
  the classic path on some versions).
- Windows, older (Squirrel) installs: `%APPDATA%\\Claude\\claude_desktop_config.json`.
- macOS: `~/Library/Application Support/Claude/claude_desktop_config.json`.
- Linux (unofficial builds): `$XDG_CONFIG_HOME/Claude/claude_desktop_config.json`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

CONFIG_NAME = "claude_desktop_config.json"
PACKAGE_PREFIX = "Claude_"  # the package family name: Claude_pzs8sxrjxfjjc


@dataclass(frozen=True)
class ConfigFile:
    path: Path
    packaged: bool  # Windows: inside the MSIX package's private AppData

    @property
    def exists(self) -> bool:
        return self.path.is_file()


def config_files(
    platform: str = sys.platform,
    environ: Mapping[str, str] = os.environ,
    home: Path | None = None,
) -> list[ConfigFile]:
    """The config files Claude Desktop may read on this machine, the likeliest first: on
    Windows every installed package's file (there is normally one), then the classic one."""
    home = home or Path.home()
    if platform == "win32":
        local = Path(environ.get("LOCALAPPDATA") or home / "AppData" / "Local")
        roaming = Path(environ.get("APPDATA") or home / "AppData" / "Roaming")
        packages = local / "Packages"
        found = (
            sorted(p for p in packages.glob(PACKAGE_PREFIX + "*") if p.is_dir())
            if packages.is_dir()
            else []
        )
        packaged = [
            ConfigFile(p / "LocalCache" / "Roaming" / "Claude" / CONFIG_NAME, True) for p in found
        ]
        return [*packaged, ConfigFile(roaming / "Claude" / CONFIG_NAME, False)]
    if platform == "darwin":
        support = home / "Library" / "Application Support"
        return [ConfigFile(support / "Claude" / CONFIG_NAME, False)]
    config = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
    return [ConfigFile(config / "Claude" / CONFIG_NAME, False)]


def paste_hint(files: list[ConfigFile] | None = None) -> str:
    """One or two sentences for the "Host configuration copied" notification."""
    files = config_files() if files is None else files
    packaged = [f for f in files if f.packaged]
    classic = [f for f in files if not f.packaged]
    if packaged:
        text = f"Claude Desktop reads {packaged[0].path}"
        if classic and classic[0].exists:
            text += f" (not {classic[0].path}, which only older versions read)"
        return text + "; other hosts: their MCP settings."
    if classic:
        return f"Claude Desktop reads {classic[0].path}; other hosts: their MCP settings."
    return "Paste it into your LLM host's MCP settings."
