"""The search index's CPU per written message, as the service's background flush spends it:
two or more checkouts side by side in ONE process, on the same loaded index state.

For each `--tree NAME=DIR` this process imports that checkout's `convmem_engine` (the modules of
the previous one are moved aside first, so every tree keeps its own classes and functions),
opens its own copy of `--store` (a corpus store such as /tmp/s5/258k, copied to `--dir`; or
`empty`) with that tree's `MemoryService`, waits for its search index (loaded from search.idx)
and keeps it. Then the same new messages go to every tree's index in turns, `--block` at a
time (the trees take turns block by block, the order turned each block), each block timed
with `time.thread_time()` (this thread's CPU: nothing else runs), through that tree's own
flush step, `index_set._apply_search_changes(index, batch, pause=_pauser())`, in batches of
`--batch` adds (1: one add per flush step; the flush's batches while one host writes are
5-15). Every index receives exactly the same adds in the same order.

Texts (`--texts`, default `corpus`): `corpus` (the chitchat corpus' messages, as bench_mcp and
bench_pipe write them: ~48 characters on average), `long` (~210-character runs of corpus
lines, as bench_write_index writes them), `lorem` (bench_pipe's `--content lorem`, "lorem ipsum
dolor sit amet " * 20). New documents cross into a new 65,536-document container where the
store's count does (the 258k store after ~4,000 adds: those adds cost more).

`NAME=DIR@FROM,CHARS` runs that tree with another batching rule (`_apply_search_changes`'s
batch_from and batch_chars: `@0,0` makes every run of 2 or more adds one `add_many` batch, and
`@0,1000000000` adds them one by one): the same checkout twice, under two names, compares
`add_many` with `add` on the same index.

Prints per tree and text kind the median and the mean of the blocks' CPU per message (us), and
each tree's ratio to the first tree's (per block, then the median).

Also `--grams`: the gram extraction alone (`search_text._grams`) of each tree on the same
messages, in the same process.

Usage: python bench/bench_index_add.py --tree before=/tmp/s9/before --tree after=.
       [--tree many=.@0,0 --tree one=.@0,1000000000]
       [--store /tmp/s5/258k] [--texts corpus,long] [--messages 4000] [--block 50]
       [--batch 1] [--dir /dev/shm] [--grams]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from corpus import load_corpus  # noqa: E402

LOREM = "lorem ipsum dolor sit amet " * 20


def texts(kind: str, n: int) -> list[str]:
    corpus = load_corpus()
    if kind == "lorem":
        return [LOREM] * n
    if kind == "corpus":  # as bench_mcp picks them
        return [corpus[(i * 37 + 11) % len(corpus)][2] for i in range(n)]
    if kind == "long":  # as bench_write_index makes them
        out: list[str] = []
        cur = ""
        for _, _, c in corpus[-200_000:]:
            cur = f"{cur} {c}".strip()
            if len(cur) >= 200:
                out.append(cur[:230])
                cur = ""
                if len(out) == n:
                    break
        return out
    raise SystemExit(f"--texts: unknown kind {kind!r}")


class Tree:
    """One checkout's modules, a service on its own store copy, and its loaded index."""

    def __init__(self, name: str, spec: str, store: str, work: str) -> None:
        self.name = name
        path, _, policy = spec.partition("@")
        # `@FROM,CHARS`: the flush's batching rule (index size, run characters) for this tree
        self.policy: dict[str, int] = {}
        if policy:
            batch_from, batch_chars = map(int, policy.split(","))
            self.policy = {"batch_from": batch_from, "batch_chars": batch_chars}
        for mod in [m for m in sys.modules if m.split(".")[0] == "convmem_engine"]:
            del sys.modules[mod]  # (the previous tree's objects keep their own modules)
        sys.path.insert(0, path)
        try:
            importlib.invalidate_caches()
            service = importlib.import_module("convmem_engine.service")
            index_set = importlib.import_module("convmem_engine.service.index_set")
            text = importlib.import_module("convmem_engine.index.search_text")
            domain = importlib.import_module("convmem_engine.domain")
            ids = importlib.import_module("convmem_engine.service.ids")
        finally:
            sys.path.remove(path)
        assert os.path.dirname(service.__file__).startswith(os.path.realpath(path)), service
        data = os.path.join(work, name)
        if store != "empty":
            shutil.copytree(store, data)
        self.svc = service.MemoryService.open(data)
        assert self.svc.wait_for_search_index(timeout=900)
        self.index = self.svc._indexes.search_index
        self.apply: Callable[..., None] = index_set._apply_search_changes
        self.pauser: Callable[[], Callable[[], None]] = index_set._pauser
        self.grams: Callable[[Any], object] = text._grams
        self.message = domain.Message
        self.ulid_text: Callable[[int], str] = ids.ulid_text
        self.count = len(self.index)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--tree", action="append", required=True, help="NAME=DIR[@FROM,CHARS] (2 or more)"
    )
    ap.add_argument("--store", default="empty", help="a store to copy, or `empty`")
    ap.add_argument("--dir", default="/dev/shm", help="where the store copies go")
    ap.add_argument("--texts", default="corpus")
    ap.add_argument("--messages", type=int, default=4000, help="adds per text kind")
    ap.add_argument("--block", type=int, default=50, help="adds per timed block")
    ap.add_argument("--batch", type=int, default=1, help="adds per flush step")
    ap.add_argument("--grams", action="store_true", help="also time _grams alone")
    args = ap.parse_args()
    load_corpus()
    work = tempfile.mkdtemp(prefix="bench-index-add-", dir=args.dir)
    try:
        t0 = time.perf_counter()
        trees = [Tree(*spec.split("=", 1), args.store, work) for spec in args.tree]
        print(
            f"store {args.store} ({trees[0].count:,} messages), loaded in "
            f"{time.perf_counter() - t0:.1f} s; load average {os.getloadavg()[0]:.2f}; "
            f"batch {args.batch}, block {args.block}"
        )
        gc.collect()
        gc.freeze()
        stamp = 0x7F0000000000 << 80  # ids above any the store holds, ascending
        for kind in args.texts.split(","):
            pool = texts(kind, args.messages)
            per: dict[str, list[float]] = {t.name: [] for t in trees}
            if args.grams:
                for b in range(0, len(pool), args.block):
                    for t in trees if b // args.block % 2 == 0 else trees[::-1]:
                        msgs = [
                            t.message(
                                message_id=t.ulid_text(stamp + i),
                                session_id="s",
                                timestamp=1,
                                role="user",
                                content=c,
                            )
                            for i, c in enumerate(pool[b : b + args.block])
                        ]
                        c0 = time.thread_time()
                        for m in msgs:
                            t.grams(m)
                        per[t.name].append((time.thread_time() - c0) / len(msgs) * 1e6)
                report(f"{kind}: _grams alone", per, trees)
                per = {t.name: [] for t in trees}
            for b in range(0, len(pool), args.block):
                for t in trees if b // args.block % 2 == 0 else trees[::-1]:
                    msgs = [
                        t.message(
                            message_id=t.ulid_text(stamp + b + i),
                            session_id=f"bench-{(b + i) // 20}",
                            timestamp=1_900_000_000_000 + b + i,
                            role="user",
                            content=c,
                        )
                        for i, c in enumerate(pool[b : b + args.block])
                    ]
                    changes = [("add", m, None) for m in msgs]
                    pause = t.pauser()
                    c0 = time.thread_time()
                    for k in range(0, len(changes), args.batch):
                        t.apply(t.index, changes[k : k + args.batch], pause=pause, **t.policy)
                    per[t.name].append((time.thread_time() - c0) / len(msgs) * 1e6)
            stamp += len(pool)
            report(f"{kind}: add (flush step of {args.batch})", per, trees)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(what: str, per: dict[str, list[float]], trees: list[Tree]) -> None:
    base = per[trees[0].name]
    print(f"  {what}, us per message (median / mean of blocks; ratio to {trees[0].name}):")
    for t in trees:
        xs = per[t.name]
        ratio = statistics.median(x / b for x, b in zip(xs, base, strict=True) if b > 0)
        print(
            f"    {t.name:10} {statistics.median(xs):8.1f} / {statistics.fmean(xs):8.1f}"
            f"   x{ratio:.3f}"
        )


if __name__ == "__main__":
    main()
