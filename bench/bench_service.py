"""MemoryService benchmark on the real corpus (chitchat-dataset, 258,145 messages).

Setup (not measured): the whole corpus is loaded into a data dir through the store (ids and
timestamps as the service makes them) and closed, which writes a snapshot.

Measured, each next to a peer run in the same process:
- open: `MemoryService.open` (store open from the snapshot, history and relation indexes
  built; the search index then builds in the background) in a fresh child process; searches
  and get_system_health right after open (answered while the build runs, by scanning); the
  time until the search index is ready; peak RSS once everything is built;
  peer: `Store.open` alone in another fresh child;
- a session's first history page (limit 100) for 300 sessions; peer: SQLite (WAL, an index on
  (session, id)) returning the same rows as JSON, decoded;
- sessions view first page (limit 100) and get_system_health;
- search via the service (the bench_search query set, top 20, full result dicts) median/p95;
  peers: the raw `SearchIndex.search` on the same index (the wrapper's cost) and SQLite FTS5
  trigram on the same texts;
- durable writes through the service vs `Store.put` of the same messages (1 thread).

Usage: python bench/bench_service.py [--dir DIR] [--repeat N] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_search import QUERIES, fts_sql
from bench_storage import current_rss_mb, peak_rss_mb
from corpus import load_corpus

from convmem_engine.domain import Message
from convmem_engine.service import MemoryService
from convmem_engine.service.ids import UlidSource
from convmem_engine.storage import Store

LIMIT = 20
# One or two per query class of bench_search; run right after open, during the search build.
DURING_BUILD_QUERIES = [
    "hello",
    "the",
    "saxophone",
    "how are you",
    "i don't know",
    "dog park",
    "lo",
]


def p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


def ms(x: float) -> str:
    return f"{x * 1000:.2f} ms"


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def build_data_dir(data_dir: str) -> float:
    corpus = load_corpus()
    clock = iter(range(1_700_000_000_000, 1_700_000_000_000 + 10 * len(corpus), 10))
    ids = UlidSource(lambda: next(clock))
    t0 = time.perf_counter()
    store = Store.open(data_dir)
    seq = 0
    for session, role, content in corpus:
        mid, ts = ids.next()
        seq = store.write_put(Message(mid, session, ts, role, content, 1, ts))
    store.sync(seq)
    store.close()
    return time.perf_counter() - t0


def child(kind: str, data_dir: str) -> dict[str, float]:
    r = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", kind, "--dir", data_dir],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def child_store_open(data_dir: str) -> None:
    t0 = time.perf_counter()
    store = Store.open(data_dir)
    out = {"open_s": time.perf_counter() - t0, "rss_mb": peak_rss_mb()}
    out["messages"] = len(store.messages)
    store.close()
    print(json.dumps(out))


def child_service(data_dir: str, repeat: int) -> None:
    t0 = time.perf_counter()
    svc = MemoryService.open(data_dir)
    out: dict[str, object] = {"open_s": time.perf_counter() - t0}
    first = svc.read_messages(view="sessions", limit=1)["sessions"][0]["session_id"]
    t1 = time.perf_counter()
    svc.read_messages(session_id=first, limit=100)
    out["first_page_after_open_s"] = time.perf_counter() - t1
    # Searches right after open, while the search index builds in the background: answered by
    # scoring every live message (SearchIndex.scan). Each is labelled with whether the build
    # was still running when it returned (scan path) or had finished (index path).
    during: list[list[object]] = []
    for q in DURING_BUILD_QUERIES:
        t1 = time.perf_counter()
        svc.search_messages(query=q, limit=LIMIT)
        during.append([q, time.perf_counter() - t1, not svc.wait_for_search_index(0)])
    t1 = time.perf_counter()
    health_during = svc.get_system_health()
    out["health_during_build"] = [
        time.perf_counter() - t1,
        not svc.wait_for_search_index(0),
        health_during["memory_estimate"]["search_index_bytes"],
    ]
    out["search_during_build"] = during
    svc.wait_for_search_index()
    out["search_ready_s"] = time.perf_counter() - t0
    # The same queries on the finished index, for comparison.
    after: list[list[object]] = []
    for q in DURING_BUILD_QUERIES:

        def search(q: str = q) -> object:
            return svc.search_messages(query=q, limit=LIMIT)

        after.append([q, statistics.median(timed(search, 3))])
    out["search_after_build"] = after
    out["rss_mb"] = peak_rss_mb()
    out["rss_after_open_mb"] = current_rss_mb()
    health = svc.get_system_health()
    out["active_messages"] = health["active_messages"]
    out["session_count"] = health["session_count"]
    out["snapshot_valid"] = health["snapshot_valid"]
    out["memory_estimate"] = health["memory_estimate"]
    out["health_s"] = statistics.median(timed(svc.get_system_health, 5))
    out["sessions_page_s"] = statistics.median(
        timed(lambda: svc.read_messages(view="sessions", limit=100), 20)
    )

    # first history page of 300 sessions vs SQLite
    store_messages = svc._store.messages  # bench only: the peer gets the same rows
    sessions = sorted({m.session_id for m in store_messages.values()})
    sample = random.Random(7).sample(sessions, 300)
    db = sqlite3.connect(os.path.join(tempfile.mkdtemp(), "peer.db"))
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE m (session TEXT, id TEXT, json TEXT, PRIMARY KEY (session, id))")
    with db:
        db.executemany(
            "INSERT INTO m VALUES (?, ?, ?)",
            (
                (m.session_id, m.message_id, json.dumps(m.to_json()))
                for m in store_messages.values()
            ),
        )
    ours: list[float] = []
    peer: list[float] = []
    for sid in sample:
        ours += timed(lambda sid=sid: svc.read_messages(session_id=sid, limit=100), 3)
        peer += timed(
            lambda sid=sid: [
                json.loads(r[0])
                for r in db.execute(
                    "SELECT json FROM m WHERE session = ? ORDER BY id LIMIT 100", (sid,)
                )
            ],
            3,
        )
    out["history_ours"] = [statistics.median(ours), p95(ours)]
    out["history_sqlite"] = [statistics.median(peer), p95(peer)]
    db.close()

    # search: service vs raw index vs FTS5 trigram
    fts = sqlite3.connect(":memory:")
    fts.execute("CREATE VIRTUAL TABLE t USING fts5(content, session UNINDEXED, tokenize='trigram')")
    with fts:
        fts.executemany(
            "INSERT INTO t(rowid, content, session) VALUES (?, ?, ?)",
            ((i + 1, m.content, m.session_id) for i, m in enumerate(store_messages.values())),
        )
    index = svc._indexes.search_index  # bench only: the wrapper's peer
    rows = []
    all_s: list[float] = []
    all_i: list[float] = []
    all_f: list[float] = []
    for cls, queries in QUERIES.items():
        s_t: list[float] = []
        i_t: list[float] = []
        f_t: list[float] = []
        for q in queries:
            s_t += timed(lambda q=q: svc.search_messages(query=q, limit=LIMIT), repeat)
            i_t += timed(
                lambda q=q: index.search(q, store_messages, accept=None, limit=LIMIT), repeat
            )
            sql, args = fts_sql(q, None)
            f_t += timed(lambda sql=sql, args=args: fts.execute(sql, args).fetchall(), repeat)
        rows.append([cls, s_t, i_t, f_t])
        all_s += s_t
        all_i += i_t
        all_f += f_t
    rows.append(["all queries", all_s, all_i, all_f])
    out["search"] = [
        [cls, statistics.median(s), p95(s), statistics.median(i), statistics.median(f), p95(f)]
        for cls, s, i, f in rows
    ]
    # session-scoped search through the service
    scoped: list[float] = []
    for sid in sample[:50]:
        scoped += timed(lambda sid=sid: svc.search_messages(query="you", session_id=sid), 1)
    out["scoped_search"] = [statistics.median(scoped), p95(scoped)]
    svc.close()
    print(json.dumps(out))


def bench_writes(n: int, block: int = 100) -> tuple[float, float]:
    """Durable single-thread writes, service vs Store.put, interleaved in blocks so both see
    the same disk weather."""
    corpus = load_corpus()[:n]
    tmp = tempfile.mkdtemp(prefix="convmem-bench-w-")
    try:
        svc = MemoryService.open(os.path.join(tmp, "svc"))
        store = Store.open(os.path.join(tmp, "store"))
        ids = UlidSource()
        t_svc = t_store = 0.0
        for start in range(0, n, block):
            chunk = corpus[start : start + block]
            t0 = time.perf_counter()
            for session, role, content in chunk:
                svc.write_message(session_id=session, role=role, content=content)
            t_svc += time.perf_counter() - t0
            t0 = time.perf_counter()
            for session, role, content in chunk:
                mid, ts = ids.next()
                store.put(Message(mid, session, ts, role, content, 1, ts))
            t_store += time.perf_counter() - t0
        svc.close()
        store.close()
        return n / t_svc, n / t_store
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--writes", type=int, default=2000)
    ap.add_argument("--child")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if args.child == "store":
        child_store_open(args.dir)
        return
    if args.child == "service":
        child_service(args.dir, args.repeat)
        return

    tmp = None
    data_dir = args.dir
    if data_dir is None:
        tmp = tempfile.mkdtemp(prefix="convmem-bench-svc-")
        data_dir = os.path.join(tmp, "data")
    try:
        # An existing --dir is reused as it is (load it once, measure many times).
        load_s = build_data_dir(data_dir) if not os.path.isdir(data_dir) else 0.0
        store = child("store", data_dir)
        svc = child("service", data_dir)  # writes nothing: both children see the same snapshot
        writes_ours, writes_peer = bench_writes(args.writes)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    est = svc["memory_estimate"]
    assert isinstance(est, dict)
    print(
        f"corpus: {svc['active_messages']} messages, {svc['session_count']} sessions "
        f"(setup load {load_s:.1f} s)"
    )
    print("| measure | service | peer | ratio |")
    print("|---|---|---|---|")
    open_s, rss = float(svc["open_s"]), float(svc["rss_mb"])
    print(
        f"| open with snapshot (fresh process) | {open_s:.2f} s | "
        f"{store['open_s']:.2f} s (Store.open alone) | {open_s / store['open_s']:.2f} |"
    )
    print(
        f"| open until search is ready (background build) | {float(svc['search_ready_s']):.2f} s"
        f" | {store['open_s']:.2f} s | {float(svc['search_ready_s']) / store['open_s']:.2f} |"
    )
    during = svc["search_during_build"]
    assert isinstance(during, list)
    for q, secs, running in during:
        state = "build running" if running else "build had finished"
        print(f"| search_messages '{q}' right after open ({state}) | {ms(secs)} | | |")
    hd = svc["health_during_build"]
    assert isinstance(hd, list)
    print(
        f"| get_system_health right after open ({'build running' if hd[1] else 'built'}; "
        f"search_index_bytes {hd[2]}) | {ms(hd[0])} | | |"
    )
    after = svc["search_after_build"]
    assert isinstance(after, list)
    print(
        "| the same searches once built | "
        + ", ".join(f"'{q}' {ms(secs)}" for q, secs in after)
        + " | | |"
    )
    print(
        "| first history page right after open (build running) | "
        f"{ms(float(svc['first_page_after_open_s']))} | | |"
    )
    print(
        f"| peak RSS, all indexes built | {rss:.0f} MB | "
        f"{store['rss_mb']:.0f} MB (Store.open alone) | {rss / store['rss_mb']:.2f} |"
    )
    h_ours, h_peer = svc["history_ours"], svc["history_sqlite"]
    assert isinstance(h_ours, list) and isinstance(h_peer, list)
    print(
        f"| first history page (limit 100), median / p95 | {ms(h_ours[0])} / {ms(h_ours[1])} | "
        f"{ms(h_peer[0])} / {ms(h_peer[1])} (SQLite, same rows as JSON) | "
        f"{h_ours[0] / h_peer[0]:.2f} |"
    )
    print(
        "| sessions view first page (limit 100), median | "
        f"{ms(float(svc['sessions_page_s']))} | | |"
    )
    print(f"| get_system_health, median | {ms(float(svc['health_s']))} | | |")
    print(
        f"| durable writes, 1 thread | {writes_ours:.0f}/s | {writes_peer:.0f}/s (Store.put) | "
        f"{writes_ours / writes_peer:.2f} |"
    )
    sc = svc["scoped_search"]
    assert isinstance(sc, list)
    print(f"| session-scoped search 'you', median / p95 | {ms(sc[0])} / {ms(sc[1])} | | |")
    print()
    print(
        "| query class | service median | service p95 | raw index median | FTS5 median | FTS5 p95 "
        "| service/FTS5 | service/raw |"
    )
    print("|---|---|---|---|---|---|---|---|")
    search = svc["search"]
    assert isinstance(search, list)
    for cls, s_med, s_p95, i_med, f_med, f_p95 in search:
        print(
            f"| {cls} | {ms(s_med)} | {ms(s_p95)} | {ms(i_med)} | {ms(f_med)} | {ms(f_p95)} | "
            f"{s_med / f_med:.2f} | {s_med / i_med:.2f} |"
        )
    print()
    print("memory_estimate (bytes): " + json.dumps(est))


if __name__ == "__main__":
    main()
