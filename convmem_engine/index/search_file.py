"""The search index as bytes: what `search.idx` holds (see docs/storage-format.md).

`encode` turns a `SearchIndex` into a stream of byte chunks; `decode` rebuilds the same index
from them (a fraction of the cost of indexing every message again: the posting lists are
copied straight into their arrays). The file around the bytes (magic, the snapshot it belongs
to, CRC-32, atomic replace) is the storage layer's (convmem_engine/storage/derived.py).

Layout (little-endian):

    header      HEADER (see below): format version and the size of every section
    ids         UTF-8 of the document numbers' message ids joined by "\\n" ("" for a removed
                document); an id containing "\\n" is never persisted (encode raises)
    signatures  n_docs x int64, importances n_docs x int8, block timestamps n_blocks x int64
    tables      grams, one-code-point fields, sessions: each as key lengths (u32 code points
                per key), the keys' UTF-8, then their posting-list lengths (u32 per key);
                importance lanes: levels (int8 per lane) and lengths (u32 per lane)
    postings    every posting list (u32 document numbers, ascending) in table order:
                grams, singles, sessions, lanes

Decoding trusts nothing it reads for sizes: every count is checked against what the reader
still holds before anything is allocated; the caller checks the file's CRC-32 and throws the
result away when it fails (so damaged bytes never reach a search).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterator
from itertools import accumulate, pairwise
from typing import Final, TypeVar

from convmem_engine.index.search_index import _BLOCK_SHIFT, SearchIndex, _new_postings

__all__ = ["FORMAT", "decode", "encode"]

FORMAT: Final = 1
"""The payload format; a different one is never decoded (the index is rebuilt instead)."""

# version, n_docs, n_blocks, ids bytes, then per table (grams, singles, sessions): key count,
# key text bytes; lanes; total postings.
HEADER: Final = struct.Struct("<IIIQIQIQIQIQ")
_CHUNK: Final = 1 << 23  # postings copied per read: bounds the extra memory while loading
_ID_WINDOW: Final = 1 << 20  # id table bytes decoded at a time
_EXACT: Final = 4096  # posting lists of at least this many bytes are loaded without spare room
_ZEROS: Final = {"I": array("I", [0])}
_LITTLE: Final = sys.byteorder == "little"

K = TypeVar("K", str, int)
Reader = Callable[[int], bytes]
"""read(n): exactly the next n bytes of the payload (raises ValueError if there are fewer)."""


def _le(arr: array[int]) -> bytes:
    if not _LITTLE:
        arr = array(arr.typecode, arr)
        arr.byteswap()
    return arr.tobytes()


def _from_le(typecode: str, data: bytes | memoryview) -> array[int]:
    arr = array(typecode)
    arr.frombytes(data)
    if not _LITTLE:
        arr.byteswap()
    return arr


def _exact(typecode: str, data: memoryview) -> array[int]:
    """`_from_le` without spare capacity: `frombytes` over-allocates by 1/16 (for growth that
    a loaded list rarely sees); an array made by repetition is exactly its size."""
    arr = _ZEROS[typecode] * (len(data) // _ZEROS[typecode].itemsize)
    memoryview(arr).cast("B")[:] = data
    if not _LITTLE:
        arr.byteswap()
    return arr


def _keys(keys: list[str]) -> tuple[bytes, bytes]:
    """Key lengths (u32 code points each) and the keys' UTF-8."""
    return _le(array("I", map(len, keys))), "".join(keys).encode("utf-8", "surrogatepass")


def encode(index: SearchIndex) -> Iterator[bytes]:
    """The index as a stream of chunks. Raises ValueError for an index it cannot write (a
    message id containing a line feed): the caller then writes nothing."""
    ids = index._ids
    id_text = "\n".join(mid if mid is not None else "" for mid in ids)
    if id_text.count("\n") != max(len(ids) - 1, 0):
        raise ValueError("a message id contains a line feed")
    id_bytes = id_text.encode("utf-8", "surrogatepass")
    del id_text
    tables: list[tuple[list[str], list[array[int]]]] = []
    for table in (index._post, index._singles, index._sessions):
        items = [(k, p) for k, p in table.items() if p]
        tables.append(([k for k, _ in items], [p for _, p in items]))
    lane_items = sorted((k, p) for k, p in index._lanes.items() if p)
    lists = [p for _, ps in tables for p in ps] + [p for _, p in lane_items]
    encoded = [_keys(keys) for keys, _ in tables]
    yield HEADER.pack(
        FORMAT,
        len(ids),
        len(index._blk_ts),
        len(id_bytes),
        *(
            x
            for (keys, _), (_, text) in zip(tables, encoded, strict=True)
            for x in (len(keys), len(text))
        ),
        len(lane_items),
        sum(map(len, lists)),
    )
    yield id_bytes
    del id_bytes
    yield _le(index._sig)
    yield index._imp.tobytes()
    yield _le(index._blk_ts)
    for (_, ps), (lengths, text) in zip(tables, encoded, strict=True):
        yield lengths
        yield text
        yield _le(array("I", map(len, ps)))
    yield array("b", [k for k, _ in lane_items]).tobytes()
    yield _le(array("I", [len(p) for _, p in lane_items]))
    batch: list[bytes] = []
    size = 0
    for p in lists:
        batch.append(_le(p))
        size += len(p)
        if size >= _CHUNK // 4:
            yield b"".join(batch)
            batch, size = [], 0
    if batch:
        yield b"".join(batch)


