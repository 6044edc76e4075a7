"""Power loss, modelled in the filesystem seam (storage_helpers.PowerLossFS): a cut before every
filesystem step of writes, group commits, snapshot writing, compaction, a format upgrade and
the creation of a new data dir, each with three tails (only what fsync covered; plus a prefix
of the unsynced rest; plus a zero-filled rest up to the size), and random cuts under concurrent
writers with a compactor. After each cut the store is reopened from disk with the real
filesystem: every acknowledged operation is there, nothing else changed, the self-check passes.

A fourth tail, "blocks", reorders within a file: each 4 KiB block of the unsynced rest holds
its new data or zeros. A zeroed block before a kept one is a hole that the store cannot tell
from damage to synced data, so the open may also refuse with CORRUPT_STORE (naming the file
and the offset, changing nothing); it must never open without an acknowledged write or with
anything unacknowledged in the middle. The tests count how often each happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from reliability_log import Tally
from storage_helpers import BLOCK, REORDERED, TAILS, UNTRACKED, Crash, PowerLossFS, make_message

from convmem_engine.domain import CorruptStoreError, Message, StoreIOError
from convmem_engine.storage import Store
from convmem_engine.transfer.repair import looks_like_a_power_cut, repair_store

State = dict[str, Message]


def edited(m: Message, what: str = "edited") -> Message:
    return Message(
        m.message_id,
        m.session_id,
        m.timestamp,
        m.role,
        f"{m.content} ({what})",
        m.revision + 1,
        m.updated_at + 1,
        m.metadata,
    )


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, State]:
    """A store with history: a snapshot, and a tail of records after it."""
    d = tmp_path_factory.mktemp("power") / "store"
    msgs = [make_message(f"template {i} " + "x" * 300) for i in range(12)]
    with Store.open(d) as s:
        for m in msgs[:8]:
            s.put(m)
        s.update(edited(msgs[0]))
        s.delete(msgs[1].message_id)
    s = Store.open(d)
    for m in msgs[8:]:
        s.put(m)
    s.delete(msgs[2].message_id)
    state = dict(s.messages)
    s._abandon()  # no snapshot at close: the tail is replayed
    return d, state


class Holder:
    store: Store | None = None


def S(h: Holder) -> Store:
    assert h.store is not None
    return h.store


Op = tuple[str, Callable[[Holder], object], Callable[[State], list[State]]]


def _put(m: Message) -> Callable[[State], list[State]]:
    return lambda st: [{**st, m.message_id: m}]


def _update(m: Message) -> Callable[[State], list[State]]:
    return lambda st: [{**st, m.message_id: m}]


def _delete(mid: str) -> Callable[[State], list[State]]:
    return lambda st: [{k: v for k, v in st.items() if k != mid}]


def _same(st: State) -> list[State]:
    return [st]


def _batch(ms: list[Message]) -> Callable[[State], list[State]]:
    def after(st: State) -> list[State]:
        out = [st]
        for m in ms:
            out.append({**out[-1], m.message_id: m})
        return out

    return after


def _open(d: Path, fs: PowerLossFS) -> Callable[[Holder], object]:
    def op(h: Holder) -> None:
        h.store = Store.open(d, fs=fs)

    return op


def _close(h: Holder) -> None:
    assert h.store is not None
    S(h).close()


def _group_commit(ms: list[Message]) -> Callable[[Holder], object]:
    def op(h: Holder) -> None:
        assert h.store is not None
        seq = 0
        for m in ms:
            seq = S(h).write_put(m)
        S(h).sync(seq)

    return op


def history_ops(d: Path, fs: PowerLossFS, state: State) -> list[Op]:
    """Writes, a group commit, deletes, compactions, closes (snapshots) and a reopen."""
    ids = list(state)
    new = [make_message(f"power {i} " + "y" * (200 + 1500 * (i % 3))) for i in range(7)]
    first = state[ids[0]]
    return [
        ("open", _open(d, fs), _same),
        ("put", lambda h: S(h).put(new[0]), _put(new[0])),
        ("update", lambda h: S(h).update(edited(first)), _update(edited(first))),
        ("group commit", _group_commit(new[1:4]), _batch(new[1:4])),
        ("delete", lambda h: S(h).delete(new[0].message_id), _delete(new[0].message_id)),
        ("compact", lambda h: S(h).compact(), _same),
        ("put", lambda h: S(h).put(new[4]), _put(new[4])),
        ("close", _close, _same),
        ("reopen", _open(d, fs), _same),
        (
            "update",
            lambda h: S(h).update(edited(new[1], "again")),
            _update(edited(new[1], "again")),
        ),
        ("delete", lambda h: S(h).delete(ids[3]), _delete(ids[3])),
        ("compact", lambda h: S(h).compact(), _same),
        ("put", lambda h: S(h).put(new[5]), _put(new[5])),
        ("close", _close, _same),
    ]


def run_until_cut(ops: list[Op], start: State) -> tuple[list[State], str]:
    """Run the ops until one raises Crash; the states the store may be in after the cut."""
    h = Holder()
    state = start
    for name, op, after in ops:
        outcomes = after(state)
        try:
            op(h)
        except Crash:
            return [state, *outcomes], name  # the op in flight: not done, or any outcome
        state = outcomes[-1]  # returned: acknowledged
    return [state], "none"


def reopen_state(d: Path) -> State:
    with Store.open(d) as s:
        assert s.check() == []
        assert not any(n.endswith(".tmp") for n in os.listdir(d))
        return dict(s.messages)


REFUSAL = re.compile(r"active\.log: corrupt record at offset (\d+): .+")
BLOCKS = "each 4 KiB block of the unsynced tail kept or zeroed (reordering)"
HOLE = "unsynced rest in 2+ blocks, a hole"


def data_files(d: Path) -> dict[str, bytes]:
    """Every file of the data dir but the lock files (no data; a refused open releases the
    lock, which removes lock.pid), with its bytes."""
    return {p.name: p.read_bytes() for p in d.iterdir() if p.name not in UNTRACKED}


def reopen_or_refusal(
    d: Path, fs: PowerLossFS, tally: Tally, outcomes: Counter[str], *, synced_end: bool
) -> State:
    """After a cut with the "blocks" tail: the reopened state. A refusal is allowed only when
    the cut left a hole in the log: CORRUPT_STORE naming active.log and the offset of a record
    inside the file (with `synced_end`: at or after everything the last fsync covered, so after
    every acknowledged record), every other file as it was. Then the salvage docs/app.md
    gives a person (a copy of the data dir, its log cut at the named offset) must open, and
    its state is returned: the caller checks it like any reopened state (every acknowledged
    write, in order)."""
    before = data_files(d)
    log = os.path.join(fs.root, "active.log")
    try:
        got = reopen_state(d)
    except CorruptStoreError as e:
        outcomes[_situation(fs, log) + ": refused"] += 1
        after = data_files(d)
        if after != before:
            tally.changed += 1
        if log not in fs.holes:
            tally.crashed += 1  # a reordering that left no hole is a zero-filled tail
        assert after == before, f"a refused open changed the data dir: {e}"
        assert log in fs.holes, f"refused without a hole in the log: {e}"
        match = REFUSAL.fullmatch(str(e))
        assert match is not None, str(e)
        offset = int(match[1])
        assert offset < len(before["active.log"]), str(e)
        if synced_end:
            assert offset >= fs.holes[log], (str(e), fs.holes[log])
        if looks_like_a_power_cut(d, offset):  # the app offers its Repair button
            outcomes["refused, the app's Repair button offered"] += 1
        else:  # a synced end inside a record just before a block boundary (repair.py says so)
            assert not synced_end, ("the app would offer no Repair button", str(e))
            outcomes["refused, no Repair button (the command repairs it)"] += 1
        return salvaged_state(d, offset)
    outcomes[_situation(fs, log) + ": opened"] += 1
    return got


def salvaged_state(d: Path, offset: int) -> State:
    """What `convmem repair` (docs/app.md, "The memory store is damaged") leaves, run on a copy
    of the data dir: its active.log cut at the offset the refusal named, the damaged files
    aside, unchanged."""
    copy = d.parent / f"{d.name}-salvaged"
    shutil.copytree(d, copy, ignore=shutil.ignore_patterns(*UNTRACKED))
    try:
        report = repair_store(copy)
        assert report.offset == offset, (report, offset)
        assert report.aside is not None
        assert (Path(report.aside) / "active.log").read_bytes() == (d / "active.log").read_bytes()
        shutil.rmtree(report.aside)
        return reopen_state(copy)
    finally:
        shutil.rmtree(copy)


def _situation(fs: PowerLossFS, log: str) -> str:
    """What the cut left of the log's unsynced rest: where reordering could show."""
    if log not in fs.unsynced:
        return "log all synced"
    synced, size = fs.unsynced[log]
    if size - (synced - synced % BLOCK) <= BLOCK:
        return "unsynced rest in 1 block"
    return HOLE if log in fs.holes else "unsynced rest in 2+ blocks, no hole"


