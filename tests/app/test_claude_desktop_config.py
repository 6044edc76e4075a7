"""Copy host configuration names the file Claude Desktop really reads: on Windows the packaged
(MSIX) app's private copy when that app is installed, else the classic path; macOS and Linux
have one place each. Real folders laid out as each install leaves them."""

from __future__ import annotations

from pathlib import Path

from convmem_app.shell.claude_desktop import CONFIG_NAME, ConfigFile, config_files, paste_hint


def windows_profile(tmp_path: Path) -> dict[str, str]:
    local = tmp_path / "AppData" / "Local"
    roaming = tmp_path / "AppData" / "Roaming"
    (local / "Packages" / "Microsoft.WindowsCalculator_8wekyb3d8bbwe").mkdir(parents=True)
    roaming.mkdir(parents=True)
    return {"LOCALAPPDATA": str(local), "APPDATA": str(roaming)}


def test_classic_windows_install(tmp_path: Path) -> None:
    env = windows_profile(tmp_path)
    files = config_files("win32", env, tmp_path)
    classic = Path(env["APPDATA"]) / "Claude" / CONFIG_NAME
    assert files == [ConfigFile(classic, packaged=False)]
    assert paste_hint(files).startswith(f"Claude Desktop reads {classic};")


def test_packaged_windows_install_comes_first(tmp_path: Path) -> None:
    env = windows_profile(tmp_path)
    package = Path(env["LOCALAPPDATA"]) / "Packages" / "Claude_pzs8sxrjxfjjc"
    private = package / "LocalCache" / "Roaming" / "Claude"
    private.mkdir(parents=True)
    files = config_files("win32", env, tmp_path)
    assert files[0] == ConfigFile(private / CONFIG_NAME, packaged=True)
    assert files[1] == ConfigFile(Path(env["APPDATA"]) / "Claude" / CONFIG_NAME, packaged=False)
    assert paste_hint(files) == (
        f"Claude Desktop reads {private / CONFIG_NAME}; other hosts: their MCP settings."
    )
    # A classic file left over (or opened by "Edit Config") is named as the wrong one.
    classic = Path(env["APPDATA"]) / "Claude" / CONFIG_NAME
    classic.parent.mkdir(parents=True)
    classic.write_text("{}")
    assert f"(not {classic}, which only older versions read)" in paste_hint(files)


def test_without_environment_variables_the_profile_folders_are_used(tmp_path: Path) -> None:
    files = config_files("win32", {}, tmp_path)
    assert files == [ConfigFile(tmp_path / "AppData/Roaming/Claude" / CONFIG_NAME, False)]


def test_macos_and_linux(tmp_path: Path) -> None:
    mac = config_files("darwin", {}, tmp_path)
    assert mac == [ConfigFile(tmp_path / "Library/Application Support/Claude" / CONFIG_NAME, False)]
    linux = config_files("linux", {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}, tmp_path)
    assert linux == [ConfigFile(tmp_path / "cfg" / "Claude" / CONFIG_NAME, False)]
    assert paste_hint([]) == "Paste it into your LLM host's MCP settings."
