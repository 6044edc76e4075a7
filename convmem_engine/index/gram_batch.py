"""The search index's batch build: the grams of a chunk of documents, grouped with NumPy.

`SearchIndex.build` hands this module a chunk of documents' fields (about half a million code
points, within one 65,536-document container) and gets back, for every gram of them, the
documents holding it, ascending and distinct: exactly the gram sets `_grams` makes for each
message (2-grams, 3-grams, the field edge grams START + first two and last two + END, the
word-boundary grams), turned around into one list per gram. The per-posting work that made
the build ~3x SQLite FTS5's (a string, a set insert and an append per gram and message, in the
interpreter: docs/benchmarks.md) is done on arrays instead:

- the chunk's fields are joined, each as START + field + END, and read as code points (ASCII
  text: `lower` and one byte each; else one UTF-32 encode, then ASCII-case-folded);
- code points are replaced by their rank in the chunk's alphabet (ASCII as itself, the other
  code points after it in code point order), so that a gram is a small integer key (21 bits
  for a 3-gram of ASCII text);
- each gram kind (3-grams and edges, 2-grams, word starts, whole words of 2, 3 and 4) is one
  key per occurrence plus its document, in document order; a stable LSD radix sort (NumPy's
  stable argsort of 16-bit digits is a counting sort) groups equal keys and keeps each
  group's documents ascending; repeated (gram, document) pairs are dropped. Text grams are
  grouped in parts of about `_PART` occurrences, each a range of first code points (no gram
  is in two parts): the sort's arrays are a part's, not the chunk's;
- only each distinct gram's string is made in Python.

NumPy is imported only here, and this module only by a build with something to index
(`SearchIndex.build`): a process that loads its index from search.idx never imports it.
NumPy's sorts and element-wise loops let go of the GIL, so the service's other threads run
beside a background build.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt

from convmem_engine.index.search_text import _END, _START, _WORD, _is_word_char

__all__ = ["Group", "bitmap_words", "chunk_groups"]

Ranks: TypeAlias = npt.NDArray[np.uint32]
Ints: TypeAlias = "npt.NDArray[np.unsignedinteger[Any]]"
"""Ranks (8, 16 or 32 bits), and gram keys (32 or 64 bits)."""
Group: TypeAlias = "tuple[list[str], list[int], array[int], array[int]]"
"""Distinct grams, ascending; where each one's documents start in the two arrays (and their
end); the low 16 bits of those documents (array('H')) and the documents themselves
(array('I')): gram k's are [bounds[k]:bounds[k + 1]], ascending, distinct."""
_ASCII: Final = 128
_WORD_TABLE: Final = np.array([_is_word_char(chr(c)) for c in range(_ASCII)], dtype=bool)
_ALL_ASCII: Final = np.arange(_ASCII, dtype=np.uint32)
_SPAN: Final = 1 << 16
_RANK_TYPES: Final = (np.uint8, np.uint16, np.uint32)
_PART: Final = 1 << 16  # text grams grouped at a time (`_parts`)


