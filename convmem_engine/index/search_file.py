"""The search index as bytes: what `search.idx` holds (see docs/storage-format.md).

`encode` turns a `SearchIndex` into a stream of byte chunks; `decode` rebuilds the same index
from them (a fraction of the cost of indexing every message again: the posting lists are
copied straight into their arrays). The file around the bytes (magic, the snapshot it belongs
to, CRC-32, atomic replace) is the storage layer's (convmem_engine/storage/derived.py).

Layout (little-endian):

    header      HEADER (see below): format version and the size of every section
    ids         UTF-8 of the document numbers' message ids joined by "\\n" ("" for a removed
                document); an id containing "\\n" is never persisted (encode raises)
    signatures  n_docs x u32, importances n_docs x int8, block timestamps n_blocks x int64,
                block field lengths n_blocks x u32
    tables      grams, one-code-point fields, sessions: each as key lengths (u32 code points
                per key), the keys' UTF-8, then their posting-list lengths (u32 documents per
                key); for grams also each list's shape: containers (u32; 0 for a plain list)
                and data words (u32); importance lanes: levels (int8 per lane), lengths
                (u32 per lane) and shapes (containers, then data words: u32 per lane each)
    postings    every posting list in table order (grams, singles, sessions, lanes): a plain
                list as u32 document numbers, ascending; a compressed one (postings.py) as its
                container table (containers + 1 u32) then its data (u16 words)

Decoding trusts nothing it reads for sizes: every count is checked against what the reader
still holds before anything is allocated; the caller checks the file's CRC-32 and throws the
result away when it fails (so damaged bytes never reach a search).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import accumulate, chain, pairwise
from typing import Final, TypeVar, cast

from convmem_engine.index.doc_table import DocTable
from convmem_engine.index.heap import release_free_memory
from convmem_engine.index.postings import BITMAP, DENSE, PostingList, Postings
from convmem_engine.index.search_index import _BLOCK_SHIFT, SearchIndex

__all__ = ["FORMAT", "decode", "encode"]

FORMAT: Final = 4
"""The payload format; a different one is never decoded (the index is rebuilt instead). 4: 32-bit
signatures and compressed importance lanes (3: 64-bit signatures, lanes as plain lists)."""

# version, n_docs, n_blocks, ids bytes, then per table (grams, singles, sessions): key count,
# key text bytes; lanes; bytes of the postings section.
HEADER: Final = struct.Struct("<IIIQIQIQIQIQ")
_CHUNK: Final = 1 << 23  # postings copied per read: bounds the extra memory while loading
_WRITE_CHUNK: Final = 1 << 20  # bytes per chunk written: bounds the extra memory while saving
_ID_BATCH: Final = 1 << 13  # ids per chunk of the id table written (~220 kB)
_TRIM_WRITTEN: Final = 1 << 23
"""encode(): the heap is trimmed (index/heap.py) after each section and every this many bytes
of postings: what a chunk is made in re-uses free heap pages trimmed before, and they stay in
memory once it is freed: encoding a loaded index of a million messages raised the RSS by
+8.8 MiB without them, +5.7 MiB with them (docs/benchmarks.md, "rebuild500")."""
_ID_WINDOW: Final = 1 << 20  # id table bytes decoded at a time
_EXACT: Final = 4096  # posting lists of at least this many bytes are loaded without spare room
_ZEROS: Final = {"I": array("I", [0]), "H": array("H", [0])}
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


def _keys(table: Mapping[str, PostingList]) -> tuple[int, bytes, bytes]:
    """The count of `table`'s non-empty lists, their keys' lengths (u32 code points each) and
    the keys' UTF-8, made from the table in place (no list of its items)."""
    keys = [k for k, p in table.items() if p]
    return (
        len(keys),
        _le(array("I", map(len, keys))),
        "".join(keys).encode("utf-8", "surrogatepass"),
    )


def _lists(table: Mapping[str, PostingList]) -> Iterator[PostingList]:
    """`table`'s non-empty posting lists in table order."""
    return filter(None, table.values())


def _shape(p: PostingList) -> tuple[int, int]:
    """(containers, data words) of a compressed list; (0, 0) for a plain one."""
    if isinstance(p, Postings):
        return len(p.at) - 1, len(p.data)
    return 0, 0


def _nbytes(count: int, containers: int, words: int) -> int:
    return 4 * (containers + 1) + 2 * words if containers else 4 * count


def _list_arrays(p: PostingList) -> tuple[array[int], ...]:
    return (p.at, p.data) if isinstance(p, Postings) else (p,)


