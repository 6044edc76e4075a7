"""`SearchIndex.add_many` (the batch the service applies its queued writes with) gives exactly
the index that `add` of each message in order gives: the same tables, the same posting lists in
the same layouts (plain list or compressed, each container an array or a bitmap) and the same
search.idx bytes, including when removes and replaces come between the batches."""

from __future__ import annotations

import subprocess
import sys
from array import array
from pathlib import Path
from unittest.mock import patch

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

ROOT = Path(__file__).resolve().parent.parent.parent


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
    """`add` with a pause (the background flush's) calls it every 32 grams of a message of
    256 grams or more, and indexes exactly what `add` without one does; a short message's
    add does not pause; the service's short runs of adds (below BATCH_CHARS) give the same
    index too."""
    words = " ".join(f"w{i}x{i * 7}" for i in range(200))
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


# -- the batch build (`SearchIndex.build`, NumPy: index/gram_batch.py) ------------------------


def in_gram_order(index: SearchIndex) -> SearchIndex:
    """`index` with its gram table in gram order. The one thing a build and `add` of each
    message may order differently: `add` puts new grams in the order of each message's gram
    set (a hash order, the process's string hash seed), the build in the order of its chunks
    and gram kinds. Nothing reads the table's order but search.idx's layout."""
    index._post = dict(sorted(index._post.items()))
    return index


def assert_built_like_added(messages: list[Message]) -> SearchIndex:
    """The batch build of `messages` against `add` of each: the same tables, posting lists in
    the same layouts, and the same search.idx bytes (gram tables in the same order)."""
    built = SearchIndex()
    assert built.build(messages)
    added = SearchIndex()
    for m in messages:
        added.add(m)
    live = {m.message_id: m for m in messages}
    in_gram_order(built)
    in_gram_order(added)
    assert built.check(live) == []
    assert index_state(built) == index_state(added)
    for tables in ("_post", "_lanes", "_sessions", "_singles"):
        mine, theirs = getattr(built, tables), getattr(added, tables)
        if tables != "_lanes":  # (a build makes the lanes in level order; search.idx too)
            assert list(mine) == list(theirs)
        assert {k: kept(p) for k, p in mine.items()} == {k: kept(p) for k, p in theirs.items()}
    assert b"".join(search_file.encode(built)) == b"".join(search_file.encode(added))
    return built


def kept(p: object) -> tuple[object, ...]:
    """`layout` without the document counts of array containers (`Postings.cards`: kept for
    bitmaps only; `add` leaves an array container's stale, a build's is right)."""
    if not isinstance(p, Postings):
        return layout(p)
    at = list(p.at)
    bitmaps = [c for h, c in enumerate(p.cards) if at[h + 1] - at[h] == BITMAP]
    return ("postings", at, list(p.data), p.n, bitmaps)


# Code points the build must treat exactly as `add` does: ASCII case, the edge markers' and the
# word marker's own code points, U+0000 (the build's padding for short words), a lone
# surrogate, combining marks, scripts without spaces, astral code points, letters that Unicode
# lower-cases (not folded: ASCII case only).
BUILD_ALPHABET = [
    *"aAbBzZ09_ -.,!?",
    *"\x00\x01\x02\x03\x1f",
    *"Éé\u0301ßİ\u212a",
    "e\u0301",
    *"設計書ก",
    *"🎉👍\u200d",
    "\ud800",
    "Ⅻ",
]
build_texts = st.lists(st.sampled_from(BUILD_ALPHABET), max_size=12).map("".join)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            build_texts.filter(bool),
            st.one_of(st.none(), build_texts),
            st.lists(build_texts.filter(bool), max_size=3).map(tuple),
            st.integers(0, 3),
        ),
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 80),
    st.integers(1, 24),
)
def test_build_in_chunks_and_parts_equals_adding(
    specs: list[tuple[str, str | None, tuple[str, ...], int]], chunk: int, part: int
) -> None:
    """Random fields (one code point, control characters, non-ASCII, CJK, astral, a lone
    surrogate; summaries and tags), built in chunks of `chunk` code points whose text grams
    are grouped in parts of `part` rows: the very index `add` of each message makes."""
    from convmem_engine.index import gram_batch, search_index

    messages = [
        msg(i, content, summary=summary, tags=tags, importance=k, session=f"s{k}")
        for i, (content, summary, tags, k) in enumerate(specs)
    ]
    with (
        patch.object(search_index, "_CHUNK_POINTS", chunk),
        patch.object(gram_batch, "_PART", part),
    ):
        assert_built_like_added(messages)


