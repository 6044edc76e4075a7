""" "Start at login": off by default; when enabled, one per-user entry starts the app minimised.

Linux and other XDG desktops: `$XDG_CONFIG_HOME/autostart/convmem.desktop`.
Windows: the `ConvMem` value under `HKCU\\Software\\Microsoft\\Windows\\CurrentVersion\\Run`.
macOS: `~/Library/LaunchAgents/app.convmem.plist`.
Standard library only; nothing is written unless the user enables the setting.

The Windows registry sits behind a small seam (`RunKey`): `run_value` (the command line the Run
entry holds, quoted for Windows' CommandLineToArgvW rules) is tested everywhere, `WinregRunKey`
(the real HKCU key) by the tests marked `windows`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Protocol
from xml.sax.saxutils import escape

# The command an autostart entry runs is the one a shim runs: the app, minimised, for a data dir.
from convmem_app.shim.launcher import app_command

ENTRY_NAME = "ConvMem"
RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Run"


def desktop_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "autostart" / "convmem.desktop"


def launch_agent_file() -> Path:
    return Path.home() / "Library" / "LaunchAgents" / "app.convmem.plist"


def _desktop_exec(command: list[str]) -> str:
    # Desktop Entry "Exec": arguments quoted with double quotes; `\`, `"`, `` ` ``, `$` escaped
    # inside them, and a literal `%` doubled.
    def quote(arg: str) -> str:
        for ch in ("\\", '"', "`", "$"):
            arg = arg.replace(ch, "\\" + ch)
        return '"' + arg.replace("%", "%%") + '"'

    return " ".join(quote(arg) for arg in command)


def run_value(command: list[str]) -> str:
    """The Run entry's command line: Windows starts it with CreateProcess, and the program
    splits it back with the C runtime's (CommandLineToArgvW's) rules; `list2cmdline` quotes for
    exactly those. A REG_SZ value: `%` is not expanded."""
    return subprocess.list2cmdline(command)


class RunKey(Protocol):
    """`HKCU\\...\\Run`: one string value per program."""

    def set(self, name: str, value: str) -> None: ...
    def delete(self, name: str) -> None: ...  # no error when absent


class WinregRunKey:
    def set(self, name: str, value: str) -> None:
        import winreg

        with winreg.CreateKey(winreg.HKEY_CURRENT_USER, RUN_KEY) as key:  # type: ignore[attr-defined,unused-ignore]
            winreg.SetValueEx(key, name, 0, winreg.REG_SZ, value)  # type: ignore[attr-defined,unused-ignore]

    def delete(self, name: str) -> None:
        import winreg

        try:
            with winreg.OpenKey(  # type: ignore[attr-defined,unused-ignore]
                winreg.HKEY_CURRENT_USER,  # type: ignore[attr-defined,unused-ignore]
                RUN_KEY,
                0,
                winreg.KEY_SET_VALUE,  # type: ignore[attr-defined,unused-ignore]
            ) as key:
                winreg.DeleteValue(key, name)  # type: ignore[attr-defined,unused-ignore]
        except FileNotFoundError:
            pass


def enable(data_dir: Path, run_key: RunKey | None = None) -> None:
    command = app_command(data_dir)
    if sys.platform == "win32" or run_key is not None:
        (run_key or WinregRunKey()).set(ENTRY_NAME, run_value(command))
        return
    if sys.platform == "darwin":
        path = launch_agent_file()
        args = "".join(f"<string>{escape(arg)}</string>" for arg in command)
        text = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" '
            '"http://www.apple.com/DTDs/PropertyList-1.0.dtd">\n'
            '<plist version="1.0"><dict><key>Label</key><string>app.convmem</string>'
            f"<key>ProgramArguments</key><array>{args}</array>"
            "<key>RunAtLoad</key><true/></dict></plist>\n"
        )
    else:
        path = desktop_file()
        text = (
            "[Desktop Entry]\n"
            "Type=Application\n"
            "Name=ConvMem\n"
            "Comment=Conversation memory for LLM hosts\n"
            f"Exec={_desktop_exec(command)}\n"
            "Terminal=false\n"
            "X-GNOME-Autostart-enabled=true\n"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(text, encoding="utf-8")
    os.replace(temp, path)


def disable(run_key: RunKey | None = None) -> None:
    if sys.platform == "win32" or run_key is not None:
        (run_key or WinregRunKey()).delete(ENTRY_NAME)
        return
    path = launch_agent_file() if sys.platform == "darwin" else desktop_file()
    path.unlink(missing_ok=True)
