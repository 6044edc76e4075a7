"""In-process CPU per `write_message`, the search index's deferred batches included, and the
cost of a search right after writes: this checkout side by side with another (`--before DIR`,
e.g. a `git archive` of main), in the same run.

Each variant runs in a child process (its own checkout on PYTHONPATH) on a fresh data dir in
`--dir` (a tmpfs such as /dev/shm, or a disk: there the fsync's kernel CPU counts too), or on a
copy of `--store` (a corpus store, e.g. /tmp/s4/258k: posting lists at scale). The child writes
`--warm` messages, then `--writes` timed ones (~210-character texts of the chitchat corpus, one
session per 20), and the CPU window (process CPU: every thread, the background flush included)
closes only once the queued search-index changes are applied (`wait_for_search_index`, which
applies them): no deferred work is left out. Per write: CPU, wall p50/p99. Then `--searches`
rounds of `--burst` writes followed at once by one search for the last write's own word (the
search's wall time, and whether it found the write), and the same search again 50 ms later
(`search_late`: the queue applied by then).

`--pace MS`: a write every MS milliseconds instead of back to back (a host writing at a steady
rate, the background flush working between writes), each write's latency counted from the
moment it was due (a write held up by the flush also delays its start: counted); `queue_left`
is how many search-index changes were still queued after the last timed write (how far the
background flush was behind).

Usage: python bench/bench_write_index.py [--dir /dev/shm] [--writes 3000] [--rounds 3]
       [--before DIR] [--store DIR] [--pace MS] [--json OUT]
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

ROOT = str(Path(__file__).resolve().parent.parent)
HERE = os.path.dirname(os.path.abspath(__file__))


def texts(n: int) -> list[str]:
    sys.path.insert(0, HERE)
    from corpus import load_corpus

    out: list[str] = []
    cur = ""
    for _, _, c in load_corpus():
        cur = f"{cur} {c}".strip()
        if len(cur) >= 200:
            out.append(cur[:230])
            cur = ""
            if len(out) == n:
                break
    return out


def child(
    data_dir: str, writes: int, warm: int, searches: int, burst: int, pace: float
) -> dict[str, Any]:
    from convmem_engine.service import MemoryService

    pool = texts(warm + writes + searches * burst)
    svc = MemoryService.open(data_dir)
    try:
        assert svc.wait_for_search_index(timeout=600)
        k = 0

        def write(extra: str = "") -> str:
            nonlocal k
            text = pool[k % len(pool)] + extra
            out = svc.write_message(session_id=f"s{k // 20}", role="user", content=text)
            k += 1
            return str(out["message"]["message_id"])

        for _ in range(warm):
            write()
        svc.wait_for_search_index()
        time.sleep(0.05)
        lat: list[float] = []
        c0 = time.process_time()
        w0 = due = time.perf_counter()
        for _ in range(writes):
            if pace:
                due += pace / 1000
                ahead = due - time.perf_counter()
                if ahead > 0:
                    time.sleep(ahead)
                t = due if ahead > 0 else time.perf_counter()
            else:
                t = time.perf_counter()
            write()
            lat.append(time.perf_counter() - t)
        left = len(getattr(svc._indexes, "_search_pending", None) or ())
        svc.wait_for_search_index()  # the deferred batches are in the window
        cpu = time.process_time() - c0
        wall = time.perf_counter() - w0
        lat.sort()
        search_ms: list[float] = []
        late_ms: list[float] = []
        missed = 0
        for r in range(searches):
            for i in range(burst):
                mid = write(f" zq{r}x{i}v")
            query = f"zq{r}x{burst - 1}v"
            t = time.perf_counter()
            hits = svc.search_messages(query=query)["results"]
            search_ms.append((time.perf_counter() - t) * 1e3)
            missed += [h["message_id"] for h in hits] != [mid]
            time.sleep(0.05)
            t = time.perf_counter()
            svc.search_messages(query=query)
            late_ms.append((time.perf_counter() - t) * 1e3)
        return {
            "cpu_ms": cpu / writes * 1e3,
            "wall_ms": wall / writes * 1e3,
            "p50_ms": lat[len(lat) // 2] * 1e3,
            "p99_ms": lat[int(len(lat) * 0.99)] * 1e3,
            "max_ms": lat[-1] * 1e3,
            "search_p50_ms": statistics.median(search_ms) if search_ms else 0.0,
            "search_max_ms": max(search_ms) if search_ms else 0.0,
            "search_late_ms": statistics.median(late_ms) if late_ms else 0.0,
            "queue_left": left,
            "missed": missed,
        }
    finally:
        svc.close()


def run(checkout: str, args: argparse.Namespace) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="bench-write-index-", dir=args.dir)
    data = os.path.join(work, "data")
    try:
        if args.store:
            shutil.copytree(args.store, data)
        env = dict(os.environ, PYTHONPATH=checkout)
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            data,
            str(args.writes),
            str(args.warm),
            str(args.searches),
            str(args.burst),
            str(args.pace),
        ]
        out = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True, check=True)
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        data, writes, warm, searches, burst, pace = sys.argv[2:8]
        result = child(data, int(writes), int(warm), int(searches), int(burst), float(pace))
        print(json.dumps(result))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="/dev/shm", help="where the data dirs go")
    parser.add_argument("--writes", type=int, default=3000)
    parser.add_argument("--warm", type=int, default=200)
    parser.add_argument("--searches", type=int, default=40)
    parser.add_argument("--burst", type=int, default=8, help="writes before each search")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", default=None, help="another checkout, run as `before`")
    parser.add_argument("--store", default=None, help="copy this store for each run")
    parser.add_argument("--pace", type=float, default=0.0, help="ms between writes (0: none)")
    parser.add_argument("--tree", action="append", default=[], help="NAME=DIR: another variant")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    variants = [("after", ROOT)] + ([("before", args.before)] if args.before else [])
    variants += [(t.split("=", 1)[0], t.split("=", 1)[1]) for t in args.tree]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    for r in range(args.rounds):  # alternating: every variant sees the same load
        for name, checkout in variants if r % 2 == 0 else variants[::-1]:  # turned each round
            runs[name].append(run(checkout, args))
    print(
        f"load average {os.getloadavg()[0]:.2f}, dir {args.dir}, store {args.store or 'empty'}, "
        f"pace {args.pace or 'none'}"
    )
    keys = ["cpu_ms", "wall_ms", "p50_ms", "p99_ms", "max_ms", "search_p50_ms", "search_max_ms"]
    keys += ["search_late_ms", "queue_left"]
    print(f"{'variant':8} " + " ".join(f"{k:>13}" for k in keys) + "  missed  (median; best cpu)")
    summary: dict[str, dict[str, float]] = {}
    for name, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in keys}
        med["best_cpu_ms"] = min(r["cpu_ms"] for r in rs)
        summary[name] = med
        missed = sum(r["missed"] for r in rs)
        cells = " ".join(f"{med[k]:13.3f}" for k in keys)
        print(f"{name:8} {cells}  {missed:6d}  best {med['best_cpu_ms']:.3f}")
        for k in ("cpu_ms", "p50_ms", "p99_ms", "search_p50_ms"):
            print(f"{'':8}   {k} per run: " + " ".join(f"{r[k]:.3f}" for r in rs))
    if args.before:
        a, b = summary["after"], summary["before"]
        print(
            f"after/before: cpu {a['cpu_ms'] / b['cpu_ms']:.2f}x (best "
            f"{a['best_cpu_ms'] / b['best_cpu_ms']:.2f}x), p50 {a['p50_ms'] / b['p50_ms']:.2f}x, "
            f"p99 {a['p99_ms'] / b['p99_ms']:.2f}x, "
            f"search {a['search_p50_ms'] / b['search_p50_ms']:.2f}x"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
