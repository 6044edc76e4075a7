"""The cost of `get_system_health` against the store's size, this checkout side by side with
another (`--before DIR`, e.g. a `git archive` of main), in the same run.

For each store (a fresh one of `--small` corpus messages, written here, plus copies of
`--stores`, e.g. /tmp/s4/258k,/tmp/s4/1m) and each checkout, alternating `--rounds` times:

- in process: a child opens the store with `MemoryService.open`, waits for the search index,
  and times `--calls` calls of `get_system_health` (process CPU per call, median of 5 slices;
  the service call itself, no transport);
- over stdio: `convmem serve` on the store, the handshake, health polled until the search index
  is ready (its estimate counts it) and the server idle, then `--calls` calls one at a time:
  the round trip's median and p90 (wall) and the server's CPU per call (utime + stime from
  /proc over the calls).

Each figure is also given as a ratio to the small store's (the goal: the same cost whatever the
store's size) and after / before. Usage:
    python bench/bench_health.py --stores /tmp/s4/258k,/tmp/s4/1m --before /tmp/s4/before
        [--small 1000] [--calls 200] [--rounds 2] [--dir /tmp] [--json OUT]
Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_mcp import (
    INITIALIZE,
    INITIALIZED,
    PY,
    ROOT,
    SOURCE_SERVE,
    child_env,
    cpu_seconds,
    health_call,
    index_ready,
    load_average,
    read_answer,
    settle,
)

IN_PROCESS = """
import json, statistics, sys, time
from convmem_engine.service import MemoryService
svc = MemoryService.open(sys.argv[1])
assert svc.wait_for_search_index(timeout=900)
calls = int(sys.argv[2])
svc.get_system_health()
slices = []
for _ in range(5):
    t = time.process_time()
    for _ in range(calls // 5):
        h = svc.get_system_health()
    slices.append((time.process_time() - t) / (calls // 5) * 1000)
print(json.dumps({"cpu_ms": statistics.median(slices), "estimate": h["memory_estimate"],
                  "messages": h["active_messages"]}))
import os
os._exit(0)  # no close: search.idx and the snapshot stay as they were
"""


def small_store(path: Path, n: int) -> None:
    """A store of the first `n` corpus messages (written by this checkout's service)."""
    from corpus import load_corpus

    from convmem_engine.service import MemoryService

    svc = MemoryService.open(path)
    try:
        for session, role, content in load_corpus()[:n]:
            svc.write_message(session_id=session, role=role, content=content)
    finally:
        svc.close()


def in_process(tree: Path, store: Path, calls: int) -> dict[str, Any]:
    out = subprocess.run(
        [PY, "-c", IN_PROCESS, str(store), str(calls)],
        env=child_env(tree),
        cwd=tree,  # `-c` and `-m` put the working directory first on sys.path
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def over_stdio(tree: Path, store: Path, calls: int) -> dict[str, float]:
    process = subprocess.Popen(
        [*SOURCE_SERVE, "--data-dir", str(store)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=child_env(tree),
        cwd=tree,
    )
    assert process.stdin is not None and process.stdout is not None

    def ask(request_id: int) -> dict[str, Any]:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(health_call(request_id))
        process.stdin.flush()
        return read_answer(process.stdout, request_id)

    try:
        process.stdin.write(INITIALIZE)
        process.stdin.flush()
        read_answer(process.stdout, 1)
        process.stdin.write(INITIALIZED)
        request_id = 2
        while not index_ready(ask(request_id)):
            request_id += 1
            time.sleep(0.05)
        for _ in range(5):  # the SDK and everything a call touches loaded
            request_id += 1
            ask(request_id)
        settle(process.pid)  # the SDK loads on a thread after the first answers
        times = []
        cpu = cpu_seconds(process.pid)
        for _ in range(calls):
            request_id += 1
            t = time.perf_counter()
            ask(request_id)
            times.append((time.perf_counter() - t) * 1000)
        cpu = (cpu_seconds(process.pid) - cpu) / calls * 1000
    finally:
        process.stdin.close()
        process.stdout.read()
        process.stdout.close()
        process.wait(300)
    times.sort()
    return {
        "wall_p50_ms": statistics.median(times),
        "wall_p90_ms": times[int(0.9 * (len(times) - 1))],
        "server_cpu_ms": cpu,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="", help="store dirs to copy, comma-separated")
    parser.add_argument("--before", default=None, help="another checkout to run as `before`")
    parser.add_argument("--small", type=int, default=1000, help="messages of the small store")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", default=None, help="where the store copies go")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    trees = {"after": ROOT} | ({"before": Path(args.before)} if args.before else {})
    work = Path(tempfile.mkdtemp(prefix="bench-health-", dir=args.dir))
    figures: dict[str, Any] = {"load_before": load_average(), "cpus": os.cpu_count()}
    try:
        stores = {f"{args.small // 1000}k": work / "small"}
        small_store(stores[f"{args.small // 1000}k"], args.small)
        for store in filter(None, args.stores.split(",")):
            stores[Path(store).name] = work / Path(store).name
            shutil.copytree(store, stores[Path(store).name], symlinks=True)
        runs: dict[str, list[dict[str, Any]]] = {}
        for r in range(args.rounds):
            for name, store in stores.items():
                order = list(trees.items()) if r % 2 == 0 else list(trees.items())[::-1]
                for label, tree in order:
                    row = in_process(tree, store, args.calls)
                    row |= over_stdio(tree, store, args.calls)
                    runs.setdefault(f"{name} {label}", []).append(row)
                    print(
                        f"  {name:>6} {label:>6}: in process {row['cpu_ms']:.3f} ms CPU; stdio"
                        f" p50 {row['wall_p50_ms']:.2f} p90 {row['wall_p90_ms']:.2f} ms, server"
                        f" CPU {row['server_cpu_ms']:.2f} ms per call",
                        flush=True,
                    )
        figures["load_after"] = load_average()
        keys = ("cpu_ms", "wall_p50_ms", "wall_p90_ms", "server_cpu_ms")
        med = {
            run: {k: statistics.median(r[k] for r in rows) for k in keys}
            for run, rows in runs.items()
        }
        for run, rows in runs.items():
            med[run]["messages"] = rows[0]["messages"]
            med[run]["estimate_total"] = rows[0]["estimate"]["total_bytes"]
        figures["medians"] = med
        small = next(iter(stores))
        print(
            f"\nget_system_health per call (medians of {args.rounds} rounds; load average "
            f"{figures['load_before']} -> {figures['load_after']}, {os.cpu_count()} CPUs)"
        )
        print(
            f"{'store':>6} {'tree':>6} {'messages':>9} {'in-process CPU ms':>18}"
            f" {'stdio p50 ms':>13} {'p90':>6} {'server CPU ms':>14}  estimate MiB  vs {small}"
        )
        for run, m in med.items():
            name, label = run.split()
            base = med[f"{small} {label}"]
            print(
                f"{name:>6} {label:>6} {m['messages']:9,} {m['cpu_ms']:18.3f}"
                f" {m['wall_p50_ms']:13.2f} {m['wall_p90_ms']:6.2f} {m['server_cpu_ms']:14.2f}"
                f"  {m['estimate_total'] / 2**20:12.1f}"
                f"  in process x{m['cpu_ms'] / base['cpu_ms']:.1f},"
                f" stdio p50 x{m['wall_p50_ms'] / base['wall_p50_ms']:.2f}"
            )
        if "before" in trees:
            for name in stores:
                a, b = med[f"{name} after"], med[f"{name} before"]
                print(
                    f"{name:>6} after/before: in process {a['cpu_ms'] / b['cpu_ms']:.3f},"
                    f" stdio p50 {a['wall_p50_ms'] / b['wall_p50_ms']:.3f}, server CPU"
                    f" {a['server_cpu_ms'] / max(b['server_cpu_ms'], 1e-9):.3f}; estimate"
                    f" {a['estimate_total']:,} vs {b['estimate_total']:,} bytes"
                )
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
