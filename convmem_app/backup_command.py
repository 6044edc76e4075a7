"""`convmem backup` and `convmem restore`: no Qt, safe while the app is running.

convmem backup  [--data-dir D] [--to FOLDER] [--single-file] [--keep N]
convmem backup  --verify BACKUP
convmem restore [--data-dir D] [--in-place] BACKUP
convmem repair  [--data-dir D]

A backup is copied while hosts keep writing (the app may be running), verified (opened as a
store, full self-check) and kept in FOLDER (default: `<data dir>-backups`), as a folder or,
with --single-file, one zip file. --keep N then deletes all but the N newest backups there.
Restore verifies first, then fills a new data dir or, with --in-place, renames the current data
dir aside (`<data dir>.before-restore-<time>`; never overwritten or deleted). Restore refuses
while the app runs on that data dir. Repair makes a store refused after a power cut (a damaged
record in active.log) open again: every record before the damage kept, the damaged files kept
aside (`<data dir>.before-repair-<time>`); it refuses while the app runs on that data dir and
changes nothing when cutting the log would not help. Exit status: 0 done, 1 failed, 2 usage.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from convmem_app.shim.paths import resolve_data_dir

_DATA_DIR_HELP = "store directory (default: $CONVMEM_DATA_DIR, else the per-user data folder)"


def _size(n: int) -> str:
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} bytes"


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _failed(command: str, error: Exception) -> int:
    """Say why `convmem COMMAND` failed (the engine's message, or the OS's), exit status 1."""
    from convmem_engine.domain.errors import ConvMemError

    if isinstance(error, ConvMemError):
        why = error.message
    else:
        why = getattr(error, "strerror", None) or str(error)
    print(f"convmem {command}: {why}", file=sys.stderr)
    return 1


def backup_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="convmem backup", description="Back up a data dir.")
    p.add_argument("--data-dir", help=_DATA_DIR_HELP)
    p.add_argument("--to", metavar="FOLDER", help="where to keep backups")
    p.add_argument("--single-file", action="store_true", help="one zip file, not a folder")
    p.add_argument("--keep", type=int, metavar="N", help="then keep only the N newest backups")
    p.add_argument("--verify", metavar="BACKUP", help="only verify an existing backup")
    args = p.parse_args(argv)
    if args.keep is not None and args.keep < 1:
        p.error("--keep: must be at least 1")
    from convmem_engine.domain.errors import ConvMemError
    from convmem_engine.transfer import (
        create_backup,
        default_backup_dir,
        prune_backups,
        verify_backup,
    )

    try:
        if args.verify:
            info = verify_backup(args.verify)
            print(
                f"backup OK: {info.messages} messages in {info.sessions} sessions, "
                f"made {_when(info.created_at)}, {_size(info.size)}: {info.path}"
            )
            return 0
        data_dir = resolve_data_dir(args.data_dir)
        dest = args.to or default_backup_dir(data_dir)
        info = create_backup(data_dir, dest, single_file=args.single_file)
        removed = prune_backups(dest, args.keep) if args.keep else []
    except (ConvMemError, OSError) as e:
        return _failed("backup", e)
    print(
        f"backup made and verified: {info.messages} messages in {info.sessions} sessions, "
        f"{_size(info.size)}, {_when(info.created_at)}: {info.path}"
    )
    for path in removed:
        print(f"removed old backup: {path}")
    return 0


def restore_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="convmem restore", description="Restore a backup.")
    p.add_argument("--data-dir", help=_DATA_DIR_HELP)
    p.add_argument(
        "--in-place",
        action="store_true",
        help="replace the data dir's store, keeping the current one aside",
    )
    p.add_argument("backup")
    args = p.parse_args(argv)
    from convmem_engine.domain.errors import ConvMemError
    from convmem_engine.transfer import restore_backup

    data_dir = resolve_data_dir(args.data_dir)
    try:
        info, aside = restore_backup(args.backup, data_dir, in_place=args.in_place)
    except (ConvMemError, OSError) as e:
        return _failed("restore", e)
    print(f"restored {info.messages} messages in {info.sessions} sessions into {data_dir}")
    if aside:
        print(f"the previous store is kept at {aside}")
    return 0


def repair_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="convmem repair",
        description="Make a store refused after a power cut open again (a damaged record in "
        "active.log): every record before the damage is kept, the damaged files are kept aside.",
    )
    p.add_argument("--data-dir", help=_DATA_DIR_HELP)
    args = p.parse_args(argv)
    from convmem_engine.domain.errors import ConvMemError
    from convmem_engine.transfer import repair_store

    data_dir = resolve_data_dir(args.data_dir)
    try:
        report = repair_store(data_dir)
    except (ConvMemError, OSError) as e:
        return _failed("repair", e)
    if report.offset is None:
        print(f"the store opens: nothing to repair ({report.messages} messages in {data_dir})")
        return 0
    print(
        f"repaired: active.log cut at offset {report.offset} ({_size(report.cut_bytes)} cut off); "
        f"{report.messages} messages in {data_dir}"
    )
    print(f"the damaged files are kept at {report.aside}")
    return 0
