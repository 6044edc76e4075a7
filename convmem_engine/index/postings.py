"""Compressed posting lists: ascending document numbers in 65,536-document containers.

A gram's posting list is either a plain `array('I')` of document numbers (short lists: fewer
than `BIG` documents when built) or a `Postings`, a Roaring-style layout in two arrays (plus
the documents per container, `cards`, derived from them):

    at      array('I'), K + 1 entries: container h (documents h * 65536 ... h * 65536 + 65535)
            is data[at[h]:at[h + 1]] (empty when both are equal)
    data    array('H'), the containers one after the other: a container of fewer than 16,384
            documents (1 in 4) holds their low 16 bits, ascending (2 bytes per document); a
            denser one (and one of exactly 4,096) holds a bitmap of 4,096 16-bit words (bit
            l & 15 of word l >> 4 is the document with low bits l: 8 KiB, 1 byte per document
            or less). A container's length tells which it is: exactly 4,096 words is a bitmap.

Every operation the search planner needs is here and works on both kinds (and on any sorted
sequence of ints for the read-only ones): membership (`contains`, a bisection or a bit test),
ascending and descending iteration (lazily, one container at a time; in C: bitmaps are
unpacked with `bytes.translate` and read with `itertools.compress`), unordered iteration for
set unions and intersections (`members`), insertion and removal. Not thread-safe for mutation
(the index's lock covers it). Iterators copy the container they read, so no buffer stays
exported and a later mutation never fails.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache, partial
from itertools import chain, compress, groupby, pairwise, repeat
from typing import Final, TypeAlias

__all__ = [
    "BIG",
    "BITMAP",
    "PROBE_RATIO",
    "PostingList",
    "Postings",
    "checker",
    "contains",
    "discard",
    "insert",
    "intersect",
    "members",
    "narrow",
    "nbytes",
    "pack",
    "widen",
]

BIG: Final = 1024
"""A plain list that reaches this many documents becomes a `Postings` (below it the per-list
overhead of four objects outweighs the 2 bytes saved per document)."""
BITMAP: Final = 4096
"""Words of a bitmap container (65,536 bits); no array container is this long."""
DENSE: Final = 16384
"""A container of this many documents or more (1 in 4 of its range) is a bitmap; so is one of
exactly BITMAP documents (the same 8 KiB either way, and it keeps lengths unambiguous). Below
1 in 4, reading a bitmap (each of its 65,536 positions is looked at) costs more than reading
2-byte offsets: measured on the corpus, 1 in 8 made the searches that read whole dense lists
(`the and`, `ing ing`) 1.4-2.1x slower for 5.7 MiB (9%) less memory."""
PROBE_RATIO: Final = 16  # intersect(): test each document when the set is this much smaller
_SPAN: Final = 1 << 16
_MASK: Final = _SPAN - 1
_LITTLE: Final = sys.byteorder == "little"
# _PLANES[k]: byte -> its bit k (0 or 1); a bitmap's bytes translated by it are the flags of the
# documents 8j + k.
_PLANES: Final = tuple(bytes((b >> k) & 1 for b in range(256)) for k in range(8))
# _WEIGHTS[k]: flag (0 or 1) -> 1 << k, to pack the flags back into bytes.
_WEIGHTS: Final = tuple(bytes([0, 1 << k]) + bytes(254) for k in range(8))


_BINARY: Final = bytes.maketrans(b"01", b"\x00\x01")
_PIECE: Final = 1024  # bitmap bytes unpacked at a time by the ordered walks (8,192 documents)


@lru_cache(maxsize=1)
def _lows() -> tuple[
    tuple[int, ...], tuple[tuple[int, ...], ...], tuple[int, ...], tuple[int, ...]
]:
    """Shared int objects for reading bitmaps: every low value in order, the eight planes
    (k, k + 8, ...), and 0 ... 8191 ascending and descending (a piece). Made once (2.6 MB),
    so a bitmap is read without making an int for every position it skips."""
    every = tuple(range(_SPAN))
    piece = every[: 8 * _PIECE]
    return every, tuple(every[k::8] for k in range(8)), piece, piece[::-1]


def _raw(data: array[int], s: int) -> bytes:
    """The bitmap container at data[s:s + BITMAP] as bytes: document l is bit l & 7 of byte
    l >> 3."""
    words = data[s : s + BITMAP]
    if not _LITTLE:
        words.byteswap()
    return words.tobytes()


def _piece_flags(raw: bytes, j: int) -> bytes:
    """Flags (0 or 1 bytes) of the documents of piece `j` of a bitmap, descending."""
    bits = int.from_bytes(raw[j * _PIECE : (j + 1) * _PIECE], "little")
    return format(bits, f"0{8 * _PIECE}b").encode("ascii").translate(_BINARY)


def _bitmap_desc(raw: bytes, base: int) -> Iterator[int]:
    """The documents of a bitmap, descending, one piece at a time (lazily)."""
    desc = _lows()[3]
    for j in range(_SPAN // (8 * _PIECE) - 1, -1, -1):
        if raw.count(0, j * _PIECE, (j + 1) * _PIECE) == _PIECE:
            continue
        yield from map((base + j * 8 * _PIECE).__add__, compress(desc, _piece_flags(raw, j)))


def _bitmap_lows(data: array[int], s: int) -> array[int]:
    """The low bits of the documents of the bitmap container at data[s:s + BITMAP],
    ascending, made in C: each byte's bit k spread to flag 8j + k, then the flagged values
    taken from 0 ... 65535."""
    flags = bytearray(_SPAN)
    raw = _raw(data, s)
    for k, plane in enumerate(_PLANES):
        flags[k::8] = raw.translate(plane)
    return array("H", compress(_lows()[0], flags))


def _bitmap_of(lows: Iterable[int]) -> array[int]:
    """The bitmap words of a container holding `lows` (low 16 bits, any order)."""
    flags = bytearray(_SPAN)
    deque(map(flags.__setitem__, lows, repeat(1)), maxlen=0)
    packed = 0
    for k in range(8):
        packed |= int.from_bytes(flags[k::8].translate(_WEIGHTS[k]), "little")
    words = array("H", packed.to_bytes(2 * BITMAP, "little"))
    if not _LITTLE:
        words.byteswap()
    return words


def _widen(lows: array[int], high: int) -> array[int]:
    """Documents high * 65536 + low as an array('I'), made in C (the 16-bit halves are
    interleaved by slice assignments) rather than one addition per document."""
    n = len(lows)
    out = array("H", bytes(4 * n))
    if _LITTLE:
        out[0::2] = lows
        if high:
            out[1::2] = array("H", [high]) * n
    else:
        out[1::2] = lows
        if high:
            out[0::2] = array("H", [high]) * n
    docs = array("I")
    docs.frombytes(out.tobytes())
    return docs


def _narrow(docs: array[int]) -> array[int]:
    """The low 16 bits of documents (an `array('I')`) as an `array('H')`, made in C."""
    halves = array("H", docs.tobytes())
    return halves[0::2] if _LITTLE else halves[1::2]


def _high(doc: int) -> int:
    return doc >> 16


def _cardinality(data: array[int], s: int) -> int:
    """Documents in the bitmap container at data[s:s + BITMAP]."""
    return int.from_bytes(data[s : s + BITMAP].tobytes(), "little").bit_count()


def _is_bitmap(card: int) -> bool:
    """Whether a container of `card` documents is held as a bitmap."""
    return card >= DENSE or card == BITMAP


class Postings:
    """Ascending document numbers in containers (see the module docstring). `len`,
    `contains`, ascending and descending iteration, `members` (any order)."""

    __slots__ = ("at", "cards", "data", "n", "room")

    def __init__(self, at: array[int], data: array[int], n: int) -> None:
        self.at = at
        self.data = data
        self.n = n
        # Entries `data` has room for, or fewer (0: not known): while it is longer than its
        # length, an append cannot reallocate it, so the search index's byte count
        # (SearchIndex.add) needs no size read. Whatever may shrink `data`'s buffer or replace
        # it sets this to 0; appends only grow the buffer.
        self.room = 0
        # Documents per bitmap container (an array container's is its length; this entry is
        # then not kept up to date): a write never has to count a bitmap's bits to know
        # whether it changes kind.
        self.cards = array(
            "I",
            [
                _cardinality(data, at[h]) if at[h + 1] - at[h] == BITMAP else at[h + 1] - at[h]
                for h in range(len(at) - 1)
            ],
        )

    @classmethod
    def of(cls, docs: Iterable[int]) -> Postings:
        """The list of `docs` (ascending, distinct)."""
        out = cls(array("I", [0]), array("H"), 0)
        for high, group in groupby(docs, _high):
            out.add_container(high, array("H", map(_MASK.__and__, group)))
        return out

    def add_container(self, high: int, lows: array[int]) -> None:
        """Append container `high`, after every container held, with `lows` (ascending)."""
        at = self.at
        k = len(at) - 1
        if high < k - 1 or (high == k - 1 and at[k] != at[k - 1]):
            raise ValueError("containers must be appended in order")
        if high >= k:
            at.extend(repeat(at[k], high - k + 1))
            self.cards.extend(repeat(0, high - k + 1))
        data = self.data
        data.extend(_bitmap_of(lows) if _is_bitmap(len(lows)) else lows)
        at[high + 1] = len(data)
        self.cards[high] = len(lows)
        self.n += len(lows)

    def extend_last(self, high: int, lows: array[int]) -> None:
        """A batch build's step: add the documents of container `high` with low bits `lows`
        (ascending, after every document held; `high` is the last container or a new last one),
        kept as an array whatever their number until `seal_last` (the container is complete:
        nothing reads the list meanwhile)."""
        at = self.at
        k = len(at) - 1
        if high >= k:
            at.extend(repeat(at[k], high - k + 1))
            self.cards.extend(repeat(0, high - k + 1))
        elif high != k - 1:
            raise ValueError("containers must be extended in order")
        data = self.data
        data.extend(lows)
        at[-1] = len(data)
        self.cards[high] += len(lows)
        self.n += len(lows)

    def seal_last(self, bitmap: Callable[[array[int]], array[int]] = _bitmap_of) -> None:
        """After `extend_last`: the last container in the kind its size asks for (`bitmap`
        makes a bitmap's words from low bits), as `add_container` would have made it."""
        at = self.at
        s = at[-2]
        if _is_bitmap(at[-1] - s):
            data = self.data
            words = bitmap(data[s:])
            del data[s:]
            data.extend(words)
            at[-1] = len(data)

    def __len__(self) -> int:
        return self.n

    def contains(self, doc: int) -> bool:
        at = self.at
        h = doc >> 16
        if h + 1 >= len(at):
            return False
        s = at[h]
        e = at[h + 1]
        low = doc & _MASK
        data = self.data
        if e - s == BITMAP:
            return bool(data[s + (low >> 4)] >> (low & 15) & 1)
        i = bisect_left(data, low, s, e)
        return i < e and data[i] == low

    def cardinality(self, h: int) -> int:
        """Documents in container `h`."""
        width = self.at[h + 1] - self.at[h]
        return self.cards[h] if width == BITMAP else width

    def _lows(self, h: int) -> array[int]:
        """The low bits of container `h`'s documents, ascending (a copy). A bitmap's are read
        in C (`_bitmap_lows`): a bitmap of 4,096 documents that takes one more becomes an
        array through this, on the write path (0.9 against 4.4 ms by a generator)."""
        s = self.at[h]
        e = self.at[h + 1]
        if e - s == BITMAP:
            return _bitmap_lows(self.data, s)
        return self.data[s:e]

    def _docs(self, h: int) -> array[int]:
        """Container `h`'s documents, ascending, as an array('I')."""
        at = self.at
        s = at[h]
        e = at[h + 1]
        if e - s == BITMAP:
            return _widen(_bitmap_lows(self.data, s), h)
        return _widen(self.data[s:e], h)

    def _container_desc(self, h: int) -> Iterator[int]:
        at = self.at
        s = at[h]
        e = at[h + 1]
        if e - s == BITMAP:
            return _bitmap_desc(_raw(self.data, s), h << 16)
        return reversed(_widen(self.data[s:e], h))

    def _heights(self) -> list[int]:
        at = self.at
        return [h for h in range(len(at) - 1) if at[h] != at[h + 1]]

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(map(self._docs, self._heights()))

    def __reversed__(self) -> Iterator[int]:
        return chain.from_iterable(map(self._container_desc, reversed(self._heights())))

    def members(self) -> Iterator[int]:
        """Every document, in no particular order (for set updates)."""
        at = self.at
        data = self.data
        parts: list[Iterable[int]] = []
        for h in self._heights():
            s = at[h]
            if at[h + 1] - s == BITMAP:
                raw = _raw(data, s)
                planes = _lows()[1]
                base = h << 16
                for k, plane in enumerate(_PLANES):
                    found = compress(planes[k], raw.translate(plane))
                    parts.append(map(base.__add__, found) if base else found)
            else:
                parts.append(_widen(data[s : at[h + 1]], h))
        return chain.from_iterable(parts)

    def _rewrite(self, h: int, lows: array[int]) -> None:
        """Replace container `h` by `lows` (ascending), in the kind its size asks for."""
        at = self.at
        s = at[h]
        e = at[h + 1]
        new = _bitmap_of(lows) if _is_bitmap(len(lows)) else lows
        self.data[s:e] = new
        self.room = 0
        delta = len(new) - (e - s)
        if delta:
            for j in range(h + 1, len(at)):
                at[j] += delta

    def append(self, doc: int) -> None:
        """Add `doc`, larger than every document held (the common case of indexing)."""
        at = self.at
        if doc >> 16 == len(at) - 2:
            e = at[-1]
            width = e - at[-2]
            # An array container that stays one (neither BITMAP long, nor becoming a bitmap).
            if width < DENSE - 1 and width != BITMAP and width != BITMAP - 1:
                self.data.append(doc & _MASK)
                at[-1] = e + 1
                self.n += 1
                return
            if width == BITMAP and self.cards[-1] >= DENSE:  # a bitmap that stays one
                low = doc & _MASK
                self.data[at[-2] + (low >> 4)] |= 1 << (low & 15)
                self.cards[-1] += 1
                self.n += 1
                return
        self.insert(doc)

    def insert(self, doc: int) -> bool:
        """Add `doc` anywhere; False when it was there already."""
        at = self.at
        h = doc >> 16
        low = doc & _MASK
        if h + 1 >= len(at):
            self.add_container(h, array("H", [low]))
            return True
        s = at[h]
        e = at[h + 1]
        data = self.data
        if e - s == BITMAP:
            w = s + (low >> 4)
            bit = 1 << (low & 15)
            if data[w] & bit:
                return False
            data[w] |= bit
            self.cards[h] += 1
            if not _is_bitmap(self.cards[h]):
                self._rewrite(h, self._lows(h))
        else:
            i = bisect_left(data, low, s, e)
            if i < e and data[i] == low:
                return False
            if _is_bitmap(e - s + 1):
                lows = data[s:e]
                lows.insert(i - s, low)
                self._rewrite(h, lows)
                self.cards[h] = len(lows)
            else:
                data.insert(i, low)
                for j in range(h + 1, len(at)):
                    at[j] += 1
        self.n += 1
        return True

    def discard(self, doc: int) -> bool:
        """Remove `doc`; False when it was not there."""
        self.room = 0  # (a removal may shrink the buffer)
        at = self.at
        h = doc >> 16
        if h + 1 >= len(at):
            return False
        s = at[h]
        e = at[h + 1]
        low = doc & _MASK
        data = self.data
        if e - s == BITMAP:
            w = s + (low >> 4)
            bit = 1 << (low & 15)
            if not data[w] & bit:
                return False
            data[w] &= ~bit & _MASK
            self.cards[h] -= 1
            if not _is_bitmap(self.cards[h]):
                self._rewrite(h, self._lows(h))
        else:
            i = bisect_left(data, low, s, e)
            if i == e or data[i] != low:
                return False
            if _is_bitmap(e - s - 1):
                lows = data[s:e]
                del lows[i - s]
                self._rewrite(h, lows)
                self.cards[h] = len(lows)
            else:
                del data[i]
                for j in range(h + 1, len(at)):
                    at[j] -= 1
        self.n -= 1
        while len(at) > 1 and at[-1] == at[-2]:
            at.pop()
            self.cards.pop()
        return True

    def check(self) -> str:
        """'' when the layout is consistent (container bounds, kinds, order, count)."""
        at = self.at
        data = self.data
        if not at or at[0] != 0 or at[-1] != len(data) or (len(at) > 1 and at[-1] == at[-2]):
            return "container table does not cover the data"
        n = 0
        for h in range(len(at) - 1):
            s = at[h]
            e = at[h + 1]
            if e < s or e - s >= DENSE:
                return "container of a wrong size"
            card = _cardinality(data, s) if e - s == BITMAP else e - s
            if len(self.cards) != len(at) - 1 or (e - s == BITMAP and card != self.cards[h]):
                return "container sizes not kept"
            if _is_bitmap(card) != (e - s == BITMAP):
                return "container of the wrong kind for its size"
            if e - s != BITMAP and any(a >= b for a, b in pairwise(data[s:e])):
                return "container not strictly ascending"
            n += card
        if n != self.n:
            return "document count does not match the containers"
        return ""


PostingList: TypeAlias = "array[int] | Postings"


def contains(postings: Sequence[int] | Postings, doc: int) -> bool:
    """Whether `doc` is in a posting list (or in any ascending sequence of ints)."""
    if isinstance(postings, Postings):
        return postings.contains(doc)
    return _in_sorted(postings, doc)


def _in_sorted(postings: Sequence[int], doc: int) -> bool:
    i = bisect_left(postings, doc)
    return i < len(postings) and postings[i] == doc


def checker(postings: Sequence[int] | Postings) -> Callable[[int], bool]:
    """`contains` bound to one list (one call per test instead of two)."""
    if isinstance(postings, Postings):
        return postings.contains
    return partial(_in_sorted, postings)


def intersect(docs: set[int], postings: Sequence[int] | Postings) -> set[int]:
    """The documents of `docs` that are in `postings` (a new set): tested one by one when
    `docs` is much the smaller, else by reading the list in C."""
    if len(docs) * PROBE_RATIO < len(postings):
        return set(filter(checker(postings), docs))
    return docs.intersection(members(postings))


def members(postings: Sequence[int] | Postings) -> Iterable[int]:
    """The documents of a posting list in any order (for set updates)."""
    if type(postings) is Postings:
        return postings.members()
    return postings


def discard(postings: PostingList, doc: int) -> bool:
    """Remove `doc` from a posting list; False when it was not there."""
    if type(postings) is Postings:
        return postings.discard(doc)
    i = bisect_left(postings, doc)  # type: ignore[arg-type]
    if i < len(postings) and postings[i] == doc:  # type: ignore[index]
        del postings[i]  # type: ignore[union-attr]
        return True
    return False


def insert(postings: PostingList, doc: int) -> PostingList:
    """Add `doc` to a posting list (it must not be there yet); returns the list to keep (a plain
    list that reaches `BIG` documents is compressed)."""
    if type(postings) is Postings:
        postings.insert(doc)
        return postings
    assert isinstance(postings, array)
    insort(postings, doc)
    return pack(postings) if len(postings) >= BIG else postings


def pack(postings: array[int]) -> Postings:
    """A plain list's documents (an `array('I')`) as a `Postings`, a container at a time in C
    (a bisection finds each container's documents, `_narrow` their low bits)."""
    out = Postings(array("I", [0]), array("H"), 0)
    i = 0
    n = len(postings)
    while i < n:
        high = postings[i] >> 16
        j = bisect_left(postings, (high + 1) << 16, i)
        out.add_container(high, _narrow(postings[i:j]))
        i = j
    return out


def widen(lows: array[int], high: int) -> array[int]:
    """The documents of container `high` with low bits `lows` (ascending) as an array('I'),
    made in C (`_widen`)."""
    return _widen(lows, high)


def narrow(docs: array[int]) -> array[int]:
    """The low 16 bits of each of `docs` (an array('I')) as an array('H'), made in C
    (`_narrow`)."""
    return _narrow(docs)


_ARRAY_GC: Final = sys.getsizeof(array("I")) - array("I").__sizeof__()
"""What `sys.getsizeof` adds to an array's `__sizeof__` (the collector's header, when the type
has one): `nbytes` calls `__sizeof__` directly, several times faster than `sys.getsizeof`."""
_POSTINGS_GC: Final = sys.getsizeof(Postings.of(())) - Postings.of(()).__sizeof__()


def nbytes(postings: PostingList) -> int:
    """Bytes allocated for a posting list: `sys.getsizeof` of its objects (the same figure,
    from `__sizeof__`: the search index's running byte count calls this on every change)."""
    if type(postings) is Postings:
        return (
            postings.__sizeof__()
            + postings.at.__sizeof__()
            + postings.data.__sizeof__()
            + postings.cards.__sizeof__()
            + _POSTINGS_GC
            + 3 * _ARRAY_GC
        )
    return postings.__sizeof__() + _ARRAY_GC