def report(outcomes: Counter[str], what: str) -> None:
    """Print how often the open succeeded and refused, and in which situations (`-s` shows
    it), then check what docs/storage-format.md says: a later block of the unsynced tail
    without an earlier one is CORRUPT_STORE (data after a hole cannot be told from damage to
    synced records)."""
    cases = sum(n for key, n in outcomes.items() if key.endswith((": opened", ": refused")))
    refused = sum(n for key, n in outcomes.items() if key.endswith(": refused"))
    print(
        f"{what}: {cases} cuts, opened {cases - refused}, refused {refused}; "
        + ", ".join(f"{key} {n}" for key, n in sorted(outcomes.items()))
    )
    assert outcomes[f"{HOLE}: opened"] == 0


def sweep(
    tmp_path: Path,
    make_dir: Callable[[Path], Path],
    make_ops: Callable[[Path, PowerLossFS, State], list[Op]],
    start: State,
    tally: Tally,
    tails: tuple[str, ...] = TAILS,
    seeds: int = 1,
    outcomes: Counter[str] | None = None,
) -> int:
    """Count the steps of the whole history, then cut before each one (every tail). The
    "blocks" tail may end in a refusal (reopen_or_refusal), counted in `outcomes`."""
    outcomes = Counter() if outcomes is None else outcomes
    d = make_dir(tmp_path / "count")
    counter = PowerLossFS(d)
    run_until_cut(make_ops(d, counter, start), start)
    total = len(counter.steps)
    assert total > 10
    for k in range(1, total + 1):
        for tail in tails:
            for seed in range(seeds):
                d = make_dir(tmp_path / f"{k}-{tail}-{seed}")
                fs = PowerLossFS(d, k, tail=tail, seed=seed * 1000 + k)
                allowed, in_flight = run_until_cut(make_ops(d, fs, start), start)
                assert fs.fired, k
                fs.power_cut()
                if tail == REORDERED:
                    got = reopen_or_refusal(d, fs, tally, outcomes, synced_end=True)
                else:
                    got = reopen_state(d)
                tally.cases += 1
                if got not in allowed:
                    tally.lost += 1
                assert got in allowed, (k, counter.steps[k - 1], in_flight, tail, seed)
                assert next(list(a) for a in allowed if a == got) == list(got)  # order too
                shutil.rmtree(d)
    return total


