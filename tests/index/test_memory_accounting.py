"""The indexes' byte counts (health's memory estimate, docs/semantics.md) are kept up to date by
every change instead of being counted by walking the objects: after any sequence of adds,
batches, removes (with the indexed value or a stale one), replaces, clears, builds and loads
from search.idx, each index's kept count equals a walk of its objects (`memory_bytes_fresh`,
`sys.getsizeof` of every object: the reference)."""

from __future__ import annotations

import sys
from array import array
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convmem_engine.domain.message import MEMORY_KINDS, Message, Metadata, Relation
from convmem_engine.index import search_file
from convmem_engine.index.history_index import HistoryIndex, _fresh_bytes
from convmem_engine.index.postings import BIG, BITMAP, DENSE, Postings, nbytes
from convmem_engine.index.relation_index import RelationIndex
from convmem_engine.index.search_index import SearchIndex
from tests.index.test_search_file import reader, resolver
from tests.index.test_search_index import msg

WORDS = ("common", "shared", "ab", "abc", "x", "設計", "🎉", "café", "Zz", "a")
BASE = BIG + 60  # messages of "common ...": those grams' lists are compressed (Postings)


def base_messages() -> list[Message]:
    return [
        msg(i, f"common {WORDS[i % len(WORDS)]}", session=f"s{i % 5}", importance=i % 3)
        for i in range(BASE)
    ]


contents = st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join)
op_specs = st.lists(
    st.tuples(
        st.sampled_from(
            (
                *("add", "batch", "remove", "stale_remove", "replace", "stale_replace"),
                *("move", "clear", "build", "load"),
            )
        ),
        contents,
        st.integers(0, 3),  # importance, session, batch size, ...
        st.integers(0, 10**6),  # which live message
    ),
    max_size=25,
)


def live_pick(live: dict[str, Message], k: int) -> Message | None:
    if not live:
        return None
    keys = list(live)
    return live[keys[k % len(keys)]]


def assert_counted(index: SearchIndex) -> None:
    assert index.memory_bytes() == index.memory_bytes_fresh()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=op_specs, built=st.booleans())
def test_search_index_count_equals_a_walk_after_any_changes(
    ops: list[tuple[str, str, int, int]], built: bool
) -> None:
    base = base_messages()
    index = SearchIndex()
    if built:
        assert index.build(base)
    else:
        index.add_many(base[:BIG])
        for m in base[BIG:]:
            index.add(m)
    assert any(isinstance(p, Postings) for p in index._post.values())
    assert_counted(index)
    live = {m.message_id: m for m in base}
    n = BASE
    for op, content, small, k in ops:
        target = live_pick(live, k)
        if op == "add":
            m = msg(n, content, tags=(content[:2],), importance=small, session=f"s{small}")
            n += 1
            index.add(m)
            live[m.message_id] = m
        elif op == "batch":
            ms = [msg(n + i, f"{content} {i}", summary=content) for i in range(small + 2)]
            n += len(ms)
            index.add_many(ms)
            live.update((m.message_id, m) for m in ms)
        elif op in ("remove", "stale_remove") and target is not None:
            # A stale value (not the one indexed) makes the index sweep every list for it.
            index.remove(target if op == "remove" else replace(target, content=content + "!"))
            del live[target.message_id]
        elif op in ("replace", "stale_replace", "move") and target is not None:
            new = replace(
                target,
                content=content,
                session_id=f"s{small}" if op == "move" else target.session_id,
                metadata=Metadata(importance=small * 30, summary=content[::-1] or None),
                revision=target.revision + 1,
            )
            old = target if op != "stale_replace" else replace(target, content=content + "?")
            index.replace(old, new)
            live[target.message_id] = new
        elif op == "clear":
            index.clear()
            live = {}
        elif op == "build":
            index = SearchIndex()
            assert index.build(list(live.values()))
        elif op == "load":
            blob = b"".join(search_file.encode(index))
            index = search_file.decode(reader(blob), resolver(live))
        assert_counted(index)
    assert index.check(live) == []


def test_nbytes_is_getsizeof_of_the_list_objects() -> None:
    plain = array("I", range(10))
    assert nbytes(plain) == sys.getsizeof(plain)
    for docs in (range(5), range(0, 200_000, 3), range(70_000, 70_000 + BITMAP), range(20_000)):
        p = Postings.of(docs)
        want = sum(map(sys.getsizeof, (p, p.at, p.data, p.cards)))
        assert nbytes(p) == want


