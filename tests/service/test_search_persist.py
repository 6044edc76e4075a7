"""The persisted search index (search.idx): written at close, loaded at the next open instead of
rebuilt, and never used unless it is exactly the index of the snapshot the store loaded.

Every test compares searches against a service whose index was built by adding every message
(the reference: a `search_index_factory` other than SearchIndex itself never loads the file):
same hits, same order, same scores. Loading is observed by wrapping
`PersistedSearch.load` (the real one runs).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tool_calls import ToolCalls

from convmem_engine.domain.message import Message
from convmem_engine.index.search_index import SearchIndex
from convmem_engine.service import search_persist
from convmem_engine.service.index_set import IndexSet
from convmem_engine.service.search_persist import FILE_NAME, PersistedSearch

WORDS = ["alpha", "beta", "gamma", "ha", "ing", "hello", "lo", "日本語", "é", "a", "x_y", "ab"]
QUERIES = ["alpha", "ha ha", "ing", "a", "lo", "日本", "x_y beta", "é", "gamma hello", "b", "zzz"]


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """One entry per PersistedSearch.load call: whether it gave an index."""
    seen: list[bool] = []
    real = PersistedSearch.load

    def spy(self: PersistedSearch) -> SearchIndex | None:
        index = real(self)
        seen.append(index is not None)
        return index

    monkeypatch.setattr(PersistedSearch, "load", spy)
    yield seen


def text(rng: random.Random) -> str:
    sep = rng.choice([" ", " ", ", ", "-", ""])
    return sep.join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))


def metadata(rng: random.Random) -> str | None:
    if rng.random() < 0.5:
        return None
    md: dict[str, Any] = {"importance": rng.choice([0, 10, 50, 90])}
    if rng.random() < 0.4:
        md["summary"] = text(rng)
    if rng.random() < 0.4:
        md["tags"] = sorted({rng.choice(WORDS) for _ in range(rng.randint(1, 3))})
    return json.dumps(md)


def churn(svc: ToolCalls, rng: random.Random, n: int, ids: list[str]) -> None:
    """n random writes, updates and deletes."""
    for _ in range(n):
        r = rng.random()
        if r < 0.6 or not ids:
            ids.append(
                svc.write_message(
                    session_id=f"s{rng.randint(0, 4)}",
                    role=rng.choice(["user", "assistant"]),
                    content=text(rng),
                    metadata_json=metadata(rng),
                )["message"]["message_id"]
            )
        elif r < 0.85:
            mid = rng.choice(ids)
            if rng.random() < 0.5:
                svc.update_message(message_id=mid, content=text(rng))
            else:
                svc.update_message(
                    message_id=mid, metadata_json=metadata(rng) or json.dumps({"importance": 5})
                )
        else:
            svc.delete_message(message_id=ids.pop(rng.randrange(len(ids))))


def results(svc: ToolCalls) -> list[Any]:
    out = []
    for q in QUERIES:
        for kw in ({}, {"session_id": "s1"}, {"min_importance": 10}):
            out.append(svc.search_messages(query=q, limit=15, **kw))
    return out


def reference(data: Path) -> list[Any]:
    """Search results from an index built by adding every message (the file is not read)."""
    backup = data.parent / "reference"
    shutil.copytree(data, backup)
    svc = ToolCalls.open(backup, search_index_factory=lambda: SearchIndex())
    try:
        assert svc.wait_for_search_index(timeout=120)
        return results(svc)
    finally:
        svc.service._closed = True  # never write anything to the copy
        svc._store.close()
        shutil.rmtree(backup)


def reopened(data: Path, **kw: Any) -> tuple[list[Any], list[str]]:
    svc = ToolCalls.open(data, **kw)
    try:
        assert svc.wait_for_search_index(timeout=120)
        assert svc.check() == []
        return results(svc), svc._store.check()
    finally:
        svc.close()


def seeded(data: Path, seed: int, n: int = 250) -> None:
    rng = random.Random(seed)
    with ToolCalls.open(data) as svc:
        churn(svc, rng, n, [])
    assert (data / FILE_NAME).exists()


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_loaded_index_searches_exactly_like_a_rebuilt_one(
    tmp_path: Path, loads: list[bool], seed: int, background: bool
) -> None:
    data = tmp_path / "data"
    seeded(data, seed)
    want = reference(data)
    got, problems = reopened(data, background_search_from=10 if background else 10**9)
    assert loads == [True]
    assert problems == []
    assert got == want


def test_the_log_tail_after_the_snapshot_is_applied_to_the_loaded_index(
    tmp_path: Path, loads: list[bool]
) -> None:
    """A process that died after more writes: the store replays them after the snapshot; the
    index file (written with that snapshot) gets the same changes, then writes made while it
    loads in the background."""
    data = tmp_path / "data"
    seeded(data, 7)
    rng = random.Random(8)
    svc = ToolCalls.open(data)
    svc.wait_for_search_index(timeout=60)
    ids = list(svc._store.messages)
    churn(svc, rng, 120, ids)
    svc._store._abandon()  # died: no snapshot, no index file at close
    assert loads == [True]
    want = reference(data)
    got, problems = reopened(data, background_search_from=10)
    assert loads == [True, True]
    assert problems == []
    assert got == want
    # ... and a clean close after it writes the file for the new snapshot
    got, _ = reopened(data)
    assert loads[-1] is True and got == want


def damaged(path: Path, how: str, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    if how == "flip":
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
    elif how == "truncate":
        del data[rng.randrange(len(data)) :]
    elif how == "zeros":
        i = rng.randrange(len(data))
        data[i : i + 4096] = bytes(len(data[i : i + 4096]))
    elif how == "empty":
        data = bytearray()
    else:
        data = bytearray(rng.randbytes(len(data)))
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["flip", "flip", "flip", "truncate", "zeros", "empty", "garbage"])
def test_a_damaged_index_file_is_rebuilt_with_identical_results(
    tmp_path: Path, loads: list[bool], how: str
) -> None:
    data = tmp_path / "data"
    seeded(data, 11)
    want = reference(data)
    damaged(data / FILE_NAME, how, random.Random(f"{how}{len(loads)}{tmp_path.name}"))
    got, problems = reopened(data, background_search_from=10)
    assert loads == [False]
    assert got == want and problems == []
    # The clean close wrote a good one again: the next open loads it.
    got, _ = reopened(data)
    assert loads == [False, True] and got == want


def test_writes_made_while_an_unusable_file_is_read_are_in_the_rebuilt_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a file to load, no snapshot of the messages is taken at open; when the file turns
    out unusable, the builder indexes the messages live then (log tail and the writes queued
    meanwhile included) and drops the queue, then applies what comes after."""
    data = tmp_path / "data"
    seeded(data, 5)
    rng = random.Random(6)
    svc = ToolCalls.open(data)
    svc.wait_for_search_index(timeout=60)
    ids = list(svc._store.messages)
    churn(svc, rng, 60, ids)
    svc._store._abandon()  # died: a log tail after the snapshot the file belongs to
    damaged(data / FILE_NAME, "flip", rng)
    gate = threading.Event()
    real = PersistedSearch.load

    def held(self: PersistedSearch) -> SearchIndex | None:
        assert gate.wait(60)
        return real(self)

    monkeypatch.setattr(PersistedSearch, "load", held)
    svc = ToolCalls.open(data, background_search_from=10)
    try:
        churn(svc, rng, 80, ids)  # queued while the load waits
        gate.set()
        assert svc.wait_for_search_index(timeout=120)
        churn(svc, rng, 20, ids)
        assert svc.check() == []
        got = results(svc)
    finally:
        svc.close()
    assert got == reference(data)


