"""get_system_health's memory estimate is kept, not walked: after any sequence of writes,
updates, deletes, imports, queued search-index changes (applied by health itself, by the
background flush or by a search), rebuilds (compaction) and reopens (search.idx loaded, or the
search index built in the background), the estimate health returns equals the one a full walk
of every index's objects gives (`memory_estimate(..., walk=True)`, the reference), and the
self-check (which compares every kept count with a fresh one) finds nothing."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, consumes, invariant, rule
from tool_calls import ServiceOnDisk, ToolCalls

from convmem_engine.domain import NotFoundError
from convmem_engine.domain.message import Message, Metadata, Relation
from convmem_engine.service.health import memory_estimate

SESSIONS = ("alpha", "会話", "🎉")
texts = st.text(alphabet="ab cXY設計🎉é", min_size=1, max_size=30).filter(str.strip)
metadata = st.fixed_dictionaries(
    {},
    optional={
        "tags": st.lists(st.sampled_from(("a", "設", "xy")), max_size=2, unique=True),
        "memory_kind": st.sampled_from(("conversation", "summary", "semantic")),
        "importance": st.integers(0, 100),
        "summary": st.one_of(st.just(""), texts),
    },
)


def walked_estimate(svc: ToolCalls) -> dict[str, int]:
    """health's memory estimate with every index walked (the reference)."""
    service = svc.service
    assert service.wait_for_search_index(timeout=60)
    with service._lock.read():
        service._indexes.flush()
        return memory_estimate(service._store.stats(), service._indexes, walk=True)


class HealthMachine(ServiceOnDisk):
    ids = Bundle("ids")

    def __init__(self) -> None:
        # A short flush delay: the background flush applies some queued changes itself.
        super().__init__(search_flush_delay=0.001)
        self.imported = 0
        self.live: list[str] = []  # written ids not deleted (relation targets)

    @rule(
        target=ids,
        session=st.sampled_from(SESSIONS),
        content=texts,
        md=metadata,
        relate=st.booleans(),
    )
    def write(self, session: str, content: str, md: dict[str, Any], relate: bool) -> str:
        md = {k: v for k, v in md.items() if v != ""}
        if relate and self.live:
            md["relations"] = [{"type": "related_to", "message_id": self.live[-1]}]
        out = self.svc.write_message(
            session_id=session, role="user", content=content, metadata_json=json.dumps(md)
        )
        mid = str(out["message"]["message_id"])
        self.live.append(mid)
        return mid

    @rule(mid=ids, content=st.one_of(st.none(), texts), md=st.one_of(st.none(), metadata))
    def update(self, mid: str, content: str | None, md: dict[str, Any] | None) -> None:
        if content is None and md is None:
            return
        with contextlib.suppress(NotFoundError):  # deleted meanwhile
            self.svc.update_message(
                message_id=mid,
                content=content,
                metadata_json=None if md is None else json.dumps(md),
            )

    @rule(mid=consumes(ids))
    def delete(self, mid: str) -> None:
        self.svc.delete_message(message_id=mid)
        if mid in self.live:
            self.live.remove(mid)

    @rule(n=st.integers(1, 5), session=st.sampled_from(SESSIONS), content=texts)
    def import_some(self, n: int, session: str, content: str) -> None:
        """Messages stored as given (ids older than the written ones: out of id order)."""
        batch = []
        for i in range(n):
            self.imported += 1
            k = self.imported
            batch.append(
                Message(
                    message_id=f"01H{k:023d}",
                    session_id=session,
                    timestamp=1_600_000_000_000 + k,
                    role="assistant",
                    content=f"{content} {i}",
                    metadata=Metadata(
                        tags=("imp",),
                        relations=(Relation("derived_from", f"01H{k - 1:023d}"),),
                    ),
                )
            )
        self.svc.service.import_messages(batch)

    @rule(query=texts)
    def search(self, query: str) -> None:
        self.svc.search_messages(query=query, limit=5)

    @rule()
    def let_the_background_flush_run(self) -> None:
        time.sleep(0.01)

    @rule()
    def rebuild(self) -> None:
        self.svc.rebuild_index()

    @rule(background=st.booleans())
    def reopen(self, background: bool) -> None:
        """Closing keeps search.idx: a reopen loads it, or (background) builds the index on a
        thread while the steps go on."""
        self.svc.close()
        if background:
            self.svc = ToolCalls.open(self.dir, background_search_from=0, keep_search_index=False)
        else:
            self.svc = ToolCalls.open(self.dir)

    @invariant()
    def estimate_is_the_walked_one(self) -> None:
        shown = self.svc.get_system_health()["memory_estimate"]
        walked = walked_estimate(self.svc)
        if shown["search_index_bytes"] == 0 and walked["search_index_bytes"]:
            # health ran while the background build was still going (it counts 0 then)
            shown = self.svc.get_system_health()["memory_estimate"]
        assert shown == walked


HealthMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_health_estimate_equals_a_walk = HealthMachine.TestCase