def chunk_groups(texts: list[str], lows: array[int], start: int) -> Iterator[Group]:
    """Every gram of the fields `texts` (each at least two code points; `lows[i]` the low bits
    of the document of `texts[i]`, in ascending order; `start` the first document of their
    container), with the documents holding it: one `Group` per gram kind (3-grams with the edge
    grams, 2-grams, word starts, whole words of 2, 3 and 4 code points; the text grams in
    parts). The chunk's own arrays take ~5 bytes per code point, a part's ~30 per occurrence."""
    if not texts:
        return
    # START + field + END for each field: the 3-grams of that are the field's 3-grams and its
    # two edge grams (a field of two code points: just the edges).
    seg = np.fromiter(map(len, texts), dtype=np.intp, count=len(texts))
    seg += 2
    joined = _START + f"{_END}{_START}".join(texts) + _END
    ranks: Ints
    if joined.isascii():  # folded by `lower` (A-Z only), a byte per code point
        ranks = np.frombuffer(joined.lower().encode("ascii"), dtype=np.uint8)
        alphabet = None
        bits = int(ranks.max()).bit_length()
    else:
        cps = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype="<u4")
        ranks, alphabet, bits = _ranked(cps)
        del cps
    del joined
    ends = np.cumsum(seg)
    ends -= 1  # each field's END
    firsts = ends - seg
    firsts += 1  # each field's START
    doc_of = np.repeat(np.frombuffer(lows, dtype=np.uint16), seg)
    del seg
    n = len(ranks)
    # 3-grams: windows at every position but the last two of each field's span.
    valid = np.ones(n - 2, dtype=bool)
    valid[ends[:-1]] = False
    valid[ends[:-1] - 1] = False
    yield from _parts(
        [ranks[:-2], ranks[1:-1], ranks[2:]], doc_of[:-2], valid, bits, alphabet, start
    )
    # 2-grams: windows inside a field (not START + first, last + END, nor across fields).
    valid = np.ones(n - 1, dtype=bool)
    valid[firsts] = False
    valid[ends - 1] = False
    valid[ends[:-1]] = False
    del ends, firsts
    cols = [ranks[:-1], ranks[1:]]
    yield from _parts(cols, doc_of[:-1], valid, bits, alphabet, start)
    del cols
    del valid
    # Words: maximal runs of word code points (START and END are not: no run crosses a field).
    word = _word_flags(alphabet)[ranks].view(np.int8)
    edges = np.diff(word)
    del word
    first = np.flatnonzero(edges == 1)
    first += 1
    size = np.flatnonzero(edges == -1)
    size += 1
    size -= first
    del edges
    at = first[size >= 4]  # a word of 4 or more: WORD + its first three
    keys = _keys([ranks[at], ranks[at + 1], ranks[at + 2]], bits, None)
    yield _group(keys, doc_of[at], bits, 3, alphabet, _WORD, "", start)
    for length in (2, 3, 4):  # a word of 2 to 4: WORD + it + WORD
        at = first[size == length]
        keys = _keys([ranks[at + k] for k in range(length)], bits, None)
        yield _group(keys, doc_of[at], bits, length, alphabet, _WORD, _WORD, start)


def bitmap_words(lows: array[int]) -> array[int]:
    """The bitmap container (postings.py) of the documents with low bits `lows`: 4,096 16-bit
    words, document l at bit l & 15 of word l >> 4 (little-endian: bit l & 7 of byte l >> 3)."""
    flags = np.zeros(_SPAN, dtype=bool)
    flags[np.frombuffer(lows, dtype=np.uint16)] = True
    words = array("H")
    words.frombytes(np.packbits(flags, bitorder="little").tobytes())
    if sys.byteorder != "little":
        words.byteswap()
    return words


def _ranked(cps: Ranks) -> tuple[Ints, Ranks, int]:
    """Each code point's rank in the chunk's alphabet once ASCII-case-folded (ASCII as itself,
    the others from 128 on in code point order; some are not ASCII), in the smallest unsigned
    type that holds them; the alphabet (rank -> code point) and the bits a rank takes."""
    folded = cps - 65
    upper = folded < 26  # A-Z
    folded += 65
    folded[upper] += 32
    del upper
    high = folded >= _ASCII
    others = np.sort(folded[high])
    keep = np.ones(len(others), dtype=bool)
    np.not_equal(others[1:], others[:-1], out=keep[1:])
    others = others[keep]
    bits = (_ASCII + len(others) - 1).bit_length()
    ranks: Ints = folded.astype(_RANK_TYPES[(bits > 8) + (bits > 16)])
    ranks[high] = np.searchsorted(others, folded[high]) + _ASCII
    return ranks, np.concatenate((_ALL_ASCII, others)), bits


def _word_flags(alphabet: Ranks | None) -> npt.NDArray[np.bool_]:
    """Rank -> whether that code point is a word code point (`_is_word_char`)."""
    if alphabet is None:
        return _WORD_TABLE
    others = [_is_word_char(chr(c)) for c in alphabet[_ASCII:].tolist()]
    return np.concatenate((_WORD_TABLE, np.array(others, dtype=bool)))


