"""`SearchIndex.add_many` (the batch the service applies its queued writes with) gives exactly
the index that `add` of each message in order gives: the same tables, the same posting lists in
the same layouts (plain list or compressed, each container an array or a bitmap) and the same
search.idx bytes, including when removes and replaces come between the batches."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convmem_engine.domain.message import Message, Metadata
from convmem_engine.index import search_file
from convmem_engine.index.postings import BIG, BITMAP, DENSE, Postings
from convmem_engine.index.search_index import SearchIndex
from convmem_engine.service.index_set import Change, _apply_search_changes
from tests.index.test_search_index import (
    assert_like_reference,
    has_bitmaps,
    index_state,
    msg,
    tag_lists,
    texts,
)


def layout(p: object) -> tuple[object, ...]:
    """A posting list exactly as held: its kind and every array of it."""
    if isinstance(p, Postings):
        return ("postings", list(p.at), p.data.typecode, list(p.data), p.n, list(p.cards))
    assert isinstance(p, array)
    return ("array", p.typecode, list(p))


def exact_state(index: SearchIndex) -> tuple[object, ...]:
    """`index_state` plus the layout of every list and the order of the gram table."""
    return (
        index_state(index),
        [(g, layout(p)) for g, p in index._post.items()],
        {k: layout(p) for k, p in index._lanes.items()},
        {s: layout(p) for s, p in index._sessions.items()},
        {c: layout(p) for c, p in index._singles.items()},
    )


def assert_same(batched: SearchIndex, one_by_one: SearchIndex, msgs: dict[str, Message]) -> None:
    assert batched.check(msgs) == []
    assert one_by_one.check(msgs) == []
    assert exact_state(batched) == exact_state(one_by_one)
    assert b"".join(search_file.encode(batched)) == b"".join(search_file.encode(one_by_one))


def one_by_one(index: SearchIndex, changes: list[Change]) -> None:
    for op, m, new in changes:
        if op == "add":
            index.add(m)
        elif op == "remove":
            index.remove(m)
        else:
            assert new is not None
            index.replace(m, new)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "add", "add", "remove", "replace", "replace_bad", "cut"]),
            st.integers(0, 40),
            texts.filter(bool),
            tag_lists,
            st.one_of(st.none(), texts),
        ),
        max_size=60,
    ),
    st.lists(texts.filter(bool), min_size=1, max_size=3),
)
def test_batches_with_removes_and_replaces_equal_one_by_one(
    ops: list[tuple[str, int, str, tuple[str, ...], str | None]], queries: list[str]
) -> None:
    """A random stream of changes, cut into batches (`cut`) the way the service's queue is:
    each batch applied with runs of adds as `add_many`, against the same changes one by one."""
    batched, single = SearchIndex(), SearchIndex()
    live: dict[str, Message] = {}
    batch: list[Change] = []
    n = 0
    for op, k, text, tags, summary in ops:
        if op == "cut":
            _apply_search_changes(batched, batch, batch_from=0, batch_chars=0)
            one_by_one(single, batch)
            batch = []
            continue
        if op == "add" or not live:
            m = msg(n, text, tags=tags, summary=summary, importance=k % 4, session=f"s{k % 3}")
            n += 1
            batch.append(("add", m, None))
            live[m.message_id] = m
            continue
        old = list(live.values())[k % len(live)]
        if op == "remove":
            batch.append(("remove", old, None))
            del live[old.message_id]
            continue
        new = Message(
            message_id=old.message_id,
            session_id=old.session_id if k % 3 else "s9",
            timestamp=old.timestamp + k,
            role=old.role,
            content=text,
            revision=old.revision + 1,
            metadata=Metadata(tags=tags, importance=k % 4, summary=summary),
        )
        # replace_bad: the value given as old is not the indexed one (the index sweeps).
        batch.append(("replace", new if op == "replace_bad" else old, new))
        live[old.message_id] = new
    _apply_search_changes(batched, batch, batch_from=0, batch_chars=0)
    one_by_one(single, batch)
    assert_same(batched, single, live)
    for q in [*queries, *(m.content[:2] for m in live.values())]:
        assert_like_reference(batched, live, q, 5)


def layout_corpus(n: int) -> list[Message]:
    """`n` messages whose words sit at the posting-list layout edges: "plain" in BIG - 3
    of them (a plain list about to be compressed), "narrow" in BITMAP - 3 (an array container
    about to reach BITMAP documents), "exact" in BITMAP (a bitmap that becomes an array),
    "wide" in DENSE - 3 (an array container about to become a bitmap), "dense" in every one
    (a bitmap that stays one)."""
    words = (("plain", BIG - 3), ("narrow", BITMAP - 3), ("exact", BITMAP), ("wide", DENSE - 3))
    return [
        msg(i, " ".join(["dense", *(w for w, count in words if i < count)]), session=f"s{i % 7}")
        for i in range(n)
    ]


@pytest.mark.parametrize("size", [1, 2, 5, 8, 64])
def test_batches_crossing_layout_changes_equal_one_by_one(size: int) -> None:
    base = layout_corpus(DENSE + 10)
    batched, single = SearchIndex(), SearchIndex()
    assert batched.build(base) and single.build(base)
    assert has_bitmaps(batched)
    more = [
        msg(len(base) + i, f"dense plain narrow exact wide fresh{i % 3} ab", importance=i % 3)
        for i in range(40)
    ]
    for i in range(0, len(more), size):
        batched.add_many(more[i : i + size])
    for m in more:
        single.add(m)
    live = {m.message_id: m for m in [*base, *more]}
    assert_same(batched, single, live)
    kinds = {g: layout(batched._post[g])[0] for g in ("pla", "nar", "exa", "wid", "den")}
    assert set(kinds.values()) == {"postings"}
    for q in ["plain", "narrow", "exact", "wide fresh1", "ab"]:
        assert_like_reference(batched, live, q, 10)


@pytest.mark.slow
def test_a_batch_crossing_into_a_new_container_equals_one_by_one() -> None:
    base = layout_corpus(65_530)
    batched, single = SearchIndex(), SearchIndex()
    assert batched.build(base) and single.build(base)
    more = [msg(len(base) + i, f"dense wide plain x{i % 2}") for i in range(16)]
    batched.add_many(more)
    for m in more:
        single.add(m)
    assert_same(batched, single, {m.message_id: m for m in [*base, *more]})
    assert any(len(p.at) > 2 for p in batched._post.values() if isinstance(p, Postings))


def test_add_many_refuses_an_indexed_or_repeated_id_and_changes_nothing() -> None:
    index = SearchIndex()
    first = msg(1, "alpha")
    index.add(first)
    before = exact_state(index)
    for batch in ([msg(2, "beta"), first], [msg(3, "gamma"), msg(3, "gamma again")]):
        with pytest.raises(ValueError):
            index.add_many(batch)
        assert exact_state(index) == before


def test_a_long_messages_add_pauses_and_indexes_the_same() -> None:
    """`add` with a pause (the background flush's) calls it every 32 grams of a long
    message, and indexes exactly what `add` without one does; a short message's add does not
    pause; the service's short runs of adds (below BATCH_CHARS) give the same index too."""
    words = " ".join(f"w{i}x{i * 7}" for i in range(120))
    long_one, short_one = msg(0, words), msg(1, "a short line")
    paused, plain = SearchIndex(), SearchIndex()
    calls: list[int] = []
    paused.add(long_one, lambda: calls.append(1))
    assert len(calls) >= 10
    calls.clear()
    paused.add(short_one, lambda: calls.append(1))
    assert calls == []
    plain.add(long_one)
    plain.add(short_one)
    assert_same(paused, plain, {m.message_id: m for m in (long_one, short_one)})
    runs, single = SearchIndex(), SearchIndex()
    batch: list[Change] = [("add", msg(n, f"line {n} of a run"), None) for n in range(2, 40)]
    _apply_search_changes(runs, batch, batch_from=0, pause=lambda: None)
    one_by_one(single, batch)
    assert_same(runs, single, {m.message_id: m for _, m, _ in batch})