def test_a_big_index_crossing_layouts_keeps_its_count() -> None:
    """Appends that reach every layout change (a plain list packed at BIG, a container
    becoming a bitmap, a wide array container, a new container) through add, add_many and
    the inlined fast paths."""
    index = SearchIndex()
    ms = [msg(i, "dense" if i % 2 else "dense sparse", session=f"s{i % 3}") for i in range(17_000)]
    index.add_many(ms[:5000])
    assert_counted(index)
    for m in ms[5000:9000]:
        index.add(m)
    assert_counted(index)
    for i in range(9000, 17_000, 700):
        index.add_many(ms[i : i + 700])
    assert_counted(index)
    live = {m.message_id: m for m in ms}
    for m in ms[:200]:
        index.remove(m)
        del live[m.message_id]
    assert_counted(index)
    assert index.check(live) == []


# -- history and relations ---------------------------------------------------------------------

history_ops = st.lists(
    st.tuples(
        st.sampled_from(("add", "remove", "replace", "build")),
        st.integers(0, 4),  # session
        st.sampled_from(MEMORY_KINDS),
        st.booleans(),  # summary
        st.integers(0, 10**6),
    ),
    max_size=40,
)


def hmsg(n: int, session: int, kind: str, summary: bool, related: list[str]) -> Message:
    return Message(
        message_id=f"01J{n:023d}",
        session_id=f"s{session}",
        timestamp=1_700_000_000_000 + n,
        role="user",
        content="x",
        metadata=Metadata(
            memory_kind=kind,
            summary="sum" if summary else None,
            relations=tuple(Relation("related_to", r) for r in related),
        ),
    )


@settings(max_examples=80, deadline=None)
@given(ops=history_ops, columns=st.booleans())
def test_history_and_relation_counts_equal_a_walk_after_any_changes(
    ops: list[tuple[str, int, str, bool, int]], columns: bool
) -> None:
    history = HistoryIndex()
    relations = RelationIndex()
    live: dict[str, Message] = {}
    n = 0
    for op, session, kind, summary, k in ops:
        target = live_pick(live, k)
        if op == "add":
            related = [*list(live)[-2:], "01Jgone"]
            m = hmsg(n, session, kind, summary, related[: k % 4])
            n += 1
            history.add(m)
            relations.add(m)
            live[m.message_id] = m
        elif op == "remove" and target is not None:
            history.remove(target)
            relations.remove(target)
            del live[target.message_id]
        elif op == "replace" and target is not None:
            new = replace(
                target,
                metadata=Metadata(memory_kind=kind, summary="s" if summary else None, relations=()),
            )
            history.replace(target, new)
            relations.replace(target, new)
            live[target.message_id] = new
        elif op == "build":
            history = HistoryIndex()
            plain = all(m.metadata == Metadata() for m in live.values())
            if columns and plain:
                sessions = sorted({m.session_id for m in live.values()})
                number = {s: i for i, s in enumerate(sessions)}
                history.build_columns(
                    list(live), [number[m.session_id] for m in live.values()], sessions
                )
            else:
                history.build(live.values())
            relations = RelationIndex()
            relations.build(live.values())
        assert history.memory_bytes() == history.memory_bytes_fresh()
        assert relations.memory_bytes() == relations.memory_bytes_fresh()
        for sid in {m.session_id for m in live.values()}:
            sess = history.session(sid)
            assert sess is not None and sess.memory_bytes() == _fresh_bytes(sess)


def _allocated(p: Postings) -> int:
    return (p.data.__sizeof__() - array("H").__sizeof__()) // 2


def test_postings_room_never_exceeds_what_the_buffer_holds() -> None:
    """`Postings.room` (SearchIndex.add's no-reallocation test) is at most the entries its
    data buffer has room for after every kind of change: a container becoming a bitmap
    (its buffer shrinks), a bitmap becoming an array, removals down to nothing, appends."""
    changes = [
        (range(DENSE - 1), lambda p: p.insert(DENSE)),  # array -> bitmap: the buffer shrinks
        (range(DENSE), lambda p: p.discard(0)),  # bitmap -> array
        (range(3), lambda p: [p.discard(d) for d in range(3)]),  # emptied: buffer freed
        (range(100), lambda p: p.append(200_000)),  # a new container
        (range(100), lambda p: p.append(100)),
        (range(0, 70_000, 2), lambda p: p.insert(1)),
    ]
    for docs, change in changes:
        p = Postings.of(docs)
        p.room = _allocated(p)  # as SearchIndex.add leaves it after an append
        change(p)
        assert p.room <= _allocated(p)


def test_removing_one_entry_keeps_an_arrays_buffer() -> None:
    """What the search index's byte count relies on when it removes a document
    (`SearchIndex._discard_gram`): CPython's array reallocates only to shrink by 16 entries or
    more, so `del a[i]` and `a.pop()` leave `__sizeof__` as it was, down to an empty array."""
    for code, n in (("I", 1), ("I", 5), ("I", 1000), ("H", 5_000)):
        a = array(code, range(n))
        a.append(1)  # spare room, as appends leave it
        size = a.__sizeof__()
        while a:
            if len(a) % 2:
                del a[len(a) // 2]
            else:
                a.pop()
            assert a.__sizeof__() == size