def test_every_single_bit_flip_in_a_small_index_file_is_caught(tmp_path: Path) -> None:
    """Decoding each damaged variant of a small file through the store: never an index."""
    data = tmp_path / "data"
    with ToolCalls.open(data) as svc:
        for i in range(3):
            svc.write_message(session_id="s", role="user", content=f"ha {i}")
    good = (data / FILE_NAME).read_bytes()
    for i in range(len(good)):
        bad = bytearray(good)
        bad[i] ^= 0x10
        (data / FILE_NAME).write_bytes(bytes(bad))
        svc = ToolCalls.open(data, background_search_from=10**9)
        try:
            # a damaged file is removed at open; searching still finds everything
            assert not (data / FILE_NAME).exists()
            assert len(svc.search_messages(query="ha", limit=10)["results"]) == 3
        finally:
            svc.service._closed = True
            svc._store.close()


def test_an_index_file_of_another_state_is_not_used(tmp_path: Path, loads: list[bool]) -> None:
    """Another store's file (another generation), and this store's older file (an earlier
    snapshot): never used, results identical, the file removed at open."""
    a, b = tmp_path / "a", tmp_path / "b"
    seeded(a, 21)
    seeded(b, 22)
    old = (b / FILE_NAME).read_bytes()
    with ToolCalls.open(b) as svc:
        svc.write_message(session_id="s1", role="user", content="alpha newer")
    assert (b / FILE_NAME).read_bytes() != old
    want_b = reference(b)
    for planted in ((a / FILE_NAME).read_bytes(), old):
        loads.clear()
        (b / FILE_NAME).write_bytes(planted)
        svc = ToolCalls.open(b, background_search_from=10)
        try:
            assert svc.wait_for_search_index(timeout=60)
            assert loads == [False]
            assert not (b / FILE_NAME).exists()
            assert results(svc) == want_b
        finally:
            svc.close()