def test_build_with_more_code_points_than_16_bit_ranks_equals_adding() -> None:
    """A chunk with over 65,408 distinct code points that are not ASCII: ranks of 17 bits, so
    a whole word of four code points takes two keys; words of every length up to five."""
    points = [c for c in range(0xA0, 0x30000) if not 0xD800 <= c < 0xE000][:70_000]
    words: list[str] = []
    at = 0
    for k, length in enumerate((1, 2, 3, 4, 5) * (len(points) // 15)):
        words.append("".join(map(chr, points[at : at + length])) + ("A" if k % 7 == 0 else ""))
        at += length
    messages = [
        msg(0, "The start, then " + " ".join(words[: len(words) // 2])),
        msg(1, " ".join(words[len(words) // 2 :]), tags=("x", "WORD")),
        msg(2, "plain ASCII words here"),
    ]
    built = assert_built_like_added(messages)
    assert sum(len(g) == 6 for g in built._post) > 1000  # whole words of four
    live = {m.message_id: m for m in messages}
    for q in (words[10], words[9001][:3], words[-3], "plain", "\x01"):
        assert_like_reference(built, live, q, 5)


def test_build_over_dense_and_plain_lists_in_chunks_equals_adding() -> None:
    """The layout edges (a plain list reaching BIG mid-container, containers of exactly BITMAP
    documents and of DENSE - 3, bitmaps) built in many small chunks."""
    from convmem_engine.index import search_index

    with patch.object(search_index, "_CHUNK_POINTS", 4096):
        built = assert_built_like_added(layout_corpus(DENSE + 10))
    assert has_bitmaps(built)


def test_the_first_build_loads_numpy_and_an_empty_one_does_not() -> None:
    """NumPy is imported by a build with something to index only: a fresh interpreter that
    builds an empty index has not loaded it, one that builds two messages has."""
    code = (
        "import sys\n"
        "from convmem_engine.index.search_index import SearchIndex\n"
        "from convmem_engine.domain.message import Message\n"
        "assert SearchIndex().build([])\n"
        "print('numpy' in sys.modules)\n"
        "m = [Message(f'01J{i:023d}', 's', i, 'user', 'hello there') for i in range(2)]\n"
        "assert SearchIndex().build(m)\n"
        "print('numpy' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    assert out == ["False", "True"]


def test_a_start_that_loads_search_idx_never_imports_numpy(tmp_path: Path) -> None:
    """The normal start: the store's search.idx is loaded, nothing is built, NumPy is never
    imported (it is loaded only by a rebuild)."""
    from convmem_engine.service.memory_service import MemoryService

    svc = MemoryService.open(tmp_path)
    for i in range(50):
        svc.write_message(session_id="s", role="user", content=f"hello number {i}")
    svc.close()  # writes search.idx
    assert any(p.name == "search.idx" for p in tmp_path.rglob("*"))
    code = (
        "import sys\n"
        "from convmem_engine.service.memory_service import MemoryService\n"
        "from convmem_engine.service import search_persist\n"
        "loaded = []\n"
        "real = search_persist.PersistedSearch.load\n"
        "def load(self):\n"
        "    index = real(self)\n"
        "    loaded.append(index is not None)\n"
        "    return index\n"
        "search_persist.PersistedSearch.load = load\n"
        "svc = MemoryService.open(sys.argv[1])\n"
        "assert svc.wait_for_search_index(60)\n"
        "hits = svc.search_messages(query='number 7')\n"
        "svc.close()\n"
        "print(loaded, 'numpy' in sys.modules, len(hits['results']))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.split()
    assert out[:2] == ["[True]", "False"], out