def _parts(
    cols: list[Ints],
    docs: npt.NDArray[np.uint16],
    valid: npt.NDArray[np.bool_],
    bits: int,
    alphabet: Ranks | None,
    start: int,
) -> Iterator[Group]:
    """`_group` of the rows of `cols` where `valid` says so (text 2-grams or 3-grams), in parts
    of about `_PART` rows, each a range of the first column's values: a gram is in one part
    only, so the parts' groups are the whole's (no more of them), while the sort's arrays
    (~24 bytes a row) are a part's, not the chunk's."""
    count = int(np.count_nonzero(valid))
    if count <= _PART:
        yield _group(
            _keys(cols, bits, valid), docs[valid], bits, len(cols), alphabet, "", "", start
        )
        return
    # Each value of the first column goes to part (rows of smaller values) // _PART: parts of
    # about _PART rows (a value more frequent than that makes a larger one), in value order.
    values = (1 << bits) if alphabet is None else len(alphabet)  # (ranks are dense)
    heads = np.bincount(cols[0][valid], minlength=values)
    part_of = np.cumsum(heads)
    part_of -= heads
    part_of //= _PART
    del heads
    parts = int(part_of[-1]) + 1
    part = part_of.astype(np.uint8 if parts < 255 else np.uint16)[cols[0]]
    del part_of
    part[~valid] = parts  # (no part)
    for k in range(parts):
        rows = np.flatnonzero(part == k)
        if len(rows):
            keys = _keys(cols, bits, rows)
            yield _group(keys, docs[rows], bits, len(cols), alphabet, "", "", start)


def _keys(cols: list[Ints], bits: int, valid: npt.NDArray[Any] | None) -> list[Ints]:
    """The rows of `cols` (ranks under 2**bits) that `valid` selects (a mask or positions; None:
    all) as integers: as many columns per integer as fit in 64 bits, the first column most
    significant (one integer for a 3-gram, of 32 bits or less for ASCII text)."""
    per = 64 // bits
    keys: list[Ints] = []
    for at in range(0, len(cols), per):
        part = cols[at : at + per]
        key: Ints = (part[0] if valid is None else part[0][valid]).astype(
            np.uint32 if bits * len(part) <= 32 else np.uint64
        )
        for col in part[1:]:
            key <<= bits
            key |= col if valid is None else col[valid]
        keys.append(key)
    return keys


def _group(
    keys: list[Ints],
    docs: npt.NDArray[np.uint16],
    bits: int,
    width: int,
    alphabet: Ranks | None,
    head: str,
    tail: str,
    start: int,
) -> Group:
    """The grams of `keys` (`_keys` of `width` columns; a row per occurrence, in document
    order), with the low bits `docs` of each occurrence's document, grouped: see `Group`; each
    gram is head + its code points + tail."""
    per = 64 // bits
    if len(docs):
        # A stable LSD radix sort of the keys, 16 bits a pass, the least significant first:
        # NumPy's stable argsort of 16-bit integers is a counting sort (a byte at a time,
        # skipping bytes that are all equal), so equal keys keep their document order.
        for j in range(len(keys) - 1, -1, -1):
            for shift in range(0, bits * min(per, width - j * per), 16):
                order = np.argsort((keys[j] >> shift).astype(np.uint16), kind="stable")
                keys = [key[order] for key in keys]
                docs = docs[order]
                del order
    new_gram = np.zeros(len(docs), dtype=bool)
    new_gram[:1] = True
    for key in keys:
        new_gram[1:] |= key[1:] != key[:-1]
    keep = new_gram.copy()
    keep[1:] |= docs[1:] != docs[:-1]
    docs = docs[keep]
    first = np.flatnonzero(new_gram[keep])  # each distinct gram's first place in `docs`
    where = np.flatnonzero(new_gram)
    del keep, new_gram
    # The distinct grams' code points, row by row (head, key columns, tail), as one string.
    marks = len(head) + len(tail)
    rows = np.empty((len(where), width + marks), dtype="<u4")
    if head:
        rows[:, 0] = ord(head)
    if tail:
        rows[:, -1] = ord(tail)
    mask = (1 << bits) - 1
    for j, key in enumerate(keys):
        distinct = key[where]
        count = min(per, width - j * per)
        for i in range(count):
            col = (distinct >> (bits * (count - 1 - i))) & mask
            rows[:, len(head) + j * per + i] = col if alphabet is None else alphabet[col]
    del keys, where
    text = rows.tobytes().decode("utf-32-le", "surrogatepass")
    del rows
    step = width + marks
    grams = [text[at : at + step] for at in range(0, len(text), step)]
    bounds = first.tolist()
    bounds.append(len(docs))
    lows = array("H")
    lows.frombytes(docs.tobytes())
    numbers = array("I")
    numbers.frombytes((docs.astype(np.uint32) + start).tobytes())
    return grams, bounds, lows, numbers