def test_compaction_removes_the_index_file_and_close_writes_a_new_one(
    tmp_path: Path, loads: list[bool]
) -> None:
    data = tmp_path / "data"
    seeded(data, 31)
    with ToolCalls.open(data) as svc:
        svc.wait_for_search_index(timeout=60)
        svc.rebuild_index()  # compacts the store: a new generation
        assert not (data / FILE_NAME).exists()
    want = reference(data)
    got, problems = reopened(data)
    assert loads == [True, True] and got == want and problems == []


@pytest.mark.skipif(os.name == "nt", reason="symlinks need privileges on Windows")
def test_a_symlink_planted_at_the_index_path_is_never_followed(
    tmp_path: Path, loads: list[bool]
) -> None:
    """At the file's name (even pointing to a valid index file) and at its temporary name:
    not read, not written through; the close writes a real user-only file instead."""
    data = tmp_path / "data"
    seeded(data, 41)
    victim = tmp_path / "victim"
    victim.write_bytes((data / FILE_NAME).read_bytes())
    planted = victim.read_bytes()
    for name in (FILE_NAME, FILE_NAME + ".tmp"):
        loads.clear()
        (data / FILE_NAME).unlink()
        want = reference(data)
        os.symlink(victim, data / name)
        svc = ToolCalls.open(data, background_search_from=10**9)
        try:
            assert loads == [False] and results(svc) == want
            svc.write_message(session_id="s1", role="user", content="alpha after")
        finally:
            svc.close()
        assert victim.read_bytes() == planted
        assert not (data / FILE_NAME).is_symlink()
        assert not (data / (FILE_NAME + ".tmp")).exists()
        assert os.stat(data / FILE_NAME).st_mode & 0o077 == 0


def test_a_close_that_cannot_write_the_index_file_still_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loads: list[bool]
) -> None:
    data = tmp_path / "data"
    seeded(data, 51)

    def broken(*args: Any, **kw: Any) -> int:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr("convmem_engine.storage.derived.write_derived", broken)
        with ToolCalls.open(data) as svc:
            svc.write_message(session_id="s1", role="user", content="alpha")
    want = reference(data)
    loads.clear()
    got, problems = reopened(data)
    assert got == want and problems == []
    assert loads == [False]  # the old file named the old snapshot: removed, rebuilt


