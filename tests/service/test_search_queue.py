"""Writes queue their search-index change (service/index_set.py): it is applied in batches
before the next read of the search index, or by the background flush. A search right after an
acknowledged write finds it (read-your-writes), from any thread, while other threads write,
update, delete and search at the same time; the queue is applied at close (search.idx holds
every write), by health, by the self-check, and by the background flush on its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from svc_helpers import write
from tool_calls import ToolCalls

from convmem_engine.domain.message import Message, Metadata
from convmem_engine.index.search_index import SearchHit, SearchIndex
from convmem_engine.service import MemoryService
from convmem_engine.service.index_set import FLUSH_LIMIT, IndexSet
from convmem_engine.service.rwlock import RWLock
from convmem_engine.service.search_persist import FILE_NAME
from tests.index.test_search_index import ref_search
from tests.service.test_service_index_failure import FailingSearchIndex, Faults

NEVER = 3600.0  # a flush delay no test waits for: only reads (or the bound) apply the queue


def found(svc: MemoryService, query: str) -> set[str]:
    return {r["message_id"] for r in svc.search_messages(query=query)["results"]}


def queued(svc: ToolCalls) -> int:
    return len(svc.service._indexes._search_pending)


def test_a_search_right_after_a_write_finds_it(tmp_path: Path) -> None:
    with ToolCalls.open(tmp_path / "d", search_flush_delay=NEVER) as svc:
        mid = write(svc, "alpha first")
        assert queued(svc) == 1  # not applied by the write
        assert found(svc, "alpha") == {mid}
        assert queued(svc) == 1  # nor by the search: it scored the queued message directly
        upd = write(svc, "beta before")
        svc.update_message(message_id=upd, content="gamma after")
        gone = write(svc, "delta gone")
        svc.delete_message(message_id=gone)
        assert queued(svc) == 5  # the first write, a write and its update, a write and its delete
        assert found(svc, "gamma") == {upd}
        assert found(svc, "beta") == set() and found(svc, "delta") == set()
        assert found(svc, "alpha") == {mid}
        assert svc.check() == [] and queued(svc) == 0  # the self-check applies the queue
        assert found(svc, "gamma") == {upd} and found(svc, "alpha") == {mid}
        svc.update_message(message_id=mid, content="omega changed")  # indexed, then queued
        assert found(svc, "alpha") == set() and found(svc, "omega") == {mid}


def test_health_check_and_close_apply_the_queue(tmp_path: Path) -> None:
    with ToolCalls.open(tmp_path / "d", search_flush_delay=NEVER) as svc:
        empty = svc.get_system_health()["memory_estimate"]["search_index_bytes"]
        for i in range(50):
            write(svc, f"epsilon {i} " * 20)
        assert queued(svc) == 50
        health = svc.get_system_health()
        assert queued(svc) == 0 and health["memory_estimate"]["search_index_bytes"] > empty
        write(svc, "zeta checked")
        assert svc.check() == [] and queued(svc) == 0
        last = write(svc, "eta persisted")
        assert queued(svc) == 1
    assert (tmp_path / "d" / FILE_NAME).exists()
    with ToolCalls.open(tmp_path / "d") as again:  # search.idx loaded, with the last write
        assert found(again, "persisted") == {last}
        assert again.check() == []


def test_the_background_flush_applies_the_queue_on_its_own(tmp_path: Path) -> None:
    with ToolCalls.open(tmp_path / "d", search_flush_delay=0.001) as svc:
        for i in range(5):
            write(svc, f"theta {i}")
        deadline = time.monotonic() + 60
        while queued(svc) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert queued(svc) == 0
        assert len(found(svc, "theta")) == 5


def test_the_bound_starts_the_flush_and_the_limit_makes_the_writer_apply(tmp_path: Path) -> None:
    with ToolCalls.open(tmp_path / "d", search_flush_delay=NEVER, search_flush_bound=8) as svc:
        for i in range(8):
            write(svc, f"iota {i}")
        deadline = time.monotonic() + 60
        while queued(svc) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert queued(svc) == 0  # the bound woke the flush before its delay
    with ToolCalls.open(
        tmp_path / "e", search_flush_delay=NEVER, search_flush_bound=FLUSH_LIMIT * 2
    ) as svc:
        for i in range(FLUSH_LIMIT - 1):
            write(svc, f"kappa {i}")
        assert queued(svc) == FLUSH_LIMIT - 1
        write(svc, "kappa last")
        assert queued(svc) == 0  # the writer applied them: the queue stays bounded
        assert svc.check() == []


def test_read_your_writes_across_threads_under_concurrent_changes(tmp_path: Path) -> None:
    """Writer threads each search for their own write right after it is acknowledged, and
    update and delete some, while searcher threads search all the time; every acknowledged
    write is found by its writer's next search, and by a search from another thread started
    after the acknowledgement."""
    with ToolCalls.open(tmp_path / "d", search_flush_delay=0.002) as svc:
        acked: list[tuple[str, str]] = []  # (id, its unique word), in acknowledgement order
        acked_lock = threading.Lock()
        failures: list[str] = []
        stop = threading.Event()

        def writer(w: int) -> None:
            for i in range(60):
                word = f"w{w}x{i}q"
                mid = write(svc, f"{word} lambda common text {i}", session=f"s{w}")
                with acked_lock:
                    acked.append((mid, word))
                if found(svc, word) != {mid}:
                    failures.append(f"writer {w} missed its write {i}")
                # Taken out of `acked` before it changes (the searchers' rule, below).
                if i % 7 == 3:
                    with acked_lock:
                        acked.remove((mid, word))
                    svc.update_message(message_id=mid, content=f"{word}u lambda updated")
                    with acked_lock:
                        acked.append((mid, f"{word}u"))
                    if found(svc, f"{word}u") != {mid}:
                        failures.append(f"writer {w} missed its update {i}")
                if i % 11 == 5:
                    with acked_lock:
                        acked[:] = [(m, x) for m, x in acked if m != mid]
                    svc.delete_message(message_id=mid)
                    if found(svc, f"{word}"):
                        failures.append(f"writer {w} still found its delete {i}")

        def searcher() -> None:
            while not stop.is_set():
                with acked_lock:
                    expect = list(acked[-5:])
                for mid, word in expect:
                    hits = found(svc, word)
                    # Still in `acked` after the search: its writer had not begun to change
                    # it when the search ended, so the search must have found it.
                    with acked_lock:
                        still = (mid, word) in acked
                    if still and hits != {mid}:
                        failures.append(f"a searcher missed {word}")

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        threads += [threading.Thread(target=searcher) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads[:4]:
            t.join(timeout=300)
        stop.set()
        for t in threads[4:]:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
        assert failures == []
        assert svc.check() == []
        for mid, word in acked:
            assert found(svc, word) == {mid}


# -- a search with changes queued equals the search of the index with them applied ----------

_WORDS = ["alpha", "beta", "gamma", "delta", "ha", "lo", "設計"]
_QUERIES = ["alpha", "ha ha", "gamma delta", "al", "lo lo", "a", "beta alpha", "設", "zzz"]


def _text(draw: st.DrawFn) -> str:
    return " ".join(draw(st.lists(st.sampled_from(_WORDS), min_size=1, max_size=6)))


@st.composite
def _message(draw: st.DrawFn, mid: str, ts: int) -> Message:
    tags = tuple(draw(st.lists(st.sampled_from(_WORDS), max_size=2, unique=True)))
    summary = draw(st.sampled_from([None, "beta summary", "ha lo"]))
    metadata = Metadata(
        tags=tags,
        importance=draw(st.integers(0, 3)),
        summary=summary,
        memory_kind=draw(st.sampled_from(["conversation", "semantic"])),
    )
    session = f"s{draw(st.integers(0, 2))}"
    return Message(mid, session, ts, "user", _text(draw), 1, ts, metadata)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), indexed=st.integers(0, 30), changes=st.integers(1, 30))
def test_a_search_over_the_queue_equals_the_search_after_it(
    data: st.DataObject, indexed: int, changes: int
) -> None:
    """IndexSet.search with changes queued (adds, replaces, removes, of indexed and of queued
    messages) gives exactly the hits (ids, order, scores, breakdowns) of the same search once
    the queue is applied, and the brute-force reference's: for several queries, limits,
    sessions, importance floors and a per-message filter."""
    lock = RWLock()
    live: dict[str, Message] = {}
    indexes = IndexSet(lock, flush_delay=NEVER, flush_bound=FLUSH_LIMIT, live=lambda: live)
    ts = 1_000
    for i in range(indexed):
        ts += data.draw(st.integers(0, 3))  # equal timestamps: ties broken by id
        m = data.draw(_message(f"m{i:04d}", ts))
        live[m.message_id] = m
    indexes.build(live, background=False)
    n = indexed
    for _ in range(changes):
        op = data.draw(st.sampled_from(["add", "add", "replace", "remove"]))
        with lock.write():
            if op == "add" or not live:
                ts += data.draw(st.integers(0, 3))
                m = data.draw(_message(f"m{n:04d}", ts))
                n += 1
                live[m.message_id] = m
                indexes.add(m)
            else:
                old = live[data.draw(st.sampled_from(sorted(live)))]
                if op == "remove":
                    del live[old.message_id]
                    indexes.remove(old)
                else:
                    new = data.draw(_message(old.message_id, old.timestamp))
                    new = replace(new, session_id=old.session_id, revision=old.revision + 1)
                    live[new.message_id] = new
                    indexes.replace(old, new)
    assert len(indexes._search_pending) == changes
    searches = []
    for query in _QUERIES:
        for limit in (1, 3, 50):
            for session, floor, accept in (
                (None, 0, None),
                ("s1", 0, None),
                (None, 2, None),
                (None, 0, lambda m: m.metadata.memory_kind == "semantic"),
            ):
                searches.append((query, limit, session, floor, accept))

    def run() -> list[list[SearchHit]]:
        with lock.read():
            return [
                indexes.search(q, live, accept=a, limit=lim, session_id=s, min_importance=f)
                for q, lim, s, f, a in searches
            ]

    queued = run()
    assert len(indexes._search_pending) == changes  # a search applies nothing
    with lock.read():
        indexes.flush()
    assert not indexes._search_pending
    assert queued == run()
    for hits, (q, lim, s, f, a) in zip(queued, searches, strict=True):
        if a is None:
            assert [(h.message_id, h.score) for h in hits] == ref_search(live, q, lim, s, f)


class HeldSearchIndex(SearchIndex):
    """The real index; once `hold` is set, each `add` waits for `release` (a background batch
    held open part-way, deterministically)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = threading.Event()
        self.holding = threading.Event()
        self.release = threading.Event()

    def add(self, msg: Message, pause: Callable[[], object] | None = None) -> None:
        if self.hold.is_set():
            self.holding.set()
            if not self.release.wait(timeout=120):
                raise TimeoutError("test never released the batch")
        super().add(msg, pause)