def test_power_cut_before_every_step_of_a_history(
    template: tuple[Path, State], tmp_path: Path
) -> None:
    src, state = template

    def copy(p: Path) -> Path:
        shutil.copytree(src, p)
        return p

    what = "writes, group commit, compaction, snapshot at close, reopen"
    with Tally(f"power cut before every filesystem step ({what})") as tally:
        total = sweep(tmp_path, copy, history_ops, state, tally)
    assert tally.cases == total * len(TAILS)


def test_power_cut_before_every_step_of_creating_a_data_dir(tmp_path: Path) -> None:
    msgs = [make_message(f"first ever {i}") for i in range(3)]

    def parent(p: Path) -> Path:
        p.mkdir()
        return p / "new" / "data"  # two directories to create

    def ops(d: Path, fs: PowerLossFS, _: State) -> list[Op]:
        return [
            ("open", _open(d, fs), _same),
            ("put", lambda h: S(h).put(msgs[0]), _put(msgs[0])),
            ("group commit", _group_commit(msgs[1:]), _batch(msgs[1:])),
            ("close", _close, _same),
        ]

    with Tally("power cut before every filesystem step of creating a data dir") as tally:
        sweep(tmp_path, parent, ops, {}, tally)


def test_a_new_data_dir_whose_parent_is_not_fsynced_is_lost_in_the_model(
    tmp_path: Path,
) -> None:
    """The model is strict enough to matter: without the fsync of the parent after creating
    the data dir, an acknowledged write disappears with the directory entry."""

    class NoParentFsync(PowerLossFS):
        def fsync_dir(self, path: str) -> None:
            if os.path.abspath(path) != os.path.abspath(self.root):
                return
            super().fsync_dir(path)

    d = tmp_path / "data"
    fs = NoParentFsync(d)
    s = Store.open(d, fs=fs)
    s.put(make_message("acknowledged"))
    fs.power_cut()
    assert not d.exists()


