"""Copy host configuration names the file Claude Desktop really reads: on Windows the packaged
(MSIX) app's private copy when that app is installed, else the classic path; macOS and Linux
have one place each. Real folders laid out as each install leaves them."""

from __future__ import annotations

from pathlib import Path

from convmem_app.hosts.locations import Env
from convmem_app.shell.claude_desktop import paste_hint

NAME = "claude_desktop_config.json"


def windows(tmp_path: Path) -> Env:
    local = tmp_path / "AppData" / "Local"
    (local / "Packages" / "Microsoft.WindowsCalculator_8wekyb3d8bbwe").mkdir(parents=True)
    (tmp_path / "AppData" / "Roaming").mkdir(parents=True)
    environ = {"LOCALAPPDATA": str(local), "APPDATA": str(tmp_path / "AppData" / "Roaming")}
    return Env(tmp_path, environ, "win32")


def test_classic_windows_install(tmp_path: Path) -> None:
    classic = tmp_path / "AppData" / "Roaming" / "Claude" / NAME
    assert paste_hint(windows(tmp_path)) == (
        f"Claude Desktop reads {classic}; other hosts: their MCP settings."
    )


def test_the_packaged_windows_install_is_named(tmp_path: Path) -> None:
    env = windows(tmp_path)
    private = env.local_appdata / "Packages/Claude_pzs8sxrjxfjjc/LocalCache/Roaming/Claude"
    private.mkdir(parents=True)
    assert paste_hint(env) == (
        f"Claude Desktop reads {private / NAME}; other hosts: their MCP settings."
    )
    # A classic file left over (or opened by "Edit Config") is named as the wrong one.
    classic = env.appdata / "Claude" / NAME
    classic.parent.mkdir(parents=True)
    classic.write_text("{}")
    assert f"(not {classic}, which only older versions read)" in paste_hint(env)


def test_macos_and_linux(tmp_path: Path) -> None:
    mac = tmp_path / "Library" / "Application Support" / "Claude" / NAME
    assert paste_hint(Env(tmp_path, {}, "darwin")).startswith(f"Claude Desktop reads {mac};")
    linux = Env(tmp_path, {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}, "linux")
    assert paste_hint(linux).startswith(f"Claude Desktop reads {tmp_path / 'cfg/Claude' / NAME};")
