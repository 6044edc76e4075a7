"""History and relation indexes: incremental maintenance equals a fresh build."""

from __future__ import annotations

import random
from dataclasses import replace
from itertools import repeat

from hypothesis import example, given, settings
from hypothesis import strategies as st
from ulid import ULID

from convmem_engine.domain import Message, Metadata, Relation
from convmem_engine.domain.message import DEFAULT_METADATA
from convmem_engine.index.history_index import HistoryIndex
from convmem_engine.index.relation_index import RelationIndex
from convmem_engine.service.index_set import _build_history_and_relations
from convmem_engine.storage.packed import MessageTable


def make_ids(n: int) -> list[str]:
    base = 5 << 80
    return [str(ULID.from_bytes((base + i).to_bytes(16, "big"))) for i in range(n)]


def msg(mid: str, session: str, kind: str = "conversation", **md: object) -> Message:
    return Message(mid, session, 5, "user", "x", metadata=Metadata(memory_kind=kind, **md))  # type: ignore[arg-type]


def test_history_pages_and_neighbours() -> None:
    ids = make_ids(10)
    h = HistoryIndex()
    for i, mid in enumerate(ids):
        h.add(msg(mid, "a" if i % 2 == 0 else "b"))
    a_ids = ids[0::2]
    page, more = h.ids_after("a", None, 2)
    assert page == a_ids[:2] and more
    page, more = h.ids_after("a", page[-1], 10)
    assert page == a_ids[2:] and not more
    # Deleting the cursor's own message neither skips nor repeats.
    h.remove(msg(a_ids[1], "a"))
    assert h.ids_after("a", a_ids[1], 10)[0] == a_ids[2:]
    assert h.neighbours("a", a_ids[2], 1, 1) == ([a_ids[0]], [a_ids[3]])
    assert h.neighbours("a", a_ids[0], 5, 0) == ([], [])
    assert h.message_count("a") == 4 and h.message_count("zz") == 0
    assert h.ids_after("zz", None, 5) == ([], False)


def test_session_order_and_aggregates() -> None:
    ids = make_ids(6)
    h = HistoryIndex()
    h.add(msg(ids[0], "s1"))
    h.add(msg(ids[1], "s2", "summary"))
    h.add(msg(ids[2], "s1", "semantic", summary="sum"))
    h.add(msg(ids[3], "s3"))
    assert h.sessions_after(None, 10) == (["s1", "s2", "s3"], False)
    assert h.sessions_after(ids[1], 10) == (["s3"], False)
    # s1's first message goes: s1 now sorts by its next message (ids[2]) after s2.
    h.remove(msg(ids[0], "s1"))
    assert h.sessions_after(None, 10)[0] == ["s2", "s1", "s3"]
    s1 = h.session("s1")
    assert s1 is not None and s1.kind_count_map()["semantic"] == 1 and s1.summary_ids == [ids[2]]
    s2 = h.session("s2")
    assert s2 is not None and s2.kind_summary_ids == [ids[1]]
    h.replace(msg(ids[2], "s1", "semantic", summary="sum"), msg(ids[2], "s1", "episode"))
    assert not s1.summary_ids and s1.kind_count_map()["episode"] == 1
    assert sum(s1.kind_counts) == 1
    h.remove(msg(ids[2], "s1"))
    assert h.session("s1") is None and h.session_count() == 2
    assert h.memory_bytes() > 0


