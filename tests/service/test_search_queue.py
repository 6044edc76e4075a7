"""Writes queue their search-index change (service/index_set.py): it is applied in batches
before the next read of the search index, or by the background flush. A search right after an
acknowledged write finds it (read-your-writes), from any thread, while other threads write,
update, delete and search at the same time; the queue is applied at close (search.idx holds
every write), by health, by the self-check, and by the background flush on its own."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from svc_helpers import write
from tool_calls import ToolCalls

from convmem_engine.service import MemoryService
from convmem_engine.service.index_set import FLUSH_LIMIT
from convmem_engine.service.search_persist import FILE_NAME

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
        assert queued(svc) == 0
        upd = write(svc, "beta before")
        svc.update_message(message_id=upd, content="gamma after")
        gone = write(svc, "delta gone")
        svc.delete_message(message_id=gone)
        assert queued(svc) == 4  # a write, a write and its update, a write and its delete
        assert found(svc, "gamma") == {upd}
        assert found(svc, "beta") == set() and found(svc, "delta") == set()
        assert svc.check() == []


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
