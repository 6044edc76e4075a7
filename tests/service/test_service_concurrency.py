"""Threads: concurrent writers (shared fsync), readers paging while others write and delete."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
from svc_helpers import write
from tool_calls import ToolCalls

from convmem_engine.service import MemoryService


def test_concurrent_writers_all_land_in_order(svc: MemoryService) -> None:
    results: dict[int, list[str]] = {}

    def writer(n: int) -> None:
        results[n] = [write(svc, f"w{n}-{i}", session="shared") for i in range(40)]

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [mid for ids in results.values() for mid in ids]
    assert len(set(every)) == 160
    for ids in results.values():
        assert ids == sorted(ids)  # each writer's ids increase
    history = svc.read_messages(session_id="shared", limit=1000)["history"]
    assert [m["message_id"] for m in history] == sorted(every)
    assert svc.get_system_health()["active_messages"] == 160


def test_cursor_pages_stay_exact_under_concurrent_writes_and_deletes(svc: MemoryService) -> None:
    stable = [write(svc, f"stable {i}", session="s") for i in range(60)]
    doomed = [write(svc, f"doomed {i}", session="s") for i in range(60)]
    write(svc, "elsewhere", session="other")
    stop = threading.Event()
    ops = [0]
    errors: list[BaseException] = []

    def churn(seed: int) -> None:
        rng = random.Random(seed)
        victims = doomed[seed::2]
        rng.shuffle(victims)
        try:
            while not stop.is_set():
                if victims and rng.random() < 0.5:
                    svc.delete_message(message_id=victims.pop())
                else:
                    write(svc, "late", session="s")
                    write(svc, "elsewhere", session="other")
                ops[0] += 1
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    try:
        rounds = 0
        while rounds < 5 or (ops[0] < 60 and rounds < 500):
            rounds += 1
            seen: list[str] = []
            cursor = None
            while True:
                out = svc.read_messages(session_id="s", limit=7, cursor=cursor)
                seen.extend(m["message_id"] for m in out["history"])
                assert all(m["session_id"] == "s" for m in out["history"])
                cursor = out.get("nextCursor")
                if cursor is None:
                    break
            assert seen == sorted(seen) and len(seen) == len(set(seen))  # no duplicates
            assert set(stable) <= set(seen)  # no skips of messages live throughout
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors and ops[0] > 0
    sessions_seen: list[str] = []
    cursor = None
    while True:
        out = svc.read_messages(view="sessions", limit=1, cursor=cursor)
        sessions_seen.extend(s["session_id"] for s in out["sessions"])
        cursor = out.get("nextCursor")
        if cursor is None:
            break
    assert sessions_seen == ["s", "other"]


def test_readers_run_while_a_writer_waits_for_fsync(svc: MemoryService) -> None:
    for i in range(50):
        write(svc, f"seed {i}")
    done = threading.Event()
    counts: list[int] = []

    def reader() -> None:
        while not done.is_set():
            counts.append(len(svc.search_messages(query="seed", limit=100)["results"]))

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in readers:
        t.start()
    for i in range(30):
        write(svc, f"more {i}")
    done.set()
    for t in readers:
        t.join()
    assert counts and set(counts) == {50}


def test_background_search_build_with_writes_meanwhile(tmp_path: Path) -> None:
    first = ToolCalls.open(tmp_path / "d")
    ids = [write(first, f"word{i % 50} item {i}", session=f"s{i % 7}") for i in range(3000)]
    first.close()
    svc = ToolCalls.open(tmp_path / "d", background_search_from=0)
    try:
        # usable at once while the search index builds: writes, updates, deletes, history
        new = write(svc, "word7 fresh")
        svc.update_message(message_id=ids[7], content="word7 changed")
        svc.delete_message(message_id=ids[57])
        svc.delete_message(message_id=new)
        newer = write(svc, "word7 newest")
        assert svc.read_messages(session_id="s0", limit=1)["history"]
        found = {r["message_id"] for r in svc.search_messages(query="word7", limit=100)["results"]}
        want = {ids[i] for i in range(7, 3000, 50)} - {ids[57]} | {newer}
        assert found == want
        assert svc.check() == []
    finally:
        svc.close()


def test_close_during_background_build(tmp_path: Path) -> None:
    first = ToolCalls.open(tmp_path / "d")
    for i in range(2000):
        write(first, f"text {i}")
    first.close()
    svc = ToolCalls.open(tmp_path / "d", background_search_from=0)
    svc.close()
    with ToolCalls.open(tmp_path / "d") as again:
        assert len(again.search_messages(query="text", limit=100)["results"]) == 100


@pytest.mark.slow
def test_large_store_default_background_build_under_load(tmp_path: Path) -> None:
    """30,000 messages (above BACKGROUND_SEARCH_FROM): writers, deleters and pagers run while
    the search index builds; afterwards search and every index agree with the store."""
    from convmem_engine.domain import Message
    from convmem_engine.service.ids import UlidSource
    from convmem_engine.service.memory_service import BACKGROUND_SEARCH_FROM
    from convmem_engine.storage import Store

    n = BACKGROUND_SEARCH_FROM + 10_000
    store = Store.open(tmp_path / "d")
    ids = UlidSource()
    seq = 0
    paged_bulk: list[str] = []  # session s5 before the load: never deleted
    for i in range(n):
        mid, ts = ids.next()
        if i % 300 == 5:
            paged_bulk.append(mid)
        seq = store.write_put(
            Message(mid, f"s{i % 300}", ts, "user", f"bulk{i % 97} row {i}", 1, ts)
        )
    store.sync(seq)
    store.close()
    svc = ToolCalls.open(tmp_path / "d")
    try:
        errors: list[BaseException] = []
        kept: list[tuple[str, str]] = []
        dropped: list[tuple[str, str]] = []

        def churn(k: int) -> None:
            try:
                for i in range(200):
                    token = f"uniq{k}q{i}z"
                    mid = write(svc, f"{token} live", session=f"s{i % 300}")
                    if i % 3 == 0:
                        svc.delete_message(message_id=mid)
                        dropped.append((token, mid))
                    else:
                        kept.append((token, mid))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=churn, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        pages = 0
        seen: list[str] = []
        cursor = None
        while True:
            out = svc.read_messages(session_id="s5", limit=10, cursor=cursor)
            seen.extend(m["message_id"] for m in out["history"])
            pages += 1
            cursor = out.get("nextCursor")
            if cursor is None:
                break
        for t in threads:
            t.join()
        assert not errors and pages > 1
        assert seen == sorted(set(seen))  # in order, no duplicates
        assert set(paged_bulk) <= set(seen)  # no skips of messages live throughout
        for token, mid in kept[::7]:
            hits = svc.search_messages(query=token)["results"]
            assert [h["message_id"] for h in hits] == [mid]
        for token, _mid in dropped[::7]:
            assert svc.search_messages(query=token)["results"] == []
        assert svc.check() == []
    finally:
        svc.close()
