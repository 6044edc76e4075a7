"""Host setup against real config files of every host: comments, unknown keys, other servers,
CRLF, BOM, stale entries, broken files, symlinks, the MSIX location. Never the real home."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from convmem_app.hosts import Env, HostConfigError, add, jsonc, remove, status
from convmem_app.hosts.configure import BACKUP_INFIX, current_entry
from convmem_app.hosts.locations import config_path, spec

FIXTURES = Path(__file__).parent / "fixtures"
SHIM = ["/opt/convmem/bin/convmem-shim", "--data-dir", "/home/ada/.local/share/convmem"]


def linux_env(home: Path) -> Env:
    return Env(home, {"PATH": ""}, "linux")


def place(env: Env, key: str, fixture: str, *, crlf: bool = False, bom: bool = False) -> Path:
    path = config_path(key, env)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = (FIXTURES / fixture).read_bytes()
    if crlf:
        raw = raw.replace(b"\n", b"\r\n")
    if bom:
        raw = b"\xef\xbb\xbf" + raw
    path.write_bytes(raw)
    return path


def load(key: str, path: Path) -> Any:
    text = path.read_bytes().decode("utf-8").removeprefix("\ufeff")
    if key == "codex":
        return tomllib.loads(text)
    return jsonc.parse(text, comments=key == "vscode").value


CASES = [
    ("claude-desktop", "claude_desktop_config.json"),
    ("claude-code", "claude.json"),
    ("cursor", "cursor_mcp.json"),
    ("vscode", "vscode_mcp.json"),
    ("codex", "codex_config.toml"),
]


@pytest.mark.parametrize(("key", "fixture"), CASES)
@pytest.mark.parametrize("style", ["lf", "crlf+bom"])
def test_add_changes_only_our_entry_and_remove_restores_the_file(
    tmp_path: Path, key: str, fixture: str, style: str
) -> None:
    env = linux_env(tmp_path)
    path = place(env, key, fixture, crlf=style != "lf", bom=style != "lf")
    original = path.read_bytes()
    before = load(key, path)
    assert status(key, SHIM, env).state == "not-configured"

    result = add(key, SHIM, env)
    assert result.changed and result.backup is not None
    assert result.backup.read_bytes() == original  # backed up first, next to it
    assert result.backup.name.startswith(path.name + BACKUP_INFIX)
    assert status(key, SHIM, env).state == "configured"
    after = load(key, path)
    servers_key = spec(key).servers_key
    entry = after[servers_key].pop("convmem")
    assert entry["command"] == SHIM[0] and entry["args"] == SHIM[1:]
    assert after == before  # every other key, server and value is as it was
    raw = path.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf") == (style != "lf")
    if style != "lf":
        assert b"\n" not in raw.replace(b"\r\n", b"")  # line endings kept
    assert raw.startswith(original[: original.index(b"{") + 1] if key != "codex" else original[:20])
    assert add(key, SHIM, env).changed is False  # idempotent

    removed = remove(key, env)
    assert removed.changed
    assert path.read_bytes() == original  # byte for byte: formatting and comments kept
    assert status(key, SHIM, env).state == "not-configured"
    assert remove(key, env).changed is False


def test_comments_and_trailing_commas_survive_in_vscode(tmp_path: Path) -> None:
    env = linux_env(tmp_path)
    path = place(env, "vscode", "vscode_mcp.json")
    add("vscode", SHIM, env)
    text = path.read_text(encoding="utf-8")
    for kept in ("// 💡 Inputs are prompted", "/* Perplexity search */", "// GitHub's hosted"):
        assert kept in text
    assert load("vscode", path)["servers"]["convmem"]["type"] == "stdio"


def test_a_stale_entry_is_reported_and_replaced_in_place(tmp_path: Path) -> None:
    env = linux_env(tmp_path)
    path = place(env, "windsurf", "windsurf_mcp_config.json")
    st = status("windsurf", SHIM, env)
    assert (st.state, st.detail) == (
        "stale",
        "its command no longer exists (was the install moved?)",
    )
    add("windsurf", SHIM, env)
    data = load("windsurf", path)
    assert list(data["mcpServers"]) == ["convmem", "brave-search"]  # same place, same order
    assert data["mcpServers"]["convmem"] == {"command": SHIM[0], "args": SHIM[1:]}
    assert status("windsurf", SHIM, env).state == "configured"
    add("windsurf", [sys.executable, "--data-dir", "/elsewhere"], env)
    assert status("windsurf", SHIM, env).detail == (
        "it runs another command or data dir than this install"
    )


def test_an_unparseable_file_is_refused_saying_where_and_left_alone(tmp_path: Path) -> None:
    env = linux_env(tmp_path)
    path = place(env, "cursor", "broken_trailing_comma.json")
    original = path.read_bytes()
    with pytest.raises(HostConfigError) as err:
        add("cursor", SHIM, env)
    assert str(err.value) == (
        f"{path}: does not parse: a trailing comma (not allowed in this JSON file) "
        "at line 4, column 3"
    )
    st = status("cursor", SHIM, env)
    assert st.state == "unreadable" and "line 4, column 3" in st.detail
    assert path.read_bytes() == original
    assert os.listdir(path.parent) == [path.name]  # no backup, no temp file
    path.write_text('{"mcpServers": {"a": 1} // note\n}', encoding="utf-8")
    with pytest.raises(
        HostConfigError, match=r"a comment .not allowed in this JSON file. at line 1"
    ):
        add("cursor", SHIM, env)
    bad_toml = place(env, "codex", "codex_config.toml")
    bad_toml.write_text('model = "o3"\n[mcp_servers\n', encoding="utf-8")
    with pytest.raises(HostConfigError, match=r"not valid TOML: .*line 2"):
        add("codex", SHIM, env)


def test_codex_inline_table_is_refused_not_guessed(tmp_path: Path) -> None:
    env = linux_env(tmp_path)
    path = config_path("codex", env)
    path.parent.mkdir(parents=True)
    path.write_text('mcp_servers = { convmem = { command = "x" } }\n', encoding="utf-8")
    with pytest.raises(HostConfigError, match="cannot edit"):
        add("codex", SHIM, env)
    assert path.read_text(encoding="utf-8") == 'mcp_servers = { convmem = { command = "x" } }\n'


def test_new_files_and_missing_hosts(tmp_path: Path) -> None:
    env = linux_env(tmp_path)
    with pytest.raises(HostConfigError, match="Cursor: not found on this computer"):
        add("cursor", SHIM, env)
    (tmp_path / ".cursor").mkdir()
    res = add("cursor", SHIM, env)
    assert res.changed and res.backup is None
    assert json.loads(res.path.read_text(encoding="utf-8")) == {
        "mcpServers": {"convmem": {"command": SHIM[0], "args": SHIM[1:]}}
    }
    if os.name != "nt":
        assert res.path.stat().st_mode & 0o777 == 0o600
    (tmp_path / ".codex").mkdir()
    add("codex", SHIM, env)
    assert tomllib.loads(config_path("codex", env).read_text(encoding="utf-8")) == {
        "mcp_servers": {"convmem": {"command": SHIM[0], "args": SHIM[1:]}}
    }


@pytest.mark.posix  # symlinks need privileges on Windows
def test_a_symlinked_config_is_edited_at_its_target(tmp_path: Path) -> None:
    env = linux_env(tmp_path)
    dotfiles = tmp_path / "dotfiles" / "mcp.json"
    dotfiles.parent.mkdir()
    shutil.copy(FIXTURES / "cursor_mcp.json", dotfiles)
    (tmp_path / ".cursor").mkdir()
    link = tmp_path / ".cursor" / "mcp.json"
    link.symlink_to(dotfiles)
    add("cursor", SHIM, env)
    assert link.is_symlink()
    assert "convmem" in json.loads(dotfiles.read_text(encoding="utf-8"))["mcpServers"]


def test_claude_desktop_locations_classic_and_msix(tmp_path: Path) -> None:
    local, roaming = tmp_path / "AppData" / "Local", tmp_path / "AppData" / "Roaming"
    env = Env(tmp_path, {"LOCALAPPDATA": str(local), "APPDATA": str(roaming)}, "win32")
    assert config_path("claude-desktop", env) == roaming / "Claude" / "claude_desktop_config.json"
    msix = local / "Packages" / "Claude_pzs8sxrjxfjjc" / "LocalCache" / "Roaming" / "Claude"
    msix.mkdir(parents=True)
    assert config_path("claude-desktop", env) == msix / "claude_desktop_config.json"
    assert status("claude-desktop", SHIM, env).installed
    mac = Env(tmp_path, {}, "darwin")
    assert config_path("claude-desktop", mac) == (
        tmp_path / "Library" / "Application Support" / "Claude" / "claude_desktop_config.json"
    )
    assert config_path("vscode", mac).parts[-3:] == ("Code", "User", "mcp.json")
    assert config_path("codex", Env(tmp_path, {"CODEX_HOME": "/x/codex"}, "linux")) == Path(
        "/x/codex/config.toml"
    )


def test_hosts_command_end_to_end(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".cursor").mkdir(parents=True)
    shutil.copy(FIXTURES / "claude.json", home / ".claude.json")
    env = {
        **os.environ,
        "HOME": str(home),
        "USERPROFILE": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "APPDATA": str(home / "AppData" / "Roaming"),
        "LOCALAPPDATA": str(home / "AppData" / "Local"),
        "PATH": os.path.dirname(sys.executable),
    }
    env.pop("CODEX_HOME", None)

    def hosts(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "convmem_app",
                "hosts",
                *args,
                "--data-dir",
                str(tmp_path / "d"),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )

    listed = hosts("list")
    assert listed.returncode == 0, listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines() if line[:1] != " "}
    assert "installed" in lines["cursor"] and "not configured" in lines["cursor"]
    assert "not found" in lines["windsurf"]
    added = hosts("add", "all")
    assert added.returncode == 0, added.stderr
    assert "cursor: convmem added to" in added.stdout
    assert "claude-code: convmem added to" in added.stdout
    assert "previous version kept as" in added.stdout
    assert "windsurf" not in added.stdout  # not installed: left alone
    listed = hosts("list")
    assert " configured " in next(
        ln for ln in listed.stdout.splitlines() if ln.startswith("cursor")
    )
    code = json.loads((home / ".claude.json").read_text(encoding="utf-8"))
    assert code["mcpServers"]["convmem"]["args"][-1] == str(Path(os.path.realpath(tmp_path / "d")))
    assert code["projects"]["/home/ada/src/engine"]["hasTrustDialogAccepted"] is True
    removed = hosts("remove", "claude-code")
    assert removed.returncode == 0 and "removed from" in removed.stdout
    assert current_entry(spec("claude-code"), home / ".claude.json") is None
    usage = hosts("add")
    assert usage.returncode == 2
