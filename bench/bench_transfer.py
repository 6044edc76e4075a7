"""Import and export speed on large generated exports (>= 100k messages each).

Builds, in a temp dir, a ChatGPT conversations.json and a Claude conversations.json of
--messages messages each (from the documented formats, tests/transfer/export_samples.py),
then measures into a fresh store: the dry run, the import, a re-import (all found, nothing
stored), a JSONL export and the JSONL import of that export into another fresh store.
Each figure is printed in messages/s next to its peer: the same messages written one by one
through `write_message` (what a host would do), so the ratio is what batching buys.

Usage: python bench/bench_transfer.py [--messages N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(
    0,
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "transfer"),
)

from export_samples import chatgpt_export, claude_export, write_json

from convmem_engine.service import MemoryService
from convmem_engine.transfer import export_jsonl, run_import

PEER_MESSAGES = 3000


def timed(fn: Callable[..., object], *args: object, **kw: object) -> tuple[float, object]:
    t0 = time.perf_counter()
    result = fn(*args, **kw)
    return time.perf_counter() - t0, result


def peer_rate(folder: str) -> float:
    """Messages/s of write_message, one durable call a message."""
    with MemoryService.open(os.path.join(folder, "peer")) as svc:
        t0 = time.perf_counter()
        for i in range(PEER_MESSAGES):
            svc.write_message(session_id=f"s{i // 50}", role="user", content=f"message {i} " * 8)
        return PEER_MESSAGES / (time.perf_counter() - t0)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--dir")
    args = parser.parse_args()
    folder = args.dir or tempfile.mkdtemp(prefix="convmem-bench-transfer-")
    try:
        per = 25
        convs = -(-args.messages // per)
        peer = peer_rate(folder)
        print(f"peer: write_message one by one: {peer:,.0f} messages/s")
        rows: list[tuple[str, int, float]] = []
        for name, build in (("chatgpt", chatgpt_export), ("claude", claude_export)):
            src = os.path.join(folder, f"{name}.json")
            write_json(src, build(convs, per))
            size = os.path.getsize(src)
            data = os.path.join(folder, f"data-{name}")
            with MemoryService.open(data) as svc:
                t, r = timed(run_import, src, service=svc, dry_run=True)
                rows.append((f"{name} dry run", r.messages, t))  # type: ignore[attr-defined]
                t, r = timed(run_import, src, service=svc)
                n = r.messages  # type: ignore[attr-defined]
                assert n == convs * per, n
                rows.append((f"{name} import ({size / 1e6:.0f} MB file)", n, t))
                t, r = timed(run_import, src, service=svc)
                assert r.messages == 0  # type: ignore[attr-defined]
                rows.append((f"{name} re-import (nothing new)", n, t))
                if name == "chatgpt":
                    out = os.path.join(folder, "export.jsonl")
                    t, r = timed(export_jsonl, svc, out)
                    rows.append(("jsonl export", r.messages, t))  # type: ignore[attr-defined]
            if name == "chatgpt":
                with MemoryService.open(os.path.join(folder, "data-jsonl")) as svc2:
                    t, r = timed(run_import, out, service=svc2)
                    rows.append(("jsonl import", r.messages, t))  # type: ignore[attr-defined]
        for label, n, t in rows:
            rate = n / t
            speed = f"{rate:>9,.0f}/s {rate / peer:5.1f}x peer"
            print(f"{label:42s} {n:>8,} messages {t:7.2f} s {speed}")
    finally:
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
