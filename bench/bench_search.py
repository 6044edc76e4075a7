"""Search benchmark on the real corpus (chitchat-dataset, 258,145 messages).

Builds `SearchIndex` over every message and, in the same process, an SQLite FTS5 table with the
trigram tokenizer over the same texts, then runs one fixed query set on both (top 20):

- ours: `SearchIndex.search(query, messages, limit=20)` (verified, ranked, score breakdown);
- FTS5: words of 3+ characters as `MATCH '"w1" AND "w2"' ORDER BY rank LIMIT 20` (the same
  candidate set as our all-words rule; bm25 ranking); queries with a word shorter than 3
  characters use `content LIKE '%query%' LIMIT 20` (FTS5 trigram cannot MATCH them; no ranking).

Scenarios: "default" (every message importance 50, timestamps in creation order, as written by
the service), "mixed importance" (1% of messages importance 90), and "session-scoped" (words
restricted to one conversation: `session_id=` (or only `accept=`) for us, `AND session = ?`
for FTS5).

Prints build time, memory, and per-query-class median/p95 latency with the ratio ours/FTS5.

Also the worst queries found (issue 13; `WORST_CASES`): ours (wall and CPU) next to FTS5, and
with `--baseline OLD.py` next to another search_index.py on the same index in the same run.

Usage: python bench/bench_search.py [--repeat N] [--tracemalloc] [--markdown] [--only-new]
       [--worst-only] [--baseline PATH] [--messages N [--summary-json PATH]]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import random
import re
import sqlite3
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Final

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from corpus import load_corpus
from ulid import ULID

from convmem_engine.domain import Message, Metadata
from convmem_engine.index.search_index import SearchIndex

LIMIT = 20
QUERIES: dict[str, list[str]] = {
    "frequent word": ["the", "you", "like", "good", "What"],
    "medium word": ["movie", "music", "weekend", "coffee", "Netflix"],
    "rare word": ["saxophone", "kangaroo", "origami", "lasagna", "telescope"],
    "phrase": [
        "how are you",
        "i don't know",
        "video games",
        "what do you do for fun",
        "have a great day",
    ],
    "words apart": ["movie weekend", "coffee morning", "dog park", "pizza friday", "book summer"],
    "2 characters": ["ok", "hi", "lo", "zz", "設計"],
}


def current_rss() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def make_messages(importance_share: float, count: int = 0) -> dict[str, Message]:
    """The corpus as messages; with `count`, that many (the corpus repeated, each round's
    sessions renamed, as bench_mcp's stores past the corpus)."""
    rng = random.Random(7)
    base = 1_700_000_000_000
    out: dict[str, Message] = {}
    corpus = load_corpus()
    rows = (
        corpus
        if not count
        else [
            (f"{session}~{i // len(corpus)}" if i >= len(corpus) else session, role, text)
            for i in range(count)
            for session, role, text in (corpus[i % len(corpus)],)
        ]
    )
    for i, (session, role, text) in enumerate(rows):
        ts = base + i * 1000
        imp = 90 if rng.random() < importance_share else 50
        mid = str(ULID.from_timestamp(ts / 1000))
        meta = Metadata(importance=imp) if imp != 50 else Metadata()
        out[mid] = Message(mid, session, ts, role, text, metadata=meta)
    return out


def build_ours(messages: dict[str, Message]) -> tuple[SearchIndex, float, float, int]:
    gc.collect()
    rss0 = current_rss()
    t0 = time.perf_counter()
    c0 = time.process_time()
    idx = SearchIndex()
    idx.build(messages.values())
    return idx, time.perf_counter() - t0, time.process_time() - c0, current_rss() - rss0


def add_one_by_one(messages: dict[str, Message]) -> float:
    """CPU seconds to index every message through `add` (what a service write does)."""
    c0 = time.process_time()
    idx = SearchIndex()
    for m in messages.values():
        idx.add(m)
    cpu = time.process_time() - c0
    del idx
    gc.collect()
    return cpu


def load_vs_build(
    idx: SearchIndex, messages: dict[str, Message], ours_build: float, fts_build: float
) -> None:
    """search.idx's layout (index/search_file.py): encode the built index, decode it (what a
    restart does instead of the build), check the copy searches the same, next to the build
    and FTS5's build in this run."""
    from convmem_engine.index import search_file

    t0 = time.perf_counter()
    blob = b"".join(search_file.encode(idx))
    encode_s = time.perf_counter() - t0
    view = memoryview(blob)
    pos = 0

    def read(n: int) -> bytes:
        nonlocal pos
        pos += n
        return bytes(view[pos - n : pos])

    def resolve(raws: list[str]) -> list[str | None]:
        return [messages[r].message_id if r else None for r in raws]

    gc.collect()
    rss0 = current_rss()
    t0 = time.perf_counter()
    loaded = search_file.decode(read, resolve)
    load_s = time.perf_counter() - t0
    rss = current_rss() - rss0
    for queries in QUERIES.values():
        for q in queries:
            assert loaded.search(q, messages, limit=LIMIT) == idx.search(q, messages, limit=LIMIT)
    print(
        f"search.idx: {len(blob) / 1e6:.0f} MB, encode {encode_s:.2f} s, load {load_s:.2f} s "
        f"(RSS delta {rss / 1e6:.0f} MB, memory_bytes() {loaded.memory_bytes() / 1e6:.0f} MB "
        f"vs {idx.memory_bytes() / 1e6:.0f} MB built): load / build {load_s / ours_build:.3f}, "
        f"load / FTS5 build {load_s / fts_build:.3f}; same results on every query"
    )


def build_fts(
    messages: dict[str, Message],
) -> tuple[sqlite3.Connection, list[str], float, float, int]:
    gc.collect()
    rss0 = current_rss()
    t0 = time.perf_counter()
    c0 = time.process_time()
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(content, session UNINDEXED, tokenize='trigram')")
    rowids: list[str] = []
    with db:
        db.executemany(
            "INSERT INTO t(rowid, content, session) VALUES (?, ?, ?)",
            ((i + 1, m.content, m.session_id) for i, m in enumerate(messages.values())),
        )
    rowids = list(messages)
    return db, rowids, time.perf_counter() - t0, time.process_time() - c0, current_rss() - rss0


def fts_sql(query: str, session: str | None, limit: int = LIMIT) -> tuple[str, tuple[str, ...]]:
    words = [w for w in re.split(r"[\s,.!?]+", query) if w]
    scope = " AND session = ?" if session is not None else ""
    extra: tuple[str, ...] = (session,) if session is not None else ()
    if all(len(w) >= 3 for w in words):
        match = " AND ".join('"' + w.replace('"', '""') + '"' for w in words)
        return f"SELECT rowid FROM t WHERE t MATCH ?{scope} ORDER BY rank LIMIT {limit}", (
            match,
            *extra,
        )
    pattern = "%" + query.replace("%", "").replace("_", "") + "%"
    return f"SELECT rowid FROM t WHERE content LIKE ?{scope} LIMIT {limit}", (pattern, *extra)


def timed(fn: Callable[[], int], repeat: int) -> tuple[list[float], int]:
    times = []
    n = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = fn()
        times.append(time.perf_counter() - t0)
    return times, n


def p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


def ms(x: float) -> str:
    return f"{x * 1000:.2f} ms"


def run_queries(
    idx: SearchIndex,
    messages: dict[str, Message],
    db: sqlite3.Connection,
    queries: dict[str, list[str]],
    repeat: int,
    session: str | None = None,
    scope_by: str = "session_id",
) -> list[tuple[str, list[float], list[float], str]]:
    def accept(m: Message) -> bool:
        return m.session_id == session

    rows = []
    all_ours: list[float] = []
    all_fts: list[float] = []
    for cls, qs in queries.items():
        ours_t: list[float] = []
        fts_t: list[float] = []
        counts = []
        for q in qs:
            sql, args = fts_sql(q, session)

            def ours(q: str = q) -> int:
                if session is not None and scope_by == "accept":
                    hits = idx.search(q, messages, accept=accept, limit=LIMIT)
                else:
                    hits = idx.search(q, messages, limit=LIMIT, session_id=session)
                return len(hits)

            def fts(sql: str = sql, args: tuple[str, ...] = args) -> int:
                return len(db.execute(sql, args).fetchall())

            t, n_ours = timed(ours, repeat)
            ours_t += t
            t, n_fts = timed(fts, repeat)
            fts_t += t
            counts.append(f"{n_ours}/{n_fts}")
        rows.append((cls, ours_t, fts_t, " ".join(counts)))
        all_ours += ours_t
        all_fts += fts_t
    rows.append(("all queries", all_ours, all_fts, ""))
    return rows


def print_table(
    title: str, rows: list[tuple[str, list[float], list[float], str]], md: bool
) -> None:
    print(f"\n{title}")
    head = (
        "query class",
        "ours median",
        "ours p95",
        "FTS5 median",
        "FTS5 p95",
        "median ratio",
        "hits ours/FTS5",
    )
    if md:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    else:
        print("  ".join(h.ljust(14) for h in head))
    for cls, ours, fts, counts in rows:
        mo, mf = statistics.median(ours), statistics.median(fts)
        cells = (cls, ms(mo), ms(p95(ours)), ms(mf), ms(p95(fts)), f"{mo / mf:.2f}", counts)
        if md:
            print("| " + " | ".join(cells) + " |")
        else:
            print("  ".join(c.ljust(14) for c in cells))


# The worst searches found so far (issue 13), by family. Multi-word queries whose words are
# found mostly inside longer words ("hello", "thing"): the words-only pass holds 20 hits below
# 0.5 and cannot stop on the 0.5 bound alone. Long queries of one common term: every gram of
# the phrase is common, the phrase itself is in no message. Many distinct common terms. A term
# in almost every message with limit 1. Glued common terms that match nothing.
WORST_CASES: list[tuple[str, str, int]] = [
    ("lo lo", "lo lo", LIMIT),
    ("ing ing", "ing ing", LIMIT),
    ("ll ll", "ll ll", LIMIT),
    ("er er er", "er er er", LIMIT),
    ("tion tion", "tion tion", LIMIT),
    ("ally ally", "ally ally", LIMIT),
    ("ing ing ... (4096 bytes)", " ".join(["ing"] * 1024)[:4096], LIMIT),
    ("at at ... (4096 bytes)", " ".join(["at"] * 1366)[:4096], LIMIT),
    ("the the ... (4095 bytes)", " ".join(["the"] * 1024), LIMIT),
    ("13 common words", "the you and to of it is that in what do for have", LIMIT),
    ("what the you and", "what the you and", LIMIT),
    ("e, limit 1", "e", 1),
    ("the, limit 1", "the", 1),
    ("thethe (no match)", "thethe", LIMIT),
    ("ingthe atthe (no match)", "ingthe atthe", LIMIT),
]
INSIDE_WORDS = {label: q for label, q, _ in WORST_CASES[:8]}  # for the scan table
# FTS5 is not timed on the 4 KB queries: once each on this machine, 1,024 AND-ed "ing" terms
# took 443 s (MATCH) and the 4 KB `at at …` 35 s (LIKE, no row).
_FTS_MAX_QUERY: Final = 256


def load_baseline(path: str) -> type[SearchIndex]:
    """`SearchIndex` from another copy of search_index.py (e.g. `git show
    OLD:convmem_engine/index/search_index.py > /tmp/old.py`), to time it on the same index
    in the same run. Its index attributes must be the current ones (same layout)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("baseline_search_index", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cls: type[SearchIndex] = module.SearchIndex
    return cls


def cpu_timed(fn: Callable[[], int], repeat: int) -> tuple[list[float], list[float]]:
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    return wall, cpu


def worst_cases(
    idx: SearchIndex,
    messages: dict[str, Message],
    db: sqlite3.Connection | None,
    repeat: int,
    md: bool,
    baseline: type[SearchIndex] | None = None,
) -> dict[str, float]:
    """The worst queries: our median (wall and CPU), FTS5's, and with --baseline the other
    implementation's CPU median on the same index (runs interleaved; results must be equal).
    Returns our median wall time of each, in ms, by label."""
    ours_ms: dict[str, float] = {}
    old: SearchIndex | None = None
    if baseline is not None:
        old = baseline.__new__(baseline)
        old.__dict__ = idx.__dict__  # the same index data, searched by the other code
    print(
        f"\nworst cases ({repeat} runs each; load average {os.getloadavg()[0]:.1f}): "
        "median wall / CPU, hits, worst hit score"
    )
    head = ["query", "limit", "ours wall", "ours CPU"]
    if old is not None:
        head += ["baseline CPU", "baseline/ours"]
    if db is not None:
        head += ["FTS5 wall", "ours/FTS5"]
    head += ["hits", "worst"]
    if md:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    for label, q, limit in WORST_CASES:

        def search(q: str = q, limit: int = limit) -> int:
            return len(idx.search(q, messages, limit=limit))

        wall, cpu = cpu_timed(search, repeat)
        ours_ms[label] = statistics.median(wall) * 1000
        hits = idx.search(q, messages, limit=limit)
        cells = [label, str(limit), ms(statistics.median(wall)), ms(statistics.median(cpu))]
        if old is not None:

            def before(q: str = q, limit: int = limit, old: SearchIndex = old) -> int:
                return len(old.search(q, messages, limit=limit))

            old_hits = old.search(q, messages, limit=limit)
            assert [(h.message_id, h.score) for h in old_hits] == [
                (h.message_id, h.score) for h in hits
            ], label
            b_cpu: list[float] = []
            n_cpu: list[float] = []
            for _ in range(repeat):  # interleaved, so both see the same load
                b_cpu += cpu_timed(before, 1)[1]
                n_cpu += cpu_timed(search, 1)[1]
            b_med, n_med = statistics.median(b_cpu), statistics.median(n_cpu)
            cells[3] = ms(n_med)
            cells += [ms(b_med), f"{b_med / n_med:.1f}"]
        if db is not None and len(q) > _FTS_MAX_QUERY:
            cells += ["(minutes)", "-"]
        elif db is not None:
            sql, args = fts_sql(q, None, limit)

            def fts(sql: str = sql, args: tuple[str, ...] = args) -> int:
                return len(db.execute(sql, args).fetchall())

            f_wall, _ = timed(fts, repeat)
            cells += [
                ms(statistics.median(f_wall)),
                f"{statistics.median(wall) / statistics.median(f_wall):.2f}",
            ]
        cells += [str(len(hits)), str(hits[-1].score) if hits else "-"]
        print(("| " + " | ".join(cells) + " |") if md else "  ".join(c.ljust(12) for c in cells))
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return ours_ms


def scan_vs_index(idx: SearchIndex, messages: dict[str, Message], repeat: int, md: bool) -> None:
    """`SearchIndex.scan` (every message scored; what the service answers with while its index
    builds in the background) next to `search` on the finished index; same results checked."""
    print(f"\nscan without the index vs the index (top {LIMIT}, {repeat} runs per query)")
    head = ("query class", "scan median", "scan p95", "index median", "scan/index")
    if md:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    all_s: list[float] = []
    all_i: list[float] = []
    for cls, qs in [*QUERIES.items(), ("inside words", list(INSIDE_WORDS.values()))]:
        s_t: list[float] = []
        i_t: list[float] = []
        for q in qs:
            assert SearchIndex.scan(q, messages, limit=LIMIT) == idx.search(
                q, messages, limit=LIMIT
            ), q

            def scan(q: str = q) -> int:
                return len(SearchIndex.scan(q, messages, limit=LIMIT))

            def search(q: str = q) -> int:
                return len(idx.search(q, messages, limit=LIMIT))

            s_t += timed(scan, repeat)[0]
            i_t += timed(search, repeat)[0]
        all_s += s_t
        all_i += i_t
        row(md, cls, s_t, i_t)
    row(md, "all queries", all_s, all_i)


def row(md: bool, name: str, scan_t: list[float], index_t: list[float]) -> None:
    s_med, i_med = statistics.median(scan_t), statistics.median(index_t)
    cells = (name, ms(s_med), ms(p95(scan_t)), ms(i_med), f"{s_med / i_med:.0f}")
    print(("| " + " | ".join(cells) + " |") if md else "  ".join(c.ljust(14) for c in cells))


def maintenance(idx: SearchIndex, messages: dict[str, Message]) -> None:
    """Per-operation cost of keeping the index current (oldest messages: longest memmoves)."""
    sample = list(messages.values())[:1000]
    t0 = time.perf_counter()
    for m in sample:
        idx.remove(m)
    t1 = time.perf_counter()
    for m in sample:
        idx.add(m)
    t2 = time.perf_counter()
    edited = [dataclasses.replace(m, content=m.content + " (edited)", revision=2) for m in sample]
    for old, new in zip(sample, edited, strict=True):
        idx.replace(old, new)
    t3 = time.perf_counter()
    for old, new in zip(sample, edited, strict=True):
        idx.replace(new, old)
    t4 = time.perf_counter()
    t5 = time.perf_counter()
    problems = idx.check(messages)
    t6 = time.perf_counter()
    n = len(sample)
    print(
        f"maintenance, per message: remove {(t1 - t0) / n * 1e6:.0f} us (oldest 1,000), "
        f"add {(t2 - t1) / n * 1e6:.0f} us, replace {(t3 - t2 + t4 - t3) / (2 * n) * 1e6:.0f} us; "
        f"check() {t6 - t5:.1f} s ({len(problems)} problems)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7, help="runs of each query (default 7)")
    ap.add_argument("--tracemalloc", action="store_true", help="also trace a second build")
    ap.add_argument("--markdown", action="store_true", help="print tables as Markdown")
    ap.add_argument(
        "--only-new",
        action="store_true",
        help="only the worst-case and scan-vs-index tables (skips FTS5 and the other tables)",
    )
    ap.add_argument(
        "--worst-only",
        action="store_true",
        help="only the worst-case table, with FTS5 (builds both indexes, nothing else)",
    )
    ap.add_argument(
        "--baseline",
        metavar="PATH",
        help="a search_index.py to time next to ours on the worst cases (same index layout)",
    )
    ap.add_argument(
        "--messages",
        type=int,
        default=0,
        help="that many messages (the corpus repeated), e.g. 1000000: the build, the default "
        "table and the worst cases only",
    )
    ap.add_argument(
        "--summary-json",
        metavar="PATH",
        help="with --messages: also write the build's CPU, the all-queries medians and the "
        "worst case, ours and FTS5's, to PATH (bench_mcp.py's FTS5 section)",
    )
    args = ap.parse_args()
    if args.summary_json and not args.messages:
        ap.error("--summary-json needs --messages")
    baseline = load_baseline(args.baseline) if args.baseline else None
    md = args.markdown

    t0 = time.perf_counter()
    messages = make_messages(0.0, args.messages)
    print(
        f"corpus: {len(messages)} messages, {sum(len(m.content) for m in messages.values())} "
        f"code points, loaded in {time.perf_counter() - t0:.1f} s; RSS {current_rss() / 1e6:.0f} MB"
    )

    idx, ours_build, ours_cpu, ours_rss = build_ours(messages)
    if args.only_new:
        print(f"build: ours {ours_build:.1f} s; load average {os.getloadavg()[0]:.1f}")
        worst_cases(idx, messages, None, args.repeat, md, baseline)
        scan_vs_index(idx, messages, max(1, args.repeat // 3), md)
        return
    db, _rowids, fts_build, fts_cpu, fts_rss = build_fts(messages)
    print(
        f"build: ours {ours_build:.1f} s ({ours_cpu:.2f} s CPU), "
        f"FTS5 trigram {fts_build:.1f} s ({fts_cpu:.2f} s CPU): CPU ratio "
        f"{ours_cpu / fts_cpu:.2f}; load average {os.getloadavg()[0]:.1f}"
    )
    print(f"build by add() of each message: {add_one_by_one(messages):.2f} s CPU")
    if args.worst_only:
        worst_cases(idx, messages, db, args.repeat, md, baseline)
        return
    if args.messages:
        rows = run_queries(idx, messages, db, QUERIES, args.repeat)
        print_table(f"default (top {LIMIT}, {args.repeat} runs per query)", rows, md)
        worst = worst_cases(idx, messages, db, args.repeat, md, baseline)
        if args.summary_json:
            _label, ours_all, fts_all, _counts = rows[-1]  # the "all queries" row
            worst_label = max(worst, key=worst.__getitem__)
            summary = {
                "messages": len(messages),
                "build_cpu_s": {"ours": ours_cpu, "fts5": fts_cpu},
                "median_ms": {
                    "ours": statistics.median(ours_all) * 1000,
                    "fts5": statistics.median(fts_all) * 1000,
                },
                "worst_ms": worst[worst_label],
                "worst_query": worst_label,
            }
            Path(args.summary_json).write_text(json.dumps(summary, indent=1))
        return
    print(
        f"memory: ours RSS delta {ours_rss / 1e6:.0f} MB, "
        f"memory_bytes() {idx.memory_bytes() / 1e6:.0f} MB; "
        f"FTS5 (in-memory db) RSS delta {fts_rss / 1e6:.0f} MB"
    )
    load_vs_build(idx, messages, ours_build, fts_build)
    if args.tracemalloc:
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        traced = SearchIndex()
        traced.build(messages.values())
        print(
            f"memory: ours tracemalloc {(tracemalloc.get_traced_memory()[0] - base) / 1e6:.0f} MB"
        )
        tracemalloc.stop()
        del traced
    print(f"process RSS now {current_rss() / 1e6:.0f} MB")

    print_table(
        f"default (top {LIMIT}, {args.repeat} runs per query)",
        run_queries(idx, messages, db, QUERIES, args.repeat),
        md,
    )

    # One long conversation in the middle of the corpus for the session-scoped runs.
    sessions: dict[str, int] = {}
    for m in messages.values():
        sessions[m.session_id] = sessions.get(m.session_id, 0) + 1
    names = list(sessions)
    session = max(names[len(names) // 2 : len(names) // 2 + 50], key=sessions.__getitem__)
    scoped = {"frequent word": QUERIES["frequent word"], "medium word": QUERIES["medium word"]}
    print_table(
        f"session-scoped, search(session_id=...) ({sessions[session]} messages in the session)",
        run_queries(idx, messages, db, scoped, args.repeat, session),
        md,
    )
    print_table(
        "session-scoped, the same through accept= only (no session list)",
        run_queries(idx, messages, db, scoped, args.repeat, session, "accept"),
        md,
    )

    worst_cases(idx, messages, db, args.repeat, md, baseline)
    scan_vs_index(idx, messages, max(1, args.repeat // 3), md)

    maintenance(idx, messages)  # last: it renumbers 1,000 messages
    del idx
    mixed = make_messages(0.01)
    idx, _, _, _ = build_ours(mixed)
    print_table(
        "mixed importance (1% of messages at 90)",
        run_queries(idx, mixed, db, QUERIES, args.repeat),
        md,
    )


if __name__ == "__main__":
    main()