def test_history_random_ops_match_fresh_build() -> None:
    rng = random.Random(7)
    ids = make_ids(300)
    live: dict[str, Message] = {}
    h = HistoryIndex()
    r = RelationIndex()
    for mid in ids:
        op = rng.random()
        if op < 0.6 or not live:
            targets = rng.sample(sorted(live), k=min(len(live), rng.randint(0, 3)))
            m = msg(
                mid,
                f"s{rng.randint(0, 8)}",
                rng.choice(["conversation", "summary", "semantic"]),
                relations=tuple(Relation("related_to", t) for t in targets),
            )
            live[mid] = m
            h.add(m)
            r.add(m)
        elif op < 0.8:
            victim = live.pop(rng.choice(sorted(live)))
            h.remove(victim)
            r.remove(victim)
        else:
            old = live[rng.choice(sorted(live))]
            new = replace(old, metadata=replace(old.metadata, relations=(), memory_kind="episode"))
            live[old.message_id] = new
            h.replace(old, new)
            r.replace(old, new)
    fresh = HistoryIndex()
    fresh.build(live.values())
    fresh_r = RelationIndex()
    fresh_r.build(live.values())
    assert r.same_as(fresh_r)
    assert fresh.sessions_after(None, 100) == h.sessions_after(None, 100)
    for sid in fresh.sessions_after(None, 100)[0]:
        a, b = h.session(sid), fresh.session(sid)
        assert a is not None and b is not None
        assert (a.ids, a.kind_counts, a.summary_ids, a.kind_summary_ids) == (
            b.ids,
            b.kind_counts,
            b.summary_ids,
            b.kind_summary_ids,
        )


def test_relation_index_incoming() -> None:
    a, b, c = make_ids(3)
    r = RelationIndex()
    mb = msg(b, "s", relations=(Relation("depends_on", a), Relation("related_to", a)))
    mc = msg(c, "s", relations=(Relation("supersedes", a),))
    r.add(mb)
    r.add(mc)
    assert r.incoming(a) == [(b, "depends_on"), (b, "related_to"), (c, "supersedes")]
    assert r.incoming_count(a) == 3
    r.remove(mb)
    assert r.incoming(a) == [(c, "supersedes")]
    r.remove(mc)
    assert r.incoming(a) == [] and r.target_count() == 0


def history_state(h: HistoryIndex) -> object:
    """Everything a HistoryIndex holds, in the order it holds it."""
    sessions = [
        (sid, s.ids, s.kind_counts, s.summary_ids, s.kind_summary_ids)
        for sid, s in ((sid, h.session(sid)) for sid in h.session_ids())
        if s is not None
    ]
    return sessions, h.sessions_after(None, 1 << 30), h.memory_bytes()


# (session, kind, summary) of each message; None for the default metadata.
_MESSAGE = st.tuples(
    st.integers(0, 6),
    st.one_of(
        st.none(),
        st.tuples(st.sampled_from(["conversation", "summary", "episode"]), st.booleans()),
    ),
)


@settings(max_examples=60, deadline=None)
@given(
    messages=st.lists(_MESSAGE, max_size=60),
    seed=st.integers(0, 1 << 16),
    deleted=st.sets(st.integers(0, 59), max_size=20),
    prune=st.booleans(),
)
@example(messages=[(0, None), (1, None)] * 3, seed=0, deleted=set(), prune=False)
def test_history_fast_build_matches_general(
    messages: list[tuple[int, tuple[str, bool] | None]],
    seed: int,
    deleted: set[int],
    prune: bool,
) -> None:
    """The store's columns path (no message with metadata) and its rows path give the same
    index as a build from the Messages: sessions interleaved, ids stored out of order, some
    deleted and their sessions pruned to placeholders."""
    ids = make_ids(len(messages))
    order = list(range(len(messages)))
    random.Random(seed).shuffle(order)
    table = MessageTable()
    for i in order:
        session, md = messages[i]
        if md is None:
            table.set(msg(ids[i], f"s{session}"))
        else:
            kind, summary = md
            table.set(msg(ids[i], f"s{session}", kind, summary="sum" if summary else None))
    for i in deleted:
        if i < len(ids):
            table.pop(ids[i])
    if prune:
        table.prune_sessions()
    view = table.view
    general = HistoryIndex()
    general.build(view.values())
    built = HistoryIndex()
    built.build(list(view.values())[::-1])  # any order of messages: the same index
    assert history_state(built) == history_state(general)
    built = HistoryIndex()
    _build_history_and_relations(built, RelationIndex(), view)
    assert history_state(built) == history_state(general)
    columns = view.history_columns()
    plain = all(m.metadata == DEFAULT_METADATA for m in view.values())
    assert (columns is not None) == plain
    if columns is not None:
        ids_, numbers, names = columns
        rows = HistoryIndex()
        rows.build_rows(zip(ids_, map(names.__getitem__, numbers), repeat(DEFAULT_METADATA)))
        assert history_state(rows) == history_state(general)
