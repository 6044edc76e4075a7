"""Which `claude_desktop_config.json` Claude Desktop really reads, for the note **Copy host
configuration** shows. The locations come from `convmem_app.hosts.locations` (one table for
host setup and this): on Windows the current installer's MSIX package reads its private copy
under `%LOCALAPPDATA%\\Packages\\Claude_<id>\\LocalCache\\Roaming\\Claude\\`, never the classic
`%APPDATA%\\Claude\\` file (which its Edit Config has opened on some versions)."""

from __future__ import annotations

from convmem_app.hosts.locations import Env, claude_desktop_msix_dirs, config_candidates


def paste_hint(env: Env | None = None) -> str:
    """One sentence naming the file to paste into (and, on Windows with both, the one not to)."""
    env = env or Env.current()
    candidates = config_candidates("claude-desktop", env)
    packaged_dirs = set(claude_desktop_msix_dirs(env)) if env.platform == "win32" else set()
    packaged = [p for p in candidates if p.parent in packaged_dirs]
    classic = [p for p in candidates if p.parent not in packaged_dirs]
    if packaged:
        text = f"Claude Desktop reads {packaged[0]}"
        if classic and classic[0].is_file():
            text += f" (not {classic[0]}, which only older versions read)"
        return text + "; other hosts: their MCP settings."
    return f"Claude Desktop reads {classic[0]}; other hosts: their MCP settings."
