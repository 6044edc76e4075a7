"""An index update that fails after the store write succeeded (e.g. MemoryError).

The store is the truth: the service rebuilds its indexes from it, reports the failure as health
`last_error` (DEGRADED) until rebuild_index, and the indexes never silently disagree with the
store. The failure is injected through the service's `search_index_factory` seam (a subclass
of the real SearchIndex that raises when armed, like the store's FileSystem seam).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pytest
from svc_helpers import write
from tool_calls import ToolCalls

from convmem_engine.domain.errors import InternalError
from convmem_engine.domain.message import Message
from convmem_engine.index.search_index import SearchIndex
from convmem_engine.service import MemoryService


class Faults:
    """Shared switch: how many of the next index mutations raise MemoryError."""

    def __init__(self) -> None:
        self.remaining = 0

    def hit(self) -> None:
        if self.remaining > 0:
            self.remaining -= 1
            raise MemoryError


class FailingSearchIndex(SearchIndex):
    def __init__(self, faults: Faults) -> None:
        super().__init__()
        self.faults = faults

    def add(self, msg: Message, pause: Callable[[], object] | None = None) -> None:
        self.faults.hit()
        super().add(msg, pause)

    def add_many(
        self, messages: Sequence[Message], pause: Callable[[], object] | None = None
    ) -> None:
        self.faults.hit()
        super().add_many(messages, pause)

    def build(
        self,
        messages: Iterable[Message],
        *,
        cancelled: Callable[[], bool] | None = None,
        ids: list[str | None] | None = None,
    ) -> bool:
        self.faults.hit()
        return super().build(messages, cancelled=cancelled, ids=ids)

    def remove(self, msg: Message) -> None:
        self.faults.hit()
        super().remove(msg)

    def replace(self, old: Message, new: Message) -> None:
        self.faults.hit()
        super().replace(old, new)


def open_service(data: Path, faults: Faults) -> MemoryService:
    return ToolCalls.open(data, search_index_factory=lambda: FailingSearchIndex(faults))


def found(svc: MemoryService, query: str) -> list[str]:
    return [r["message_id"] for r in svc.search_messages(query=query)["results"]]


@pytest.mark.parametrize("op", ["write", "update", "delete"])
def test_failed_index_update_rebuilds_from_the_store(tmp_path: Path, op: str) -> None:
    faults = Faults()
    svc = open_service(tmp_path / "data", faults)
    try:
        keep = write(svc, "alpha keep")
        target = write(svc, "alpha target")
        assert svc.get_system_health()["status"] == "OK"
        faults.remaining = 1  # the next index mutation fails; the rebuild after it works
        if op == "write":
            new = svc.write_message(session_id="s1", role="user", content="beta new")
            assert new["status"] == "OK"
            expected_beta = [new["message"]["message_id"]]
        elif op == "update":
            upd = svc.update_message(message_id=target, content="beta changed")
            assert upd["changed"] is True and upd["message"]["revision"] == 2
            expected_beta = [target]
        else:
            assert svc.delete_message(message_id=target) == {"status": "OK"}
            expected_beta = []
        # Applied (and failed, and rebuilt from the store) before the next search-index read.
        assert svc.check() == []
        assert faults.remaining == 0
        # The indexes agree with the store: searches, history and counts show the change.
        assert found(svc, "beta") == expected_beta
        alpha = [keep] if op != "write" else [target, keep]
        assert found(svc, "alpha") == alpha
        health = svc.get_system_health()
        assert health["status"] == "DEGRADED"
        assert health["last_error"].startswith("indexes: update after")
        assert "MemoryError" in health["last_error"]
        # rebuild_index clears the diagnostic.
        assert svc.rebuild_index()["status"] == "OK"
        health = svc.get_system_health()
        assert (health["status"], health["last_error"]) == ("OK", "")
    finally:
        svc.close()
    # The change was durable.
    with ToolCalls.open(tmp_path / "data") as again:
        assert found(again, "beta") == expected_beta


def test_failed_rebuild_marks_the_indexes_broken_until_rebuild_index(tmp_path: Path) -> None:
    faults = Faults()
    svc = open_service(tmp_path / "data", faults)
    try:
        first = write(svc, "alpha one")
        faults.remaining = 2  # the update fails, and so does the rebuild after it
        # The write is acknowledged (durable) before its search-index change is applied: the
        # failure comes with the next read of the search index (here health; or the
        # background flush), and leaves the indexes broken, as an inline failure does.
        svc.write_message(session_id="s1", role="user", content="gamma durable")
        health = svc.get_system_health()  # still answers
        assert health["status"] == "DEGRADED" and "run rebuild_index" in health["last_error"]
        # Nothing reads from (or writes through) indexes known to be wrong.
        calls: list[Callable[[], object]] = [
            lambda: svc.search_messages(query="alpha"),
            lambda: svc.read_messages(session_id="s1"),
            lambda: svc.write_message(session_id="s1", role="user", content="x"),
            lambda: svc.delete_message(message_id=first),
        ]
        for call in calls:
            with pytest.raises(InternalError):
                call()
        result = svc.rebuild_index()
        assert result["messages_indexed"] == 2
        assert svc.check() == []
        assert found(svc, "gamma") != []
        history = svc.read_messages(session_id="s1")["history"]
        assert history[0]["message_id"] == first
        assert svc.get_system_health()["status"] == "OK"
    finally:
        svc.close()


def test_failed_background_search_build_is_reported_by_health(tmp_path: Path) -> None:
    """A search index built in the background that fails: search_messages raises
    INTERNAL_ERROR and health says DEGRADED (not OK) until rebuild_index rebuilds it."""
    with ToolCalls.open(tmp_path / "data") as svc:
        for i in range(6):
            write(svc, f"delta {i}")
    faults = Faults()
    faults.remaining = 1
    svc = ToolCalls.open(
        tmp_path / "data",
        search_index_factory=lambda: FailingSearchIndex(faults),
        background_search_from=3,
    )
    try:
        # Until the build has ended, searches scan the store; once it has failed they raise.
        assert svc.wait_for_search_index(timeout=60)
        with pytest.raises(InternalError):
            svc.search_messages(query="delta")
        health = svc.get_system_health()
        assert health["status"] == "DEGRADED"
        assert health["last_error"] == "search index: build failed (MemoryError)"
        assert svc.rebuild_index()["messages_indexed"] == 6
        assert len(found(svc, "delta")) == 6
        assert svc.get_system_health()["status"] == "OK"
    finally:
        svc.close()
