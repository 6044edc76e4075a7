"""The whole service against a plain model: random writes, updates, deletes, reads, searches,
rebuilds and reopens, compared after every step."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    consumes,
    invariant,
    precondition,
    rule,
)
from tool_calls import ServiceOnDisk, ToolCalls

from convmem_engine.domain import ConflictError, NotFoundError

KINDS = ("conversation", "episode", "semantic", "procedure", "preference", "summary")
TIERS = ("short", "mid", "long", "discard")
SESSIONS = ("alpha", "βeta", "会話", "🎉")
ALPHABET = "abcXYZ 設計データ🎉é\u0301\n"
texts = st.text(alphabet=ALPHABET, min_size=1, max_size=40).filter(lambda s: s.encode())
tags = st.lists(st.text(alphabet="abc設🎉", min_size=1, max_size=4), max_size=3, unique=True)


def fold(s: str) -> str:
    return "".join(c.lower() if c.isascii() else c for c in s)


@dataclass
class Model:
    message_id: str
    session_id: str
    role: str
    content: str
    timestamp: int
    revision: int = 1
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self, updated_at: int) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "session_id": self.session_id,
            "timestamp": self.timestamp,
            "role": self.role,
            "content": self.content,
            "revision": self.revision,
            "updated_at": updated_at,
            "metadata": self.metadata,
        }


def full_metadata(md: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["tags"] = md.get("tags", [])
    out["memory_tier"] = md.get("memory_tier", "short")
    out["memory_kind"] = md.get("memory_kind", "conversation")
    out["importance"] = md.get("importance", 50)
    if md.get("summary"):
        out["summary"] = md["summary"]
    out["relations"] = md.get("relations", [])
    out["source_message_ids"] = []
    return out


metadata_patches = st.fixed_dictionaries(
    {},
    optional={
        "tags": tags,
        "memory_tier": st.sampled_from(TIERS),
        "memory_kind": st.sampled_from(KINDS),
        "importance": st.integers(0, 100),
        "summary": st.one_of(st.just(""), texts),
    },
)


class ServiceMachine(ServiceOnDisk):
    ids = Bundle("ids")

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[str, Model] = {}  # live messages, insertion order = creation order
        self.updated_at: dict[str, int] = {}

    # -- writes ---------------------------------------------------------------------------------

    @rule(
        target=ids,
        session=st.sampled_from(SESSIONS),
        role=st.sampled_from(("user", "assistant", "system")),
        content=texts,
        md=metadata_patches,
        relate=st.booleans(),
    )
    def write(self, session: str, role: str, content: str, md: dict[str, Any], relate: bool) -> str:
        md = dict(md)
        if relate and self.model:
            target = list(self.model)[-1]
            md["relations"] = [{"type": "related_to", "message_id": target}]
        out = self.svc.write_message(
            session_id=session, role=role, content=content, metadata_json=json.dumps(md)
        )["message"]
        assert all(out["message_id"] > mid for mid in self.model)
        m = Model(out["message_id"], session, role, content, out["timestamp"])
        m.metadata = full_metadata(md)
        assert out == m.to_json(out["timestamp"])
        self.model[m.message_id] = m
        self.updated_at[m.message_id] = out["updated_at"]
        return m.message_id

    @rule(
        mid=ids,
        content=st.one_of(st.none(), texts),
        md=st.one_of(st.none(), metadata_patches),
        right_revision=st.booleans(),
    )
    def update(
        self, mid: str, content: str | None, md: dict[str, Any] | None, right_revision: bool
    ) -> None:
        if content is None and md is None:
            return
        m = self.model.get(mid)
        revision = (m.revision if right_revision else m.revision + 1) if m else 1
        try:
            out = self.svc.update_message(
                message_id=mid,
                content=content,
                metadata_json=None if md is None else json.dumps(md),
                expected_revision=revision,
            )
        except NotFoundError:
            assert m is None
            return
        except ConflictError:
            assert m is not None and not right_revision
            return
        assert m is not None and right_revision
        new_md = dict(m.metadata)
        for key, value in (md or {}).items():
            if key == "summary" and value == "":
                new_md.pop("summary", None)
            else:
                new_md[key] = value
        new_md = full_metadata(new_md)
        new_content = m.content if content is None else content
        changed = new_md != m.metadata or new_content != m.content
        assert out["changed"] is changed
        if changed:
            m.revision += 1
            m.content = new_content
            m.metadata = new_md
            self.updated_at[mid] = out["message"]["updated_at"]
        assert out["message"] == m.to_json(self.updated_at[mid])

    @rule(mid=consumes(ids), guard=st.sampled_from([None, "right", "wrong"]))
    def delete(self, mid: str, guard: str | None) -> None:
        m = self.model.get(mid)
        session = None
        if guard == "right" and m is not None:
            session = m.session_id
        elif guard == "wrong":
            session = "nobody"
        out = self.svc.delete_message(message_id=mid, session_id=session)
        if m is None or guard == "wrong":
            assert out == {"status": "NOT_FOUND"}
        else:
            assert out == {"status": "OK"}
            del self.model[mid]

    @rule()
    def rebuild(self) -> None:
        out = self.svc.rebuild_index()
        assert out["messages_indexed"] == len(self.model)

    @rule()
    def reopen(self) -> None:
        self.svc.close()
        # the search index builds in the background: later steps race with that build
        self.svc = ToolCalls.open(self.dir, background_search_from=0)

    # -- reads ----------------------------------------------------------------------------------

    @rule(session=st.sampled_from(SESSIONS), limit=st.integers(1, 4))
    def history(self, session: str, limit: int) -> None:
        got: list[dict[str, Any]] = []
        cursor = None
        while True:
            out = self.svc.read_messages(session_id=session, limit=limit, cursor=cursor)
            assert len(out["history"]) <= limit
            got.extend(out["history"])
            cursor = out.get("nextCursor")
            if cursor is None:
                break
        want = [
            m.to_json(self.updated_at[m.message_id])
            for m in self.model.values()
            if m.session_id == session
        ]
        assert got == want

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data(), limit=st.integers(1, 8))
    def content(self, data: st.DataObject, limit: int) -> None:
        mid = data.draw(st.sampled_from(sorted(self.model)))
        parts = []
        offset = 0
        while True:
            r = self.svc.read_messages(
                view="content", message_id=mid, content_offset=offset, content_limit=limit
            )["content_range"]
            parts.append(r["content"])
            offset = r["next_content_offset"]
            if r["complete"]:
                break
        assert "".join(parts) == self.model[mid].content

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data(), before=st.integers(0, 2), after=st.integers(0, 2))
    def context(self, data: st.DataObject, before: int, after: int) -> None:
        mid = data.draw(st.sampled_from(sorted(self.model)))
        m = self.model[mid]
        out = self.svc.read_messages(
            view="context", message_id=mid, before=before, after=after, relation_depth=1
        )
        same = [x.message_id for x in self.model.values() if x.session_id == m.session_id]
        i = same.index(mid)
        ctx = out["chronological_context"]
        assert [x["message_id"] for x in ctx["before"]] == same[max(0, i - before) : i]
        assert [x["message_id"] for x in ctx["after"]] == same[i + 1 : i + 1 + after]
        assert out["session"] == {"session_id": m.session_id, "message_count": len(same)}
        want: list[tuple[str, str, str]] = []
        seen = {mid}
        for r in m.metadata["relations"]:
            if r["message_id"] not in seen:
                seen.add(r["message_id"])
                state = "live" if r["message_id"] in self.model else "deleted"
                want.append(("outgoing", r["message_id"], state))
        for x in self.model.values():
            if x.message_id not in seen and any(
                r["message_id"] == mid for r in x.metadata["relations"]
            ):
                seen.add(x.message_id)
                want.append(("incoming", x.message_id, "live"))
        got = [
            (
                r["direction"],
                r["message"]["message_id"] if "message" in r else r["message_id"],
                "live" if "message" in r else r["status"],
            )
            for r in out["relations"]
        ]
        assert got == want
        assert out["truncated"] is False

    @rule()
    def sessions(self) -> None:
        out = self.svc.read_messages(view="sessions", limit=1000)["sessions"]
        firsts: dict[str, Model] = {}
        for m in self.model.values():
            firsts.setdefault(m.session_id, m)
        assert [s["session_id"] for s in out] == list(firsts)
        for s in out:
            members = [m for m in self.model.values() if m.session_id == s["session_id"]]
            assert s["message_count"] == len(members)
            assert s["started_at"] == members[0].timestamp
            assert s["last_message_at"] == members[-1].timestamp
            counts = {k: 0 for k in KINDS}
            for m in members:
                counts[m.metadata["memory_kind"]] += 1
            assert s["kind_counts"] == counts
            with_summary = [m for m in members if "summary" in m.metadata]
            kind_summary = [m for m in members if m.metadata["memory_kind"] == "summary"]
            if with_summary:
                assert s["representative_summary"] == with_summary[-1].metadata["summary"]
            elif kind_summary:
                assert s["representative_summary"] == kind_summary[-1].content
            else:
                assert s["representative_summary"] == members[-1].content

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def search(self, data: st.DataObject) -> None:
        m = data.draw(st.sampled_from(list(self.model.values())))
        words = [w for w in m.content.split() if len(w) >= 2]
        if not words:
            return
        query = data.draw(st.sampled_from(words))
        out = self.svc.search_messages(query=query, limit=100)
        found = {r["message_id"] for r in out["results"]}
        assert found <= set(self.model)
        want = {x.message_id for x in self.model.values() if fold(query) in fold(x.content)}
        assert want <= found

    @invariant()
    def counts(self) -> None:
        h = self.svc.get_system_health()
        assert h["active_messages"] == len(self.model)
        assert h["session_count"] == len({m.session_id for m in self.model.values()})
        assert h["status"] == "OK"


ServiceMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_service_against_model = ServiceMachine.TestCase


@pytest.mark.slow
def test_service_against_model_long() -> None:
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        ServiceMachine,
        settings=settings(
            max_examples=300,
            stateful_step_count=60,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
