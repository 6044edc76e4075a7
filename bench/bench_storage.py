"""Storage benchmark on the real corpus (chitchat-dataset, 258,145 messages).

Prints one table:
- durable writes/s (put = append + group-commit fsync) with 1 and 8 writer threads, next to
  raw append+fsync of the same record sizes on the same disk in the same run (the floor);
- bulk load of the whole corpus (write_put each, one sync), compaction, snapshot at close;
- open of the whole corpus with a valid snapshot and with a full log replay, each measured in
  a fresh child process (time and that process's peak RSS).

Usage: python bench/bench_storage.py [--dir DIR] [--writes N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ulid import ULID

from convmem_engine.domain import Message
from convmem_engine.storage import Store
from convmem_engine.storage.codec import encode_message
from convmem_engine.storage.record import PUT, encode_record


def peak_rss_mb() -> float:
    """Peak RSS of this process. On Linux VmHWM: ru_maxrss of an exec'd child starts at the
    parent's RSS at fork time (Linux carries it across exec), which would hide the child's own."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / (1024 * 1024) if sys.platform == "darwin" else r / 1024


def current_rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def baseline_rss_mb() -> float:
    """Peak RSS of a child that only imports the store (the interpreter's own share)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import convmem_engine.storage; "
        "sys.path.insert(0, sys.argv[2]); from bench_storage import peak_rss_mb; "
        "print(peak_rss_mb())"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run(
        [sys.executable, "-c", code, os.path.dirname(here), here],
        check=True,
        capture_output=True,
        text=True,
    )
    return float(r.stdout)


def make_messages(corpus: tuple[tuple[str, str, str], ...], start: int, n: int) -> list[Message]:
    base = 1_700_000_000_000
    out = []
    for i in range(start, start + n):
        s, role, content = corpus[i % len(corpus)]
        ts = base + i
        out.append(Message(str(ULID()), s, ts, role, content, 1, ts))
    return out


def raw_append_fsync(path: str, records: list[bytes]) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        t = time.perf_counter()
        for r in records:
            os.write(fd, r)
            os.fsync(fd)
        return len(records) / (time.perf_counter() - t)
    finally:
        os.close(fd)


def interleaved_single(
    raw_path: str, records: list[bytes], store: Store, msgs: list[Message], block: int = 50
) -> tuple[float, float]:
    """Raw append+fsync and Store.put, alternating blocks of `block` writes so that both see
    the same disk weather (this disk is shared). Returns (raw writes/s, store writes/s)."""
    fd = os.open(raw_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    raw_t = store_t = 0.0
    try:
        for i in range(0, min(len(records), len(msgs)), block):
            t = time.perf_counter()
            for r in records[i : i + block]:
                os.write(fd, r)
                os.fsync(fd)
            t2 = time.perf_counter()
            for m in msgs[i : i + block]:
                store.put(m)
            t3 = time.perf_counter()
            raw_t += t2 - t
            store_t += t3 - t2
    finally:
        os.close(fd)
    return len(records) / raw_t, len(msgs) / store_t


def raw_append_fsync_threads(path: str, records: list[bytes], threads: int) -> float:
    """The same without any group commit: every thread fsyncs after each of its appends."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def run(chunk: list[bytes]) -> None:
        for r in chunk:
            os.write(fd, r)
            os.fsync(fd)

    ts = [threading.Thread(target=run, args=(records[i::threads],)) for i in range(threads)]
    try:
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return len(records) / (time.perf_counter() - t0)
    finally:
        os.close(fd)


def durable_puts(store: Store, msgs: list[Message], threads: int) -> float:
    chunks = [msgs[i::threads] for i in range(threads)]
    barrier = threading.Barrier(threads + 1)

    def run(chunk: list[Message]) -> None:
        barrier.wait()
        for m in chunk:
            store.put(m)

    ts = [threading.Thread(target=run, args=(c,)) for c in chunks]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return len(msgs) / (time.perf_counter() - t0)


def child_open(data_dir: str) -> None:
    """Run in a fresh process: open, report time, count, peak RSS, then close."""
    t = time.perf_counter()
    store = Store.open(data_dir)
    opened = time.perf_counter() - t
    rss_after = current_rss_mb()
    st = store.stats()
    out = {
        "open_s": opened,
        "messages": len(store.messages),
        "snapshot_valid": st.snapshot_valid,
        "rss_mb": peak_rss_mb(),
        "rss_after_mb": rss_after,
    }
    t = time.perf_counter()
    store.close()
    out["close_s"] = time.perf_counter() - t
    print(json.dumps(out))


def measure_open(data_dir: str) -> dict[str, float]:
    r = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child-open", data_dir],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(r.stdout)
    return result


