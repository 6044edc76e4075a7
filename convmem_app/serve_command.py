"""`convmem serve [--data-dir DIR] [--log-level L]`: MCP on stdin/stdout, headless, no Qt.

Takes the data-dir lock itself; when another process holds it, prints one line on stderr and
exits with status 2. Logs go to stderr and never contain message content.
"""

from __future__ import annotations

import argparse

from convmem_app.shim.paths import resolve_data_dir

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="convmem serve",
        description="Serve ConvMem's memory tools over MCP on stdin/stdout.",
    )
    parser.add_argument(
        "--data-dir",
        help="store directory (default: $CONVMEM_DATA_DIR, else the per-user data folder)",
    )
    parser.add_argument(
        "--log-level",
        default="WARNING",
        type=str.upper,
        choices=LOG_LEVELS,
        help="stderr log level (default: WARNING)",
    )
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from convmem_engine.mcp import run_stdio

    return run_stdio(resolve_data_dir(args.data_dir), log_level=args.log_level)
