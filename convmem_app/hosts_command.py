"""`convmem hosts [list|add|remove] [HOST] [--data-dir D]`: connect LLM hosts. No Qt.

list (default)  every known host: installed or not, its config file, and whether ConvMem is
                configured there (configured / not configured / stale / unreadable)
add HOST        add or replace the `convmem` entry: this install's shim and the data dir
remove HOST     remove the `convmem` entry
HOST is one of: claude-desktop, claude-code, cursor, codex, vscode, windsurf (or "all" for
add/remove: every installed host). The file is backed up next to itself before each change.
Restart the host afterwards. Exit status: 0 done, 1 a file could not be edited, 2 usage.
"""

from __future__ import annotations

import argparse
import sys

from convmem_app.shim.paths import resolve_data_dir

_STATE_TEXT = {
    "configured": "configured",
    "not-configured": "not configured",
    "stale": "configured with a stale path",
    "unreadable": "config file does not parse",
}


def main(argv: list[str]) -> int:
    from convmem_app.hosts import HOST_KEYS

    p = argparse.ArgumentParser(prog="convmem hosts", description="Connect LLM hosts.")
    p.add_argument("action", nargs="?", default="list", choices=("list", "add", "remove"))
    p.add_argument("host", nargs="?", choices=(*HOST_KEYS, "all"))
    p.add_argument("--data-dir", help="the data dir the hosts should use (default: the usual)")
    args = p.parse_args(argv)
    if args.action != "list" and args.host is None:
        p.error(f"{args.action}: which host? one of {', '.join(HOST_KEYS)}, or all")
    from convmem_app.hosts import HostConfigError, add, remove, shim_command, status

    command = shim_command(resolve_data_dir(args.data_dir))
    keys = list(HOST_KEYS) if args.host in (None, "all") else [args.host]
    if args.action == "list":
        for key in keys:
            st = status(key, command)
            found = "installed" if st.installed else "not found"
            line = f"{key:15s} {found:10s} {_STATE_TEXT[st.state]:30s} {st.path}"
            print(line + (f"\n{'':15s} {st.detail}" if st.detail else ""))
        return 0
    code = 0
    for key in keys:
        if args.host == "all" and not status(key, command).installed:
            continue
        try:
            result = add(key, command) if args.action == "add" else remove(key)
        except HostConfigError as e:
            print(f"convmem hosts: {key}: {e}", file=sys.stderr)
            code = 1
            continue
        if not result.changed:
            done = "already configured" if args.action == "add" else "not configured"
            print(f"{key}: {done}; {result.path} unchanged")
            continue
        verb = "added to" if args.action == "add" else "removed from"
        print(f"{key}: convmem {verb} {result.path}")
        if result.backup is not None:
            print(f"{'':{len(key) + 2}}previous version kept as {result.backup}")
    if code == 0 and args.action == "add":
        print("Restart the host(s), then ask your model to remember something.")
    return code