def test_writes_never_wait_for_a_background_batch(tmp_path: Path) -> None:
    """The background flush holds only the search index's own lock: while one of its batches
    is held open part-way, writes, updates and deletes are acknowledged; the searches wait for
    the batch (the index is half-changed), then find every acknowledged change."""
    indexes: list[HeldSearchIndex] = []

    def factory() -> SearchIndex:
        indexes.append(HeldSearchIndex())
        return indexes[-1]

    with ToolCalls.open(
        tmp_path / "d", search_index_factory=factory, search_flush_delay=0.001
    ) as svc:
        first = write(svc, "alpha first")
        index = indexes[-1]
        index.hold.set()
        second = write(svc, "alpha second")  # its change is in a batch that stays open
        assert index.holding.wait(timeout=60)
        later = [write(svc, f"beta {i}") for i in range(5)]  # acknowledged meanwhile
        svc.update_message(message_id=first, content="gamma changed")
        svc.delete_message(message_id=later[0])
        result: list[set[str]] = []
        searcher = threading.Thread(target=lambda: result.append(found(svc, "beta")))
        searcher.start()
        searcher.join(timeout=0.2)
        assert searcher.is_alive() and not result  # waits for the batch to be whole
        index.hold.clear()
        index.release.set()
        searcher.join(timeout=60)
        assert result == [set(later[1:])]
        assert found(svc, "alpha") == {second} and found(svc, "gamma") == {first}
        assert svc.check() == []


def test_a_background_batch_that_fails_is_rebuilt_before_the_next_search(
    tmp_path: Path,
) -> None:
    """A background batch that raises part-way (e.g. MemoryError) leaves an index that may hold
    part of it: it is rebuilt from the store (under the service's lock) before any search
    reads it, and health reports the failure (DEGRADED) until rebuild_index."""
    faults = Faults()
    with ToolCalls.open(
        tmp_path / "d",
        search_index_factory=lambda: FailingSearchIndex(faults),
        search_flush_delay=0.001,
    ) as svc:
        kept = write(svc, "alpha kept")
        deadline = time.monotonic() + 60
        while queued(svc) and time.monotonic() < deadline:
            time.sleep(0.001)
        faults.remaining = 1
        new = write(svc, "alpha new")
        while (faults.remaining or queued(svc)) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert faults.remaining == 0 and queued(svc) == 0  # failed, then rebuilt
        assert found(svc, "alpha") == {kept, new}
        health = svc.get_system_health()
        assert health["status"] == "DEGRADED" and "MemoryError" in health["last_error"]
        assert svc.check() == []
        svc.rebuild_index()
        assert svc.get_system_health()["status"] == "OK"