def _postings_chunks(lists: Iterable[PostingList]) -> Iterator[bytes]:
    """The posting lists' bytes (little-endian), in chunks of about _WRITE_CHUNK bytes: the
    lists shorter than that copied straight from their arrays into one buffer (no bytes object
    per list: a million small ones would churn the heap, whose trimmed pages they bring back
    into memory), a longer one as a chunk of its own. Holds the buffer and the chunk being
    written, nothing else."""
    buf = bytearray(_WRITE_CHUNK)
    view = memoryview(buf)
    used = 0
    written = 0
    for p in lists:
        for arr in _list_arrays(p):
            n = len(arr) * arr.itemsize
            if used + n > _WRITE_CHUNK and used:
                yield bytes(view[:used])
                written += used
                used = 0
            if n >= _WRITE_CHUNK:  # a long list on its own
                yield _le(arr)
                written += n
            elif n:
                view[used : used + n] = memoryview(arr).cast("B") if _LITTLE else _le(arr)
                used += n
        if written >= _TRIM_WRITTEN:
            release_free_memory()
            written = 0
    if used:
        yield bytes(view[:used])
    view.release()


def _id_texts(ids: list[str | None]) -> Iterator[str]:
    """The id table's text ("\\n".join of the ids, "" for None) in pieces: each batch of
    _ID_BATCH ids joined, a "\\n" on its own between two batches. So saving never holds the
    whole table twice (its text and its UTF-8: 52 MB at a million documents), and a batch is
    joined straight from its slice (no list grown from a generator, no copy with its line
    feed added: blocks that would re-use, and so bring back into memory, the heap's trimmed
    free pages; index/heap.py). ValueError for an id containing a line feed."""
    n = len(ids)
    for i in range(0, n, _ID_BATCH):
        part = ids[i : i + _ID_BATCH]
        if None in part:  # removed documents: rare
            part = ["" if mid is None else mid for mid in part]
        text = "\n".join(cast("list[str]", part))
        del part
        if text.count("\n") != min(_ID_BATCH, n - i) - 1:
            raise ValueError("a message id contains a line feed")
        if i:
            yield "\n"
        yield text


