"""`convmem <command>`: one entry point, each command imported only when chosen.

convmem serve  [--data-dir DIR] [--log-level L]   MCP on stdio, headless, no Qt
convmem app    [--data-dir DIR] [--minimized]     the tray app and memory browser
convmem shim   [--data-dir DIR]                   stdio <-> the app's local pipe
convmem export [--data-dir DIR] --format jsonl|markdown [--session ID] OUT
convmem import [--data-dir DIR] [--dry-run] [--format F] FILE   ChatGPT, Claude, memory.json, JSONL
convmem backup [--data-dir DIR] [--to FOLDER] [--single-file] [--keep N] | --verify BACKUP
convmem restore [--data-dir DIR] [--in-place] BACKUP
convmem repair [--data-dir DIR]                   a store refused after a power cut opens again
convmem hosts  [list|add|remove] [HOST] [--data-dir DIR]   connect Claude, Cursor, Codex...
"""

from __future__ import annotations

import sys

USAGE = __doc__ or ""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help", "help"}:
        print(USAGE.strip())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "serve":
        from convmem_app.shim.paths import resolve_data_dir
        from convmem_engine.runtime import serve_cli

        return serve_cli.main(rest, resolve_data_dir=resolve_data_dir)
    if command == "app":
        from convmem_app.shell import app

        return app.main(rest)
    if command == "shim":
        from convmem_app.shim import launcher as shim

        return shim.main(rest)
    if command in ("export", "import"):
        from convmem_app import transfer_command

        run = transfer_command.export_main if command == "export" else transfer_command.import_main
        return run(rest)
    if command == "hosts":
        from convmem_app import hosts_command

        return hosts_command.main(rest)
    if command in ("backup", "restore", "repair"):
        from convmem_app import backup_command

        run = {
            "backup": backup_command.backup_main,
            "restore": backup_command.restore_main,
            "repair": backup_command.repair_main,
        }[command]
        return run(rest)
    print(f"convmem: unknown command {command!r}\n\n{USAGE.strip()}", file=sys.stderr)
    return 2


def app_main() -> int:
    """Entry point of the `convmem-app` GUI script."""
    return main(["app", *sys.argv[1:]])