def test_save_reports_false_when_the_file_is_current(tmp_path: Path) -> None:
    data = tmp_path / "data"
    seeded(data, 61, n=30)
    svc = ToolCalls.open(data)
    try:
        assert svc.wait_for_search_index(timeout=60)
        assert search_persist.save(svc._store, svc._indexes.search_index) is False
    finally:
        svc.close()


def changes_during_build(svc: ToolCalls, ids: list[str]) -> None:
    """Every kind of change a background build has to take in afterwards: updates (one twice),
    deletes, writes (one into a new session), a write updated and a write deleted."""
    svc.update_message(message_id=ids[1], content="gamma changed during the build")
    svc.update_message(message_id=ids[1], metadata_json=json.dumps({"tags": ["twice"]}))
    svc.update_message(
        message_id=ids[-2], metadata_json=json.dumps({"summary": "ha late", "importance": 90})
    )
    svc.delete_message(message_id=ids[2])
    svc.delete_message(message_id=ids[-1])
    svc.write_message(session_id="new", role="user", content="alpha in a new session")
    mid = svc.write_message(session_id="s1", role="user", content="x_y")["message"]["message_id"]
    svc.update_message(message_id=mid, content="x_y beta")
    mid = svc.write_message(session_id="s2", role="user", content="lo")["message"]["message_id"]
    svc.delete_message(message_id=mid)


@pytest.mark.parametrize("path", ["load", "build"])
@pytest.mark.parametrize("only_updates", [True, False])
def test_a_close_during_the_background_build_never_keeps_a_wrong_index_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    loads: list[bool],
    path: str,
    only_updates: bool,
) -> None:
    """The slow suite's stale entry. The close arrives while the background build (loading
    the file, or indexing the messages) still runs, after changes were queued for it: the
    builder stops, and the index it leaves must not be written as the new snapshot's file.
    It was: a loaded index without the queued changes (an update leaves the count right, so
    the next open used it: a stale entry), or an empty one from a stopped build (refused at
    the next open by its count: "search.idx: not used (ValueError)"). The build is held
    until the close has asked it to stop (the real load and build then run)."""
    data = tmp_path / "data"
    seeded(data, 71, n=80)
    if path == "build":
        (data / FILE_NAME).unlink()  # no file: the index is built from the messages
    closing = threading.Event()
    real_stop = IndexSet.stop
    real_load = PersistedSearch.load
    real_build = SearchIndex.build

    def stop(self: IndexSet) -> None:
        closing.set()
        real_stop(self)

    def held_load(self: PersistedSearch) -> SearchIndex | None:
        assert closing.wait(timeout=120)
        return real_load(self)

    def held_build(
        self: SearchIndex, messages: Iterable[Message], *, cancelled: Any = None, ids: Any = None
    ) -> bool:
        assert closing.wait(timeout=120)
        return real_build(self, messages, cancelled=cancelled, ids=ids)

    with monkeypatch.context() as patch:
        patch.setattr(IndexSet, "stop", stop)
        patch.setattr(PersistedSearch, "load", held_load)
        patch.setattr(SearchIndex, "build", held_build)
        svc = ToolCalls.open(data, background_search_from=0)
        try:
            ids = list(svc._store.messages)
            if only_updates:
                for mid in ids[::7]:
                    svc.update_message(message_id=mid, content="ha changed during the build")
            else:
                changes_during_build(svc, ids)
            assert not svc.wait_for_search_index(timeout=0)
        finally:
            svc.close()
    assert closing.is_set()
    want = reference(data)
    caplog.clear()
    got, problems = reopened(data, background_search_from=10)
    assert problems == [] and got == want
    assert "not used" not in caplog.text
    # a loaded index was complete: it got the queued changes and was kept; a stopped build
    # left no file (the next open builds, then its clean close writes one)
    assert loads[-1] is (path == "load")
    got, _ = reopened(data)
    assert loads[-1] is True and got == want