def _utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _array_bytes(arr: array[int]) -> Iterator[bytes]:
    """`arr` little-endian, in pieces of at most _WRITE_CHUNK bytes."""
    step = max(_WRITE_CHUNK // arr.itemsize, 1)
    for i in range(0, len(arr), step):
        yield _le(arr[i : i + step])


def encode(index: SearchIndex) -> Iterator[bytes]:
    """The index as a stream of chunks. Raises ValueError for an index it cannot write (a
    message id containing a line feed) before the first chunk: the caller then writes
    nothing. Holds at most about _WRITE_CHUNK bytes of its own beyond the index (and the
    tables' keys and a few u32 per list) while streaming: no second copy of the id table or
    of the posting lists, and no object per list (the tables are walked again for each
    section; the caller holds the index still)."""
    ids = index._ids
    id_size = sum(map(_utf8_size, _id_texts(ids)))  # checks every id before anything is written
    tables: tuple[Mapping[str, PostingList], ...] = (index._post, index._singles, index._sessions)
    lane_levels = sorted(k for k, p in index._lanes.items() if p)
    lanes = [index._lanes[k] for k in lane_levels]
    shapes = array("I")  # containers then data words, per gram list then per lane
    total = 0
    for p in chain(_lists(index._post), lanes):
        containers, words = _shape(p)
        shapes.append(containers)
        shapes.append(words)
        total += _nbytes(len(p), containers, words)
    total += 4 * sum(map(len, chain(_lists(index._singles), _lists(index._sessions))))
    sizes = [(count, len(text)) for count, _, text in map(_keys, tables)]  # (made again below)
    grams = sizes[0][0]
    release_free_memory()
    yield HEADER.pack(
        FORMAT,
        len(ids),
        len(index._blk_ts),
        id_size,
        *(x for size in sizes for x in size),
        len(lane_levels),
        total,
    )
    for piece in _id_texts(ids):
        yield piece.encode("utf-8", "surrogatepass")
    release_free_memory()
    yield from _array_bytes(index._sig)
    yield index._imp.tobytes()
    yield _le(index._blk_ts)
    yield _le(index._blk_len)
    for i, table in enumerate(tables):
        _, lengths, text = _keys(table)
        yield lengths
        yield text
        del lengths, text
        yield _le(array("I", map(len, _lists(table))))
        if i == 0:
            yield _le(shapes[0 : 2 * grams : 2])
            yield _le(shapes[1 : 2 * grams : 2])
    yield array("b", lane_levels).tobytes()
    yield _le(array("I", map(len, lanes)))
    yield _le(shapes[2 * grams :: 2])
    yield _le(shapes[2 * grams + 1 :: 2])
    del shapes
    release_free_memory()
    yield from _postings_chunks(chain(*map(_lists, tables), lanes))


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


def decode(
    read: Reader, resolve: Resolver, ids_done: Callable[[], None] | None = None
) -> SearchIndex:
    """The index the chunks of `encode` describe, its message ids given by `resolve`
    (`ids_done()`, when given, is called once every id is resolved). Raises
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
    if ids_done is not None:
        ids_done()
    docs = DocTable(ids)  # ValueError for an id indexed twice
    sig = _from_le("I", read(4 * n_docs))
    imp = _from_le("b", read(n_docs))
    blk_ts = _from_le("q", read(8 * n_blocks))
    blk_len = _from_le("I", read(4 * n_blocks))
    keys = _read_keys(read, n_grams, gram_text)
    tables = [(keys, _from_le("I", read(4 * n_grams)))]
    containers = _from_le("I", read(4 * n_grams))
    words = _from_le("I", read(4 * n_grams))
    keys = _read_keys(read, n_singles, single_text)
    tables.append((keys, _from_le("I", read(4 * n_singles))))
    sessions = _read_keys(read, n_sessions, session_text)
    tables.append(([sys.intern(s) for s in sessions], _from_le("I", read(4 * n_sessions))))
    levels = _from_le("b", read(n_lanes))
    lane_counts = _from_le("I", read(4 * n_lanes))
    lane_containers = _from_le("I", read(4 * n_lanes))
    lane_words = _from_le("I", read(4 * n_lanes))
    sizes = [_nbytes(*shape) for shape in zip(tables[0][1], containers, words, strict=True)]
    lane_sizes = [
        _nbytes(*shape) for shape in zip(lane_counts, lane_containers, lane_words, strict=True)
    ]
    plain = sum(sum(c) for _, c in tables[1:])
    if sum(sizes) + sum(lane_sizes) + 4 * plain != total:
        raise ValueError("posting list lengths do not add up")
    if len(set(levels)) != n_lanes:
        raise ValueError("an importance lane appears twice")
    post: dict[str, PostingList] = {}
    singles: dict[str, array[int]] = {}
    session_lists: dict[str, array[int]] = {}
    lanes: dict[int, PostingList] = {}
    _read_lists(read, tables[0][0], tables[0][1], post, containers, sizes)
    _read_lists(read, tables[1][0], tables[1][1], singles)  # type: ignore[arg-type]
    _read_lists(read, tables[2][0], tables[2][1], session_lists)  # type: ignore[arg-type]
    _read_lists(read, list(levels), lane_counts, lanes, lane_containers, lane_sizes)
    if len(post) != n_grams or len(singles) != n_singles or len(session_lists) != n_sessions:
        raise ValueError("a key appears twice")
    index._install(
        post=post,
        singles=singles,
        sessions=session_lists,
        lanes=lanes,
        ids=ids,
        docs=docs,
        sig=sig,
        imp=imp,
        blk_ts=blk_ts,
        blk_len=blk_len,
    )
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


def _compressed(view: memoryview, count: int, containers: int) -> Postings:
    """A `Postings` from its bytes (container table, then data), its layout checked: the
    table covers the data in order, containers are at most a bitmap wide, a bitmap holds at
    least BITMAP documents, and the documents add up to `count`."""
    table = 4 * (containers + 1)
    at = _from_le("I", view[:table])
    data = _exact("H", view[table:]) if len(view) - table >= _EXACT else _from_le("H", view[table:])
    p = Postings(at, data, count)
    if at[-1] != len(data) or at[0] != 0 or (containers and at[-1] == at[-2]):
        raise ValueError("a container table does not cover its data")
    widths = [e - s for s, e in pairwise(at)]
    if min(widths) < 0 or max(widths) >= DENSE:
        raise ValueError("a container of a wrong size")
    n = sum(w for w in widths if w != BITMAP)
    for h, w in enumerate(widths):
        if w == BITMAP:
            card = p.cardinality(h)
            if card < DENSE and card != BITMAP:
                raise ValueError("a bitmap container of too few documents")
            n += card
    if n != count:
        raise ValueError("a compressed list does not hold its count")
    return p


def _read_lists(
    read: Reader,
    keys: list[K],
    counts: array[int],
    out: dict[K, PostingList],
    containers: array[int] | None = None,
    sizes: list[int] | None = None,
) -> None:
    """Read the posting lists of `keys` (lengths `counts`; for compressed lists, `containers`
    and byte `sizes`) in batches of about _CHUNK bytes."""
    if sizes is None:
        sizes = [4 * c for c in counts]
    i = 0
    n = len(keys)
    while i < n:
        j = i
        size = 0
        while j < n and (size == 0 or size + sizes[j] <= _CHUNK):
            size += sizes[j]
            j += 1
        view = memoryview(read(size))
        at = 0
        for k in range(i, j):
            end = at + sizes[k]
            if counts[k] == 0:
                raise ValueError("an empty posting list")
            if containers is not None and containers[k]:
                out[keys[k]] = _compressed(view[at:end], counts[k], containers[k])
            else:
                out[keys[k]] = (
                    _exact("I", view[at:end]) if end - at >= _EXACT else _from_le("I", view[at:end])
                )
            at = end
        view.release()
        i = j
