"""search_file: a SearchIndex encoded and decoded is the same index (every table, every posting
list) and searches exactly like an index built by adding the same messages; bytes that are
not a whole index are refused."""

from __future__ import annotations

import random
from array import array
from collections.abc import Callable
from itertools import pairwise

import pytest

from convmem_engine.domain.message import Message, Metadata
from convmem_engine.index import search_file
from convmem_engine.index.postings import BITMAP, DENSE, Postings
from convmem_engine.index.search_index import SearchIndex
from tests.index.test_search_index import index_state

WORDS = ["alpha", "beta", "ha", "ing", "日本語", "é", "a", "x", "x_y", "Zeta", "ç", "🙂", "lo"]
QUERIES = ["alpha", "ha ha", "ing", "a", "x", "日本", "🙂", "zeta beta", "é", "lo ha", "q"]


def random_messages(rng: random.Random, n: int) -> dict[str, Message]:
    out = {}
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 6))]
        md = Metadata(
            importance=rng.choice([0, 10, 50, 90]),
            summary=rng.choice(["", "a", " ".join(rng.sample(WORDS, 2))]),
            tags=tuple(sorted({rng.choice(WORDS) for _ in range(rng.randint(0, 2))})),
        )
        mid = f"m{i:05d}"
        content = rng.choice([" ", "-", ""]).join(words)
        out[mid] = Message(mid, f"s{i % 5}", 1000 + i, "user", content, 1, 1000 + i, md)
    return out


def reader(blob: bytes) -> Callable[[int], bytes]:
    pos = 0

    def read(n: int) -> bytes:
        nonlocal pos
        if n < 0 or n > len(blob) - pos:
            raise ValueError("past the end")
        pos += n
        return blob[pos - n : pos]

    return read


def resolver(messages: dict[str, Message]) -> search_file.Resolver:
    def resolve(raws: list[str]) -> list[str | None]:
        out: list[str | None] = []
        for raw in raws:
            if raw and raw not in messages:
                raise ValueError("unknown id")
            out.append(messages[raw].message_id if raw else None)
        return out

    return resolve