def measure_open_median(data_dir: str, rounds: int, *, drop_snapshot: bool) -> dict[str, float]:
    """Median open time of `rounds` child processes; the highest peak RSS among them."""
    runs = []
    for _ in range(rounds):
        if drop_snapshot:
            os.unlink(os.path.join(data_dir, "snapshot.bin"))
        runs.append(measure_open(data_dir))
    out = dict(runs[0])
    out["open_s"] = statistics.median(r["open_s"] for r in runs)
    out["close_s"] = statistics.median(r["close_s"] for r in runs)
    out["rss_mb"] = max(r["rss_mb"] for r in runs)
    out["rss_after_mb"] = max(r["rss_after_mb"] for r in runs)
    out["open_min_s"] = min(r["open_s"] for r in runs)
    out["open_max_s"] = max(r["open_s"] for r in runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None, help="where to create the data dir (default: /tmp)")
    ap.add_argument("--writes", type=int, default=1000, help="durable writes per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the write measurements")
    ap.add_argument("--child-open", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_open:
        child_open(args.child_open)
        return

    from corpus import load_corpus

    corpus = load_corpus()
    root = tempfile.mkdtemp(prefix="convmem-bench-", dir=args.dir)
    rows: list[tuple[str, str]] = []
    try:
        n = args.writes
        # -- durable writes vs raw append+fsync, interleaved rounds, median of each --------
        rounds = args.rounds
        msgs = make_messages(corpus, 0, rounds * 4 * n)
        raw1s, raw8s, ones, eights, per_fsync = [], [], [], [], []
        for r in range(rounds):
            chunk = msgs[r * 4 * n : (r + 1) * 4 * n]
            recs = [encode_record(PUT, i + 1, encode_message(m)) for i, m in enumerate(chunk)]
            store = Store.open(os.path.join(root, f"writes{r}"))
            raw_rate, one_rate = interleaved_single(
                os.path.join(root, f"raw{r}.log"), recs[:n], store, chunk[n : 2 * n]
            )
            raw1s.append(raw_rate)
            ones.append(one_rate)
            flushes0 = store.stats().io.flush_calls
            eights.append(durable_puts(store, chunk[2 * n : 4 * n], 8))
            per_fsync.append(2 * n / max(store.stats().io.flush_calls - flushes0, 1))
            store.close()
            raw8s.append(raw_append_fsync_threads(os.path.join(root, f"raw8{r}.log"), recs[n:], 8))
        raw, raw8 = statistics.median(raw1s), statistics.median(raw8s)
        one, eight = statistics.median(ones), statistics.median(eights)

        def spread(xs: list[float]) -> str:
            return f"[{min(xs):,.0f}..{max(xs):,.0f}]"

        rows.append(
            (
                f"raw append+fsync, 1 thread (floor), median of {rounds}",
                f"{raw:,.0f} writes/s {spread(raw1s)}",
            )
        )
        rows.append(
            (
                "raw append+fsync, 8 threads (own fsync each)",
                f"{raw8:,.0f} writes/s {spread(raw8s)}",
            )
        )
        rows.append(
            (
                "Store.put durable, 1 writer (interleaved w. raw)",
                f"{one:,.0f} writes/s {spread(ones)} ({one / raw:.2f}x raw 1 thread)",
            )
        )
        rows.append(
            (
                "Store.put durable, 8 writers",
                f"{eight:,.0f} writes/s {spread(eights)} ({eight / raw:.2f}x raw 1 thread, "
                f"{eight / raw8:.2f}x raw 8 threads; "
                f"{statistics.median(per_fsync):.1f} records per fsync)",
            )
        )

        # -- the whole corpus --------------------------------------------------------------
        cdir = os.path.join(root, "corpus")
        all_msgs = make_messages(corpus, 0, len(corpus))
        store = Store.open(cdir)
        t0 = time.perf_counter()
        last = 0
        for m in all_msgs:
            last = store.write_put(m)
        store.sync(last)
        load_s = time.perf_counter() - t0
        # some churn so compaction has work: update 1 in 50, delete 1 in 100
        for i, m in enumerate(all_msgs):
            if i % 50 == 0:
                upd = Message(
                    m.message_id,
                    m.session_id,
                    m.timestamp,
                    m.role,
                    m.content + " (edited)",
                    2,
                    m.timestamp + 1,
                )
                last = store.write_update(upd)
            elif i % 100 == 1:
                last = store.write_delete(m.message_id)
        store.sync(last)
        st = store.stats()
        t0 = time.perf_counter()
        res = store.compact()
        compact_s = time.perf_counter() - t0
        del all_msgs, msgs
        store.close()
        rows.append(
            (
                f"bulk load {len(corpus):,} messages (write_put, 1 sync)",
                f"{load_s:.2f} s ({len(corpus) / load_s:,.0f} msgs/s)",
            )
        )
        rows.append(
            (
                "compact (after 2% updates, 1% deletes)",
                f"{compact_s:.2f} s; {res.records_removed:,} records removed, "
                f"{st.dead_bytes / 1e6:.1f} MB dead, {res.bytes_before / 1e6:.1f} -> "
                f"{res.bytes_after / 1e6:.1f} MB",
            )
        )
        snap_size = os.path.getsize(os.path.join(cdir, "snapshot.bin"))
        rows.append(("snapshot.bin size", f"{snap_size / 1e6:.1f} MB"))
        rows.append(("bench process peak RSS", f"{peak_rss_mb():.0f} MB (holds the corpus twice)"))

        o1 = measure_open_median(cdir, rounds, drop_snapshot=False)
        rows.append(
            (
                f"open, valid snapshot ({o1['messages']:,} msgs), median of {rounds}",
                f"{o1['open_s']:.2f} s [{o1['open_min_s']:.2f}..{o1['open_max_s']:.2f}], "
                f"peak RSS {o1['rss_mb']:.0f} MB, "
                f"RSS after open {o1['rss_after_mb']:.0f} MB",
            )
        )
        o2 = measure_open_median(cdir, rounds, drop_snapshot=True)
        rows.append(
            (
                f"open, full log replay, median of {rounds}",
                f"{o2['open_s']:.2f} s [{o2['open_min_s']:.2f}..{o2['open_max_s']:.2f}], "
                f"peak RSS {o2['rss_mb']:.0f} MB, "
                f"RSS after open {o2['rss_after_mb']:.0f} MB "
                f"(close writes the snapshot: {o2['close_s']:.2f} s)",
            )
        )
        rows.append(("child baseline (interpreter + imports only)", f"{baseline_rss_mb():.0f} MB"))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    width = max(len(a) for a, _ in rows)
    print(f"{'measure'.ljust(width)}  result")
    print(f"{'-' * width}  {'-' * 40}")
    for a, b in rows:
        print(f"{a.ljust(width)}  {b}")


if __name__ == "__main__":
    main()