def test_power_cut_before_every_step_of_a_format_upgrade(tmp_path: Path) -> None:
    fixture = Path(__file__).parent / "fixtures" / "store-v2"
    want = json.loads((fixture / "expected.json").read_text("utf-8"))
    extra = make_message("after the upgrade", message_id="01K" + "8" * 23)

    def copy(p: Path) -> Path:
        shutil.copytree(fixture, p)
        (p / "expected.json").unlink()
        os.chmod(p, 0o700)
        return p

    with Store.open(copy(tmp_path / "probe")) as s:
        start = dict(s.messages)
    assert [m.to_json() for m in start.values()] == want

    def ops(d: Path, fs: PowerLossFS, _: State) -> list[Op]:
        return [
            ("open (upgrade)", _open(d, fs), _same),
            ("put", lambda h: S(h).put(extra), _put(extra)),
            ("close", _close, _same),
        ]

    with Tally("power cut before every filesystem step of a format upgrade") as tally:
        sweep(tmp_path, copy, ops, start, tally)


def _writer(
    s: Store, rng: random.Random, prefix: str, acked: State, pending: list[list[State]]
) -> None:
    """Random puts/updates/deletes on its own messages; `acked` follows what returned,
    `pending[0]` the outcomes of the op in flight."""
    n = 0
    try:
        for _ in range(60):
            live = list(acked)
            r = rng.random()
            if r < 0.5 or not live:
                n += 1
                m = make_message(f"{prefix} {n} " + "z" * rng.randint(10, 3000))
                pending[0] = [dict(acked), {**acked, m.message_id: m}]
                s.put(m)
                acked[m.message_id] = m
            elif r < 0.8:
                m = edited(acked[rng.choice(live)], "w")
                pending[0] = [dict(acked), {**acked, m.message_id: m}]
                s.update(m)
                acked[m.message_id] = m
            else:
                mid = rng.choice(live)
                pending[0] = [dict(acked), {k: v for k, v in acked.items() if k != mid}]
                s.delete(mid)
                del acked[mid]
            pending[0] = [dict(acked)]
    except (Crash, StoreIOError):
        pass


def _compactor(s: Store, stop: threading.Event) -> None:
    with contextlib.suppress(Crash, StoreIOError):
        while not stop.wait(0.01):
            s.compact()