@pytest.mark.parametrize("seed", range(6))
def test_decode_of_encode_is_the_same_index(seed: int) -> None:
    rng = random.Random(seed)
    messages = random_messages(rng, rng.randint(0, 700))
    index = SearchIndex()
    for m in messages.values():
        index.add(m)
    # Removals and replacements leave holes and moved documents behind.
    for mid in rng.sample(sorted(messages), len(messages) // 4):
        if rng.random() < 0.5:
            index.remove(messages.pop(mid))
        else:
            old = messages[mid]
            new = random_messages(rng, 1)["m00000"]
            new = Message(
                mid, new.session_id, old.timestamp, "user", new.content, 2, 9, new.metadata
            )
            index.replace(old, new)
            messages[mid] = new
    blob = b"".join(search_file.encode(index))
    loaded = search_file.decode(reader(blob), resolver(messages))
    assert index_state(loaded) == index_state(index)
    assert loaded.check(messages) == []
    rebuilt = SearchIndex()
    for m in messages.values():
        rebuilt.add(m)
    for q in QUERIES:
        for kw in ({}, {"session_id": "s1"}, {"min_importance": 50}):
            want = rebuilt.search(q, messages, limit=12, **kw)  # type: ignore[arg-type]
            assert loaded.search(q, messages, limit=12, **kw) == want  # type: ignore[arg-type]
    # The loaded index keeps working: more changes, same as the original.
    extra = random_messages(random.Random(seed + 100), 3)
    for i, m in enumerate(extra.values()):
        m = Message(f"new{i}", m.session_id, 5000 + i, "user", m.content, 1, 5000 + i, m.metadata)
        index.add(m)
        loaded.add(m)
    assert index_state(loaded) == index_state(index)


def test_truncated_or_unknown_bytes_are_refused() -> None:
    rng = random.Random(5)
    messages = random_messages(rng, 200)
    index = SearchIndex()
    for m in messages.values():
        index.add(m)
    blob = b"".join(search_file.encode(index))

    resolve = resolver(messages)

    for cut in [0, 10, len(blob) // 3, len(blob) - 1]:
        with pytest.raises(ValueError):
            search_file.decode(reader(blob[:cut]), resolve)
    with pytest.raises(ValueError):  # another store: the ids are not its messages
        search_file.decode(reader(blob), resolver({}))
    other = bytearray(blob)
    other[0] = search_file.FORMAT + 1
    with pytest.raises(ValueError):
        search_file.decode(reader(bytes(other)), resolve)


@pytest.mark.parametrize("n", [1, 2, 50_000])
def test_holes_and_long_id_tables(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Removed documents at the ends, and an id table decoded in many windows."""
    monkeypatch.setattr(search_file, "_ID_WINDOW", 64)
    messages = {f"id{i}": Message(f"id{i}", "s", i, "user", f"w{i % 7}", 1, i) for i in range(n)}
    index = SearchIndex()
    for m in messages.values():
        index.add(m)
    for mid in {"id0", f"id{n - 1}"}:
        index.remove(messages.pop(mid))
    blob = b"".join(search_file.encode(index))
    loaded = search_file.decode(reader(blob), resolver(messages))
    assert index_state(loaded) == index_state(index)
    # Lists loaded without spare room still grow and shrink.
    extra = Message("extra", "s", n, "user", "w0 w1", 1, n)
    for ix in (index, loaded):
        ix.add(extra)
        for m in list(messages.values())[n // 2 : n // 2 + 1]:
            ix.remove(m)
    assert index_state(loaded) == index_state(index)


def test_an_id_with_a_line_feed_is_not_encoded() -> None:
    index = SearchIndex()
    index.add(Message("a\nb", "s", 1, "user", "hello", 1, 1))
    with pytest.raises(ValueError):
        b"".join(search_file.encode(index))


def test_compressed_lists_round_trip_and_bad_layouts_are_refused() -> None:
    from tests.index.test_search_index import dense_corpus, has_bitmaps

    messages = {m.message_id: m for m in dense_corpus(20_000, 21)}
    index = SearchIndex()
    assert index.build(messages.values())
    for mid in random.Random(22).sample(sorted(messages), 300):
        index.remove(messages.pop(mid))
    assert has_bitmaps(index)
    assert all(type(p) is Postings for p in index._lanes.values())  # compressed lanes too
    blob = b"".join(search_file.encode(index))
    loaded = search_file.decode(reader(blob), resolver(messages))
    assert index_state(loaded) == index_state(index)
    assert all(type(p) is Postings for p in loaded._lanes.values())
    assert loaded.check(messages) == []
    for q in ["lo", "la ve", "ta ta ta", "l", "hel"]:
        assert loaded.search(q, messages, limit=20) == index.search(q, messages, limit=20)
        want = index.search(q, messages, limit=20, min_importance=60)
        assert loaded.search(q, messages, limit=20, min_importance=60) == want

    def refused(damage: Callable[[Postings], None]) -> None:
        copy = search_file.decode(reader(blob), resolver(messages))
        p = next(
            p
            for p in copy._post.values()
            if isinstance(p, Postings) and BITMAP in {e - s for s, e in pairwise(p.at)}
        )
        damage(p)
        with pytest.raises(ValueError):
            search_file.decode(reader(b"".join(search_file.encode(copy))), resolver(messages))

    def wrong_count(p: Postings) -> None:
        p.n += 1

    def table_past_the_data(p: Postings) -> None:
        p.at[-1] += 1

    def sparse_bitmap(p: Postings) -> None:
        h = next(h for h in range(len(p.at) - 1) if p.at[h + 1] - p.at[h] == BITMAP)
        for w in range(p.at[h], p.at[h] + BITMAP - 100):
            p.data[w] = 0

    def container_too_long(p: Postings) -> None:
        p.at[1:] = array("I", [x + DENSE for x in p.at[1:]])
        p.data.extend(range(DENSE))

    for damage in (wrong_count, table_past_the_data, sparse_bitmap, container_too_long):
        refused(damage)
    # A compressed lane's layout is checked like a gram's.
    copy = search_file.decode(reader(blob), resolver(messages))
    lane = copy._lanes[50]
    assert isinstance(lane, Postings)
    lane.n -= 1
    with pytest.raises(ValueError):
        search_file.decode(reader(b"".join(search_file.encode(copy))), resolver(messages))


def test_the_postings_section_is_chunked_without_an_object_per_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`_postings_chunks`: the lists' little-endian bytes in order, the short ones copied into
    one buffer (a chunk at most _WRITE_CHUNK bytes; lists filling it exactly, landing on its
    end, empty ones), a list of _WRITE_CHUNK bytes or more as a chunk of its own."""
    monkeypatch.setattr(search_file, "_WRITE_CHUNK", 64)
    big = Postings(array("I", [0, 20]), array("H", range(20)), 20)
    lists = [
        array("I", range(10)),  # 40 bytes
        array("I", range(6)),  # 24: the buffer exactly full
        array("I"),
        array("I", range(100, 120)),  # 80: its own chunk
        array("I", [7]),
        big,  # its table (8 bytes) buffered, its 40 bytes of data too
        array("I", range(5)),  # 20: over 64 with the 52 buffered: a new chunk first
        array("I", range(16)),  # 64: its own
    ]
    chunks = list(search_file._postings_chunks(lists))
    want = b"".join(search_file._le(a) for p in lists for a in search_file._list_arrays(p))
    assert b"".join(chunks) == want
    assert [len(c) for c in chunks] == [64, 80, 52, 20, 64]
    assert all(type(c) is bytes for c in chunks)  # a chunk is kept as it is by any reader


def test_encoding_holds_about_a_chunk_of_its_own() -> None:
    """While `encode` streams an index of many small posting lists, what it allocates beyond
    the index stays about one chunk: no copy of the id table, no object per posting list."""
    import tracemalloc

    rng = random.Random(7)
    index = SearchIndex()
    for m in random_messages(rng, 3000).values():
        index.add(m)
    for i in range(20_000):  # many sessions: many small lists, and a sizeable key table
        index.add(Message(f"n{i:06d}", f"session {i}", i, "user", f"w{i}", 1, i, Metadata()))
    expected = b"".join(search_file.encode(index))
    tracemalloc.start()
    try:
        size = 0
        for chunk in search_file.encode(index):
            size += len(chunk)
            del chunk
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size == len(expected)
    assert peak < 2 * search_file._WRITE_CHUNK + (512 << 10), peak  # (was 3.7 MB; now 2.2)
