"""`convmem export` and `convmem import`: synchronous, durable when they exit, no Qt.

convmem export [--data-dir D] --format jsonl|markdown [--session ID] OUT
convmem import [--data-dir D] [--dry-run] [--format chatgpt|claude|memory-json|jsonl] FILE

Both take the data dir's lock (the app must not be running on it; the app has the same
commands in its browser), except a dry run, which reads a temporary copy of the store and so
never creates or changes anything and also works while the app runs. Import creates the data
dir when it does not exist. Exit status: 0 done, 1 the file or the store failed, 2 usage.
"""

from __future__ import annotations

import argparse
import os
import sys

from convmem_app.shim.paths import resolve_data_dir

_DATA_DIR_HELP = "store directory (default: $CONVMEM_DATA_DIR, else the per-user data folder)"


def _export_parser() -> argparse.ArgumentParser:
    from convmem_engine.transfer import EXPORT_FORMATS

    p = argparse.ArgumentParser(
        prog="convmem export",
        description="Export memories: JSONL (lossless, one file) or Markdown (a file a session).",
    )
    p.add_argument("--data-dir", help=_DATA_DIR_HELP)
    p.add_argument("--format", required=True, choices=EXPORT_FORMATS)
    p.add_argument("--session", help="export only this session")
    p.add_argument("out", help="the JSONL file, or the folder for Markdown")
    return p


def _import_parser() -> argparse.ArgumentParser:
    from convmem_engine.transfer import FORMATS

    p = argparse.ArgumentParser(
        prog="convmem import",
        description=(
            "Import ConvMem JSONL, ChatGPT or Claude conversations.json (or their export zip), "
            "or the MCP memory server's memory.json. The format is detected from the content."
        ),
    )
    p.add_argument("--data-dir", help=_DATA_DIR_HELP)
    p.add_argument("--dry-run", action="store_true", help="only count and check; change nothing")
    p.add_argument("--format", choices=FORMATS, help="force the format instead of detecting it")
    p.add_argument("file")
    return p


def _fail(what: str, message: str) -> int:
    print(f"convmem {what}: {message}", file=sys.stderr)
    return 1


def _store_error(what: str, error: Exception) -> int:
    from convmem_engine.domain.errors import BusyError, ConvMemError

    assert isinstance(error, ConvMemError)
    hint = ""
    if isinstance(error, BusyError):
        menu = "Export" if what == "export" else "Import"
        hint = f"; quit the app first, or use File > {menu} in its memory browser"
    return _fail(what, error.message + hint)


def export_main(argv: list[str]) -> int:
    args = _export_parser().parse_args(argv)
    from convmem_engine.domain.errors import ConvMemError
    from convmem_engine.service import MemoryService
    from convmem_engine.transfer import export_jsonl, export_markdown

    data_dir = resolve_data_dir(args.data_dir)
    if not os.path.isdir(data_dir):
        return _fail("export", "data dir: does not exist")
    try:
        with MemoryService.open(data_dir) as service:
            run = export_jsonl if args.format == "jsonl" else export_markdown
            report = run(service, args.out, session_id=args.session)
    except ConvMemError as e:
        return _store_error("export", e)
    except OSError as e:
        return _fail("export", f"cannot write the output: {e.strerror or e}")
    noun = "file" if report.files == 1 else "files"
    print(
        f"exported {report.messages} messages of {report.sessions} sessions "
        f"({report.format}, {report.files} {noun}) to {report.path}"
    )
    return 0


def import_main(argv: list[str]) -> int:
    args = _import_parser().parse_args(argv)
    from convmem_engine.domain.errors import ConvMemError
    from convmem_engine.service import MemoryService
    from convmem_engine.transfer import run_import
    from convmem_engine.transfer.backup import open_copy

    data_dir = resolve_data_dir(args.data_dir)
    if not os.path.isfile(args.file):
        return _fail("import", "file: does not exist or is not a file")
    try:
        if args.dry_run and not os.path.isdir(data_dir):
            report = run_import(args.file, service=None, fmt=args.format, dry_run=True)
        elif args.dry_run:  # on a copy: changes nothing, works while the app runs
            with open_copy(data_dir) as service:
                report = run_import(args.file, service=service, fmt=args.format, dry_run=True)
        else:
            with MemoryService.open(data_dir) as service:
                report = run_import(
                    args.file, service=service, fmt=args.format, dry_run=args.dry_run
                )
    except ConvMemError as e:
        return _store_error("import", e)
    except OSError as e:
        return _fail("import", f"cannot read the file: {e.strerror or e}")
    verb = "would store" if report.dry_run else "stored"
    print(
        f"{report.format}: {verb} {report.messages} messages in {report.conversations} "
        f"conversations; skipped {report.skipped_total}"
    )
    for reason, count in report.skipped.most_common():
        print(f"  skipped {count}: {reason}")
    for p in report.problems:
        print(f"  {p.position}: {p.reason}")
    if report.skipped_total > len(report.problems) and report.problems:
        print(f"  (positions listed for the first {len(report.problems)} problems)")
    return 0