def random_cuts(
    tmp_path: Path,
    cuts: int,
    writers: int = 4,
    tails: tuple[str, ...] = TAILS,
    outcomes: Counter[str] | None = None,
) -> Tally:
    """The "blocks" tail may end in a refusal (reopen_or_refusal), counted in `outcomes`."""
    what = f"random power cut under {writers} concurrent writers and compaction"
    tally = Tally(what + (f", {BLOCKS}" if tails == (REORDERED,) else ""))
    outcomes = Counter() if outcomes is None else outcomes
    names = {f"w{w}" for w in range(writers)}
    with tally:
        for i in range(cuts):
            rng = random.Random(i)
            d = tmp_path / f"cut{i}"
            fs = PowerLossFS(d, tail=tails[i % len(tails)], seed=i)
            s = Store.open(d, fs=fs)
            fs.fail_at = len(fs.steps) + rng.randint(1, 400)
            acked: list[State] = [{} for _ in range(writers)]
            pending: list[list[list[State]]] = [[[{}]] for _ in range(writers)]
            stop = threading.Event()
            threads = [
                threading.Thread(
                    target=_writer,
                    args=(s, random.Random(i * 100 + w), f"w{w}", acked[w], pending[w]),
                )
                for w in range(writers)
            ]
            threads.append(threading.Thread(target=_compactor, args=(s, stop)))
            for t in threads:
                t.start()
            for t in threads[:-1]:
                t.join(120)
            stop.set()
            threads[-1].join(120)
            assert not any(t.is_alive() for t in threads)
            fs.power_cut()  # the cut (if no step reached fail_at: after everything)
            if fs.tail == REORDERED:
                # several writers: what the model read before an fsync may end inside a record
                # being written, so the refused offset may lie before that synced end
                got = reopen_or_refusal(d, fs, tally, outcomes, synced_end=False)
            else:
                got = reopen_state(d)
            tally.cases += 1
            for w in range(writers):
                mine = {k: v for k, v in got.items() if v.content.startswith(f"w{w} ")}
                allowed = pending[w][0] + [acked[w]]
                if mine not in allowed:
                    tally.lost += 1
                assert mine in allowed, (i, w)
            # nothing invented: every message belongs to a writer
            assert all(v.content.split(" ", 1)[0] in names for v in got.values())
            shutil.rmtree(d)
    return tally


def test_random_power_cuts_under_concurrent_writers(tmp_path: Path) -> None:
    random_cuts(tmp_path, cuts=6)


@pytest.mark.slow
def test_many_random_power_cuts_under_concurrent_writers(tmp_path: Path) -> None:
    random_cuts(tmp_path, cuts=200)


@pytest.mark.slow
def test_power_cut_sweep_with_many_tail_sizes(template: tuple[Path, State], tmp_path: Path) -> None:
    src, state = template

    def copy(p: Path) -> Path:
        shutil.copytree(src, p)
        return p

    with Tally("power cut before every filesystem step, 4 random tail sizes each") as tally:
        sweep(tmp_path, copy, history_ops, state, tally, tails=("partial", "zeros"), seeds=4)


def blocks_sweep(tmp_path: Path, template: tuple[Path, State], seeds: int) -> Counter[str]:
    src, state = template

    def copy(p: Path) -> Path:
        shutil.copytree(src, p)
        return p

    outcomes: Counter[str] = Counter()
    what = f"power cut before every filesystem step, {BLOCKS}"
    with Tally(what) as tally:
        total = sweep(tmp_path, copy, history_ops, state, tally, (REORDERED,), seeds, outcomes)
    assert tally.cases == total * seeds
    report(outcomes, f"{what}, {seeds} seeds")
    return outcomes


def test_power_cut_before_every_step_with_reordered_blocks(
    template: tuple[Path, State], tmp_path: Path
) -> None:
    outcomes = blocks_sweep(tmp_path, template, seeds=4)
    # the model reorders (some cuts leave a hole in the log), and not always
    assert outcomes[f"{HOLE}: refused"] > 0
    assert outcomes["unsynced rest in 2+ blocks, no hole: opened"] > 0


def test_random_power_cuts_with_reordered_blocks(tmp_path: Path) -> None:
    outcomes: Counter[str] = Counter()
    random_cuts(tmp_path, cuts=24, tails=(REORDERED,), outcomes=outcomes)
    report(outcomes, f"random power cut under 4 concurrent writers, {BLOCKS}")


@pytest.mark.slow
def test_power_cut_sweep_with_many_reordered_blocks(
    template: tuple[Path, State], tmp_path: Path
) -> None:
    blocks_sweep(tmp_path, template, seeds=32)


@pytest.mark.slow
def test_many_random_power_cuts_with_reordered_blocks(tmp_path: Path) -> None:
    outcomes: Counter[str] = Counter()
    random_cuts(tmp_path, cuts=300, tails=(REORDERED,), outcomes=outcomes)
    report(outcomes, f"random power cut under 4 concurrent writers, {BLOCKS}")
    assert outcomes[f"{HOLE}: refused"] > 0