def _read_keys(read: Reader, count: int, text_bytes: int) -> list[str]:
    lengths = _from_le("I", read(4 * count))
    text = read(text_bytes).decode("utf-8", "surrogatepass")
    ends = list(accumulate(lengths, initial=0))
    if ends[-1] != len(text):
        raise ValueError("key lengths do not match the key text")
    return [text[a:b] for a, b in pairwise(ends)]


Resolver = Callable[[list[str]], list[str | None]]
"""resolve(ids): for consecutive entries of the id table, in document order ("" for a removed
document), the store's own id strings (so the index shares them), None for the "" entries.
Raises ValueError for an id that is not a message of the state the index was written for."""


def decode(read: Reader, resolve: Resolver) -> SearchIndex:
    """The index the chunks of `encode` describe, its message ids given by `resolve`. Raises
    ValueError (or UnicodeDecodeError, ...) for bytes that are not an index of this format or
    not of this store."""
    head = HEADER.unpack(read(HEADER.size))
    (version, n_docs, n_blocks, id_bytes, n_grams, gram_text, n_singles, single_text) = head[:8]
    n_sessions, session_text, n_lanes, total = head[8:]
    if version != FORMAT:
        raise ValueError(f"search index format {version} is not {FORMAT}")
    if n_blocks != (n_docs + (1 << _BLOCK_SHIFT) - 1) >> _BLOCK_SHIFT:
        raise ValueError("block count does not match the document count")
    index = SearchIndex()
    ids = _decode_ids(read(id_bytes), resolve) if n_docs else []
    if len(ids) != n_docs:
        raise ValueError("id count does not match the document count")
    docs: dict[str | None, int] = dict(zip(ids, range(n_docs), strict=True))
    holes = docs.pop(None, None) is not None
    if len(docs) != n_docs - (ids.count(None) if holes else 0):
        raise ValueError("a message id is indexed twice")
    sig = _from_le("q", read(8 * n_docs))
    imp = _from_le("b", read(n_docs))
    blk_ts = _from_le("q", read(8 * n_blocks))
    tables: list[tuple[list[str], array[int]]] = []
    for count, text_bytes in ((n_grams, gram_text), (n_singles, single_text)):
        keys = _read_keys(read, count, text_bytes)
        tables.append((keys, _from_le("I", read(4 * count))))
    sessions = _read_keys(read, n_sessions, session_text)
    tables.append(([sys.intern(s) for s in sessions], _from_le("I", read(4 * n_sessions))))
    levels = _from_le("b", read(n_lanes))
    lane_counts = _from_le("I", read(4 * n_lanes))
    if sum(sum(c) for _, c in tables) + sum(lane_counts) != total:
        raise ValueError("posting list lengths do not add up")
    if len(set(levels)) != n_lanes:
        raise ValueError("an importance lane appears twice")
    post: defaultdict[str, array[int]] = defaultdict(_new_postings)
    singles: dict[str, array[int]] = {}
    session_lists: dict[str, array[int]] = {}
    lanes: dict[int, array[int]] = {}
    _read_lists(read, tables[0][0], tables[0][1], post)
    _read_lists(read, tables[1][0], tables[1][1], singles)
    _read_lists(read, tables[2][0], tables[2][1], session_lists)
    _read_lists(read, list(levels), lane_counts, lanes)
    if len(post) != n_grams or len(singles) != n_singles or len(session_lists) != n_sessions:
        raise ValueError("a key appears twice")
    index._post = post
    index._singles = singles
    index._sessions = session_lists
    index._lanes = lanes
    index._ids = ids
    index._docs = docs  # type: ignore[assignment]  # None was popped
    index._sig = sig
    index._imp = imp
    index._blk_ts = blk_ts
    for g in post:
        if len(g) == 2:
            index._register_bigram(g)
    return index


def _decode_ids(raw: bytes, resolve: Resolver) -> list[str | None]:
    """The id table of one or more documents, resolved to the store's strings; decoded a
    window at a time, so only one window's worth of new strings exists at once."""
    ids: list[str | None] = []
    total = len(raw)
    start = 0
    while True:
        end = total
        if total - start > _ID_WINDOW:
            end = raw.rfind(b"\n", start, start + _ID_WINDOW)
            if end < 0:
                end = raw.find(b"\n", start + _ID_WINDOW)
                end = total if end < 0 else end
        parts = raw[start:end].decode("utf-8", "surrogatepass").split("\n")
        got = resolve(parts)
        if len(got) != len(parts):
            raise ValueError("resolve did not give one id per entry")
        ids.extend(got)
        if end == total:
            return ids
        start = end + 1


def _read_lists(read: Reader, keys: list[K], counts: array[int], out: dict[K, array[int]]) -> None:
    """Read the posting lists of `keys` (lengths `counts`) in batches of about _CHUNK bytes."""
    i = 0
    n = len(keys)
    while i < n:
        j = i
        size = 0
        while j < n and (size == 0 or size + 4 * counts[j] <= _CHUNK):
            size += 4 * counts[j]
            j += 1
        view = memoryview(read(size))
        at = 0
        for k in range(i, j):
            end = at + 4 * counts[k]
            if end == at:
                raise ValueError("an empty posting list")
            out[keys[k]] = (
                _exact("I", view[at:end]) if end - at >= _EXACT else _from_le("I", view[at:end])
            )
            at = end
        view.release()
        i = j
