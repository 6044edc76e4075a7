"""search_messages while the search index is still being built in the background.

The build is held open deterministically through the service's `search_index_factory` seam: a
subclass of the real SearchIndex whose `add` (the build step) waits on an Event the test
controls. Until the test opens the gate, searches are answered by scoring the live messages
(`SearchIndex.scan`); they must equal the brute-force reference of tests/index, and equal it
again once the build has finished (index path), including writes made during the build.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from svc_helpers import write
from tool_calls import ToolCalls

from convmem_engine.domain.message import Message
from convmem_engine.index.search_index import SearchIndex
from convmem_engine.service import MemoryService
from convmem_engine.service.search_persist import FILE_NAME
from tests.index.test_search_index import ref_search


class GatedSearchIndex(SearchIndex):
    """The real index; `build` and each `add` first wait for the gate (the build cannot
    finish)."""

    def __init__(self, gate: threading.Event, started: threading.Event) -> None:
        super().__init__()
        self.gate = gate
        self.started = started

    def _wait(self) -> None:
        self.started.set()
        if not self.gate.wait(timeout=120):
            raise TimeoutError("test gate never opened")

    def build(
        self,
        messages: Iterable[Message],
        *,
        cancelled: Callable[[], bool] | None = None,
        ids: list[str | None] | None = None,
    ) -> bool:
        self._wait()
        return super().build(messages, cancelled=cancelled, ids=ids)

    def add(self, msg: Message, pause: Callable[[], object] | None = None) -> None:
        self._wait()
        super().add(msg, pause)


QUERIES = [
    "alpha",
    "Beta",
    "al",
    "a",
    "gamma delta",
    "delta gamma",
    "ha ha",
    "lo lo",
    "zzz",
    "phase one",
    "設計",
]


def live(svc: MemoryService) -> dict[str, Message]:
    return dict(svc._store.messages)  # test only: the reference reads the same live messages


def results(svc: MemoryService, query: str, **kw: Any) -> list[tuple[str, float]]:
    out = svc.search_messages(query=query, **kw)["results"]
    return [(r["message_id"], r["score"]) for r in out]


def check_all(svc: MemoryService) -> None:
    msgs = live(svc)
    for q in QUERIES:
        for limit in (1, 3, 20, 100):
            assert results(svc, q, limit=limit) == ref_search(msgs, q, limit), (q, limit)
        assert results(svc, q, limit=5, session_id="s2") == ref_search(msgs, q, 5, "s2"), q
        assert results(svc, q, limit=5, min_importance=60) == ref_search(
            msgs, q, 5, min_importance=60
        ), q
    # Breakdown and matched fields come from the same scoring on both paths.
    full = svc.search_messages(query="gamma delta", limit=100)["results"]
    for r in full:
        assert set(r["score_breakdown"]) == {"content", "summary", "tags"}
        assert r["matched_fields"] == [k for k, v in r["score_breakdown"].items() if v > 0]


def seed(data: Path) -> list[str]:
    words = ["alpha", "beta", "gamma", "delta", "hello", "lol", "phase", "one", "設計書"]
    ids = []
    with ToolCalls.open(data) as svc:
        for i in range(240):
            text = " ".join(words[(i * k) % len(words)] for k in (1, 3, 5)) + f" n{i}"
            md: dict[str, Any] = {"importance": (50, 50, 70, 20)[i % 4]}
            if i % 9 == 0:
                md["summary"] = "alpha phase"
            if i % 11 == 0:
                md["tags"] = ["delta", "lollipop"]
            ids.append(
                str(
                    svc.write_message(
                        session_id=f"s{i % 5}",
                        role="user",
                        content=text if i % 13 else "ha ha, hello lo",
                        metadata_json=json.dumps(md),
                    )["message"]["message_id"]
                )
            )
    return ids


def test_search_during_the_background_build_equals_the_reference(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ids = seed(data)
    gate = threading.Event()
    started = threading.Event()
    svc = ToolCalls.open(
        data,
        background_search_from=10,
        search_index_factory=lambda: GatedSearchIndex(gate, started),
    )
    try:
        assert started.wait(timeout=60)  # the builder is inside its first add, held there
        assert not svc.wait_for_search_index(timeout=0)
        check_all(svc)

        # Health does not wait: the index is not counted while it builds.
        health = svc.get_system_health()
        assert health["memory_estimate"]["search_index_bytes"] == 0
        assert health["status"] == "OK" and health["active_messages"] == 240

        # Writes, updates and deletes during the build: searches see them at once.
        write(svc, "gamma delta fresh", session="s2", importance=70)
        write(svc, "alpha", session="s1")
        svc.update_message(message_id=ids[3], content="delta gamma ha ha")
        svc.update_message(message_id=ids[4], metadata_json=json.dumps({"tags": ["alpha"]}))
        svc.delete_message(message_id=ids[5])
        assert not svc.wait_for_search_index(timeout=0)
        check_all(svc)

        gate.set()
        assert svc.wait_for_search_index(timeout=120)
        check_all(svc)
        assert svc.get_system_health()["memory_estimate"]["search_index_bytes"] > 0
        assert svc.check() == []
    finally:
        gate.set()
        svc.close()


@pytest.mark.parametrize("pause_at", [0, 120, 10**9])
def test_changes_at_any_point_of_the_build_end_in_the_exact_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pause_at: int
) -> None:
    """The build reads the store's lazy snapshot (packed values, each Message made when the
    build reaches it) while writers change the store and queue the same changes for it. The
    real build is held after `pause_at` of the 241 messages (before the first, in the middle,
    after the last): messages already indexed and not yet reached are updated (one twice) and
    deleted, a session gets its first message and another loses its last one, and a
    rebuild_index (a compaction) is asked for. The finished index must be exactly the one of
    the store, the compaction must wait for it, and the file kept at close must load."""
    data = tmp_path / "data"
    ids = seed(data)
    with ToolCalls.open(data) as svc:
        lone = write(svc, "the only one of its session", session="lone")
    (data / FILE_NAME).unlink()  # no index file: the build indexes the messages
    reached = threading.Event()
    gate = threading.Event()
    real_build = SearchIndex.build
    compactions: list[bool] = []

    def held_build(
        self: SearchIndex, messages: Iterable[Message], *, cancelled: Any = None, ids: Any = None
    ) -> bool:
        def pause() -> None:
            reached.set()
            assert gate.wait(timeout=120)

        def paced() -> Iterable[Message]:
            n = 0
            for msg in messages:
                if n == pause_at:
                    pause()
                yield msg
                n += 1
            if n <= pause_at:
                pause()

        return real_build(self, paced(), cancelled=cancelled, ids=ids)

    with monkeypatch.context() as patch:
        patch.setattr(SearchIndex, "build", held_build)
        svc = ToolCalls.open(data, background_search_from=10)
        real_compact = svc._store.compact

        def compact() -> Any:
            compactions.append(svc._indexes.search_ready)  # (the write lock is held)
            return real_compact()

        patch.setattr(svc._store, "compact", compact)
        rebuild = threading.Thread(target=svc.rebuild_index)
        try:
            assert reached.wait(timeout=60)
            svc.update_message(message_id=ids[1], content="gamma changed during the build")
            svc.update_message(message_id=ids[1], metadata_json=json.dumps({"tags": ["twice"]}))
            svc.update_message(message_id=ids[200], content="alpha changed late")
            svc.update_message(
                message_id=ids[150],
                metadata_json=json.dumps({"summary": "ha late", "importance": 90}),
            )
            svc.delete_message(message_id=ids[2])
            svc.delete_message(message_id=ids[201])
            svc.delete_message(message_id=lone)  # its session is gone
            write(svc, "alpha in a new session", session="new")
            mid = write(svc, "delta", session="s3")
            svc.update_message(message_id=mid, content="delta gamma")
            svc.delete_message(message_id=write(svc, "lo", session="s2"))
            check_all(svc)  # scanned, not yet from the index
            rebuild.start()
            gate.set()
            rebuild.join(timeout=120)
            assert not rebuild.is_alive()
            assert compactions == [True]  # the compaction waited for the build
            assert svc.check() == []
            check_all(svc)
        finally:
            gate.set()
            svc.close()
    svc = ToolCalls.open(data, background_search_from=10)
    try:
        assert svc.wait_for_search_index(timeout=120)
        assert svc.check() == []
        check_all(svc)
    finally:
        svc.close()


def test_a_rebuild_from_pending_blocks_leaves_them_pending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store loaded from a snapshot's column blocks keeps them pending (one buffer each,
    split when a message is read or changed) through a background rebuild of the search index:
    its snapshot holds their bytes instead of opening them (~30 MiB less at a million
    messages). Writers change messages of pending blocks (already indexed and not yet reached)
    while the build is held in the middle: the index ends exactly the store's, and the blocks
    no reader or writer touched are still pending."""
    from convmem_engine.service.ids import UlidSource
    from convmem_engine.storage import Store
    from convmem_engine.storage.packed import BLOCK_ROWS

    data = tmp_path / "data"
    store = Store.open(data)
    make = UlidSource()
    words = ["alpha", "beta", "gamma", "delta", "hello", "lol", "phase", "one", "設計書"]
    seq = 0
    ids = []
    written = {}
    for i in range(4 * BLOCK_ROWS + 100):
        mid, ts = make.next()
        ids.append(mid)
        text = f"{words[i % 9]} {words[(i * 5) % 9]} n{i}"
        written[mid] = Message(mid, f"s{i % 5}", ts, "user", text, 1, ts)
        seq = store.write_put(written[mid])
    store.sync(seq)
    store.close()
    assert not (data / FILE_NAME).exists()
    reached = threading.Event()
    gate = threading.Event()
    real_build = SearchIndex.build
    pause_at = BLOCK_ROWS + 10  # in the second block

    def held_build(
        self: SearchIndex, messages: Iterable[Message], *, cancelled: Any = None, ids: Any = None
    ) -> bool:
        def paced() -> Iterable[Message]:
            for n, msg in enumerate(messages):
                if n == pause_at:
                    reached.set()
                    assert gate.wait(timeout=120)
                yield msg

        return real_build(self, paced(), cancelled=cancelled, ids=ids)

    with monkeypatch.context() as patch:
        patch.setattr(SearchIndex, "build", held_build)
        svc = ToolCalls.open(data, background_search_from=10)
        try:
            table = svc._store._messages
            assert len(table._pending) == 5  # (the last 100 messages too)
            assert reached.wait(timeout=60)
            # Scanned: every message read, every block left pending but those of the hits
            # (read to answer: n4100 in the second block, n16390 in the last)
            for q in ("zzz", "n4100", "n16390"):
                assert results(svc, q, limit=20) == ref_search(written, q, 20), q
            assert [b.ids is None for b, _ in table._pending] == [False, True, False, False, True]
            svc.update_message(message_id=ids[5], content="gamma changed, indexed before")
            svc.update_message(message_id=ids[3 * BLOCK_ROWS + 1], content="alpha changed late")
            svc.delete_message(message_id=ids[3 * BLOCK_ROWS + 2])
            gate.set()
            assert svc.wait_for_search_index(timeout=120)
            opened = [b.ids is None for b, _ in table._pending]
            assert opened == [True, True, False, True, True]  # by the hits and the writes only
            assert svc.check() == []  # (reads every message: opens the blocks)
            msgs = live(svc)
            for q in ("alpha", "gamma changed", "lol n4", "設計", "zzz"):
                assert results(svc, q, limit=20) == ref_search(msgs, q, 20), q
        finally:
            gate.set()
            svc.close()
