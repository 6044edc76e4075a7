"""In-memory substring search over content, summary and tags (see docs/search.md; the text
rules, folding, grams and scoring, are in search_text.py).

Text is ASCII-case-folded (A-Z -> a-z, every other code point unchanged) and cut into code-point
2-grams and 3-grams. Each gram maps to an `array('I')` of dense document numbers in ascending
order; a document-number table maps back to message ids. Grams only select candidates: every
candidate is verified against the real text of the message in the caller's `messages` mapping,
so a hit always really contains what the query asks for.

Match rule: a message matches when the whole (folded, stripped) query is a substring of one of
its fields, or when every word of the query is a substring of some field. Exact-phrase matches
score at least 0.64, word-only matches at most 0.5, so exact substrings always rank first.

Not thread-safe for mutation: any number of concurrent `search` calls is fine, but the caller
must keep `add`/`remove`/`replace`/`clear` exclusive of everything else (the service's lock).
"""

from __future__ import annotations

import heapq
import sys
from array import array
from bisect import bisect_left, insort
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import accumulate, chain, compress, pairwise, repeat
from operator import call, eq, neg
from typing import Final, TypeAlias

from convmem_engine.domain.message import Message
from convmem_engine.index.doc_table import DocTable
from convmem_engine.index.heap import heap_blocks, large_blocks_mapped, release_free_memory
from convmem_engine.index.postings import (
    _ARRAY_GC,
    BIG,
    BITMAP,
    DENSE,
    PROBE_RATIO,
    PostingList,
    Postings,
    checker,
    insert,
    intersect,
    members,
    narrow,
    nbytes,
    pack,
)
from convmem_engine.index.postings import contains as _contains
from convmem_engine.index.postings import discard as _discard
from convmem_engine.index.search_text import (
    _END,
    _FOLD,
    _START,
    FIELDS,
    PARTIAL_WORD,
    WHOLE_WORD,
    WORDS_FACTOR,
    SearchHit,
    _bounded_grams,
    _field_len,
    _fields_text,
    _grams,
    _hits,
    _is_word_char,
    _partial_words_bound,
    _Query,
    _score,
    _signature,
    _whole_pretest,
    _whole_word_matters,
    fold,
    query_words,
)

__all__ = ["FIELDS", "SearchHit", "SearchIndex", "fold", "query_words"]

_BLOCK_SHIFT: Final = 8  # 256 documents per block for the early-stop bounds
_SCAN_RATIO: Final = 4  # 1-code-point query: scan everything when the union is > live / 4
_FILTERS: Final = 3  # posting lists checked by bisect before verifying a candidate
_EAGER_MAX: Final = 2048  # intersect candidate lists up front when the rarest is this short
# (an index with several importance levels; see `_plan`)
_INTERSECT_RATIO: Final = 16  # ... and the next list at most this many times the survivors
_LAZY_STEPS: Final = 2048  # candidates checked by bisection before the rest is intersected
_LAZY_SAMPLE: Final = 64  # ... and how often the pass rate is looked at (`_filtered`)
_LANE_RATIO: Final = 16  # walk an importance level's own list when it is this much shorter
_ADAPT_AFTER: Final = 1024  # candidates walked with a full heap of >= 0.8 scores and no early
# stop before the walk learns which documents may hold a whole-word match
_SINGLES_SIZED: Final = 8  # one-code-point words whose candidate unions are sized
_BOUND_WORDS: Final = 64  # pass 2 learns the whole-word documents for at most this many words
_SEPS_EXACT: Final = 64  # 1-code-point whole-word bound: exact 3-gram test up to this many
_PRETEST_AFTER: Final = 256  # walked with a full heap of >= cap scores before the whole-word
# pre-test runs (before that, most walks end early and the test would be extra work)
_BLOCK: Final = 1 << _BLOCK_SHIFT
_CONTAINER: Final = 1 << 16  # build(): documents per container (postings.py)
_POLL: Final = 4096  # build(): messages between two polls of `cancelled`
_CHUNK_POINTS: Final = 1 << 19  # build(): code points of fields per chunk (gram_batch.py)
_COMPACT_TRIM: Final = 4 << 20  # build(): bytes of lists copied to their exact size per trim
_LANE_PASSES: Final = 8  # build(): importance lanes made by one pass each, up to this many
_ARRAY_GROWS: Final = BITMAP - 1  # add(): a container this much shorter stays an array
_LOW: Final = 0xFFFF  # the low bits of a document number (its place in its container)
_ONE_DOC: Final = sys.getsizeof(array("I", [0]))  # a new plain list of one document
_H_EMPTY: Final = array("H").__sizeof__()  # an array's `__sizeof__` without its buffer
_I_EMPTY: Final = array("I").__sizeof__()
_PLAIN_LAST: Final = BIG - 1  # a plain list this long is packed by its next append
_SET_GC: Final = sys.getsizeof(set()) - set().__sizeof__()  # sys.getsizeof's addition
_PAUSE_GRAMS: Final = 32  # add_many(pause=...): grams between pauses (~30-100 us of work)
_PACED_FROM: Final = 256  # add(pause=...): grams of a message whose add pauses (~0.3 ms at 1M)
_LONG_PHRASE: Final = 32  # pass 1 of a longer phrase skips blocks of shorter fields

Candidates: TypeAlias = "Sequence[int] | Postings"
"""Ascending candidate document numbers: a sorted list, a plain posting list or a `Postings`."""


def _filtered(cands: Candidates, filters: list[PostingList], want: int) -> Iterator[int]:
    """`cands` newest first, only the documents in every list of `filters`. The first
    _LAZY_STEPS are checked one by one (a walk that stops early pays only for what it
    walked); the rest is intersected in C at once, with every list at most _INTERSECT_RATIO
    times the survivors (longer ones are still checked one by one). Same documents, same
    order either way. The one-by-one checks end sooner when, at the rate documents have
    passed so far, `want` of them would take more than _LAZY_STEPS: the walk would likely
    reach the C intersection anyway, after ~1 us of checks per document until then."""
    checks = [checker(p) for p in filters]
    walk = reversed(cands)
    passed = 0
    for steps, doc in enumerate(walk, 1):
        if all(map(call, checks, repeat(doc))):
            passed += 1
            yield doc
        if steps >= _LAZY_STEPS or (
            not steps % _LAZY_SAMPLE and want * steps > _LAZY_STEPS * max(passed, 1)
        ):
            break
    rest = set(walk)  # what the walk has not reached
    if not rest:
        return
    lazy: list[PostingList] = []
    for p in filters:
        if len(p) > _INTERSECT_RATIO * len(rest):
            lazy.append(p)
            continue
        rest = intersect(rest, p)
        if not rest:
            return
    checks = [checker(p) for p in lazy]
    for doc in sorted(rest, reverse=True):
        if all(map(call, checks, repeat(doc))):
            yield doc


def _lanes_of(imps: array[int]) -> dict[int, PostingList]:
    """Importance -> its documents, ascending, for `imps` (document -> importance): one pass
    in C per level when there are few (no list of a million ints to sort), else one loop.
    A lane of `BIG` documents or more is compressed, like a gram's list (a lane of every
    document: 128 KiB of bitmaps at a million instead of 3.8 MiB), and made a container at
    a time (`_packed_lane`): never as a plain list of its million documents first."""
    levels = sorted(set(imps))
    if len(levels) <= _LANE_PASSES:
        return {
            level: _packed_lane(imps, level)
            if imps.count(level) >= BIG
            else array("I", compress(range(len(imps)), map(eq, imps, repeat(level))))
            for level in levels
        }
    lanes = {level: array("I") for level in levels}
    for doc, level in enumerate(imps):
        lanes[level].append(doc)
    return {level: pack(lane) if len(lane) >= BIG else lane for level, lane in lanes.items()}


def _packed_lane(imps: array[int], level: int) -> Postings:
    """The documents of importance `level` as a `Postings`, the same as `pack` of their plain
    list: each container's low bits found in C from its slice of `imps`."""
    out = Postings(array("I", [0]), array("H"), 0)
    for high, at in enumerate(range(0, len(imps), _CONTAINER)):
        part = imps[at : at + _CONTAINER]
        lows = narrow(array("I", compress(range(len(part)), map(eq, part, repeat(level)))))
        if lows:
            out.add_container(high, lows)
    return out


def _exact(p: PostingList) -> PostingList:
    """build(): `p` without the spare room its appends left (an array copied to its exact size,
    as a loaded index's are; the same list): ~8 MiB less at a million documents, 0.13 s."""
    if type(p) is Postings:
        p.at = array("I", p.at)
        p.data = array("H", p.data)
        p.cards = array("I", p.cards)
        return p
    return array(p.typecode, p)  # type: ignore[union-attr]


def _new_docs() -> array[int]:
    return array("I")


def _paced(grams: Iterable[str], pause: Callable[[], object]) -> Iterator[str]:
    """`grams`, with `pause()` called after every `_PAUSE_GRAMS` of them."""
    for i, g in enumerate(grams, 1):
        yield g
        if not i % _PAUSE_GRAMS:
            pause()


class SearchIndex:
    """Gram postings over content, summary and tags; see the module docstring."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._post: dict[str, PostingList] = {}  # gram -> its documents (postings.py)
        self._singles: dict[str, array[int]] = {}  # fields of exactly one code point
        self._char_bigrams: dict[str, set[str]] = {}  # code point -> 2-grams containing it
        self._ids: list[str | None] = []  # document number -> message id (None: removed)
        self._docs = DocTable(self._ids)  # message id -> document number (live ones)
        self._sig = array("I")  # document number -> _signature of the indexed value
        self._imp = array("b")  # document number -> importance (-1: removed)
        self._lanes: dict[int, PostingList] = {}  # importance -> its document numbers
        self._sessions: dict[str, array[int]] = {}  # session id -> its document numbers
        self._blk_ts = array("q")  # per block of documents: max timestamp ever indexed
        self._blk_len = array("I")  # per block: max field length (code points) ever indexed
        self._ts_bound = array("q")  # per block: max of _blk_ts up to it (`_raise_bounds`)
        # Bytes of the tables that grow with the index, kept up to date by every change (see
        # "accounting"): health reads the index's size without walking it.
        self._counted = 0

    # -- mutation ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._docs)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._docs

    def add(self, msg: Message, pause: Callable[[], object] | None = None) -> None:
        """Index a message that is not indexed yet (ValueError if its id is). `pause`, if
        given, is called every `_PAUSE_GRAMS` grams of a message of `_PACED_FROM` grams or
        more (as in `add_many`:
        the service's background flush lets another thread run there; nothing may read or
        change the index meanwhile)."""
        if msg.message_id in self._docs:
            raise ValueError("message_id is already indexed; use replace()")
        doc = self._add_document(msg)
        grams: Iterable[str]
        grams, singles = _grams(msg)
        if pause is not None and len(grams) >= _PACED_FROM:  # (pacing costs ~10%)
            grams = _paced(grams, pause)
        post = self._post
        high = doc >> 16
        low = doc & 0xFFFF
        grown = 0  # bytes the posting lists grew by (`_counted`)
        # Document numbers only grow, so appending keeps every posting list sorted.
        for g in grams:
            p = post.get(g)
            if not isinstance(p, Postings):
                if p is not None and (n := len(p)) < _PLAIN_LAST:
                    # `_append_plain`'s common case in line: a plain list that stays one.
                    before = p.__sizeof__()
                    p.append(doc)
                    if before == _I_EMPTY + 4 * n:  # it was full: reallocated
                        grown += p.__sizeof__() - before
                else:
                    grown += self._append_plain(g, p, doc)
            else:
                # Postings.append's common cases inlined (this loop runs for every gram of
                # every message written): the last container is an array that stays one
                # (shorter than a bitmap, or longer but short of DENSE), or a bitmap that
                # stays one.
                at = p.at
                end = at[-1]
                width = end - at[-2]
                if len(at) - 2 != high:
                    grown -= nbytes(p)
                    p.append(doc)
                    grown += nbytes(p)
                elif width < _ARRAY_GROWS or BITMAP < width < DENSE - 1:
                    data = p.data
                    if end < p.room:  # no reallocation: its size stays (no read per gram)
                        data.append(low)
                    else:  # full, or its room is not known
                        before = data.__sizeof__()
                        data.append(low)
                        after = data.__sizeof__()
                        grown += after - before
                        p.room = (after - _H_EMPTY) >> 1
                    at[-1] = end + 1
                    p.n += 1
                elif width == BITMAP and p.cards[-1] >= DENSE:  # a bitmap that stays one
                    p.data[at[-2] + (low >> 4)] |= 1 << (low & 15)
                    p.cards[-1] += 1
                    p.n += 1
                else:
                    grown -= nbytes(p)
                    p.append(doc)
                    grown += nbytes(p)
        self._counted += grown
        self._add_singles(singles, doc)

    def _add_singles(self, singles: Iterable[str], doc: int) -> None:
        """The new document `doc`'s fields of exactly one code point, `singles`."""
        for ch in singles:
            p = self._singles.get(ch)
            if p is None:
                p = self._singles[ch] = array("I")
                self._counted += sys.getsizeof(ch) + nbytes(p)
            if not p or p[-1] != doc:
                self._counted -= nbytes(p)
                p.append(doc)
                self._counted += nbytes(p)

    def add_many(
        self, messages: Sequence[Message], pause: Callable[[], object] | None = None
    ) -> None:
        """Index `messages` (none indexed yet, no id twice; else ValueError and nothing
        changed): exactly the index `add` of each in order gives (the same tables, lists and
        layouts: tests/index/test_search_batch.py), for less work. The grams of the whole
        batch are grouped first (C-speed appends to one list per gram), then each posting list
        takes its new documents at once: one dict look-up and one extend per gram and batch
        instead of one per gram and message. A list whose layout would change on the way (a
        plain list reaching `BIG`, a container changing kind or a new container) takes them
        one by one through the very steps `add` uses. The service applies its queued writes
        with this (service/index_set.py). `pause`, if given, is called between steps of about
        `_PAUSE_GRAMS` grams (the service's background flush lets another thread run there;
        nothing may read or change the index meanwhile)."""
        docs = self._docs
        seen: set[str] = set()
        for msg in messages:
            mid = msg.message_id
            if mid in docs or mid in seen:
                raise ValueError("message_id is already indexed; use replace()")
            seen.add(mid)
        local: defaultdict[str, list[int]] = defaultdict(list)
        get_local = local.__getitem__
        for msg in messages:
            doc = self._add_document(msg)
            grams, singles = _grams(msg)
            deque(map(list.append, map(get_local, grams), repeat(doc)), maxlen=0)
            self._add_singles(singles, doc)
            if pause is not None:
                pause()
        post = self._post
        grown = 0  # bytes the posting lists grew by (`_counted`)
        step = 0
        for g, new in local.items():
            if pause is not None:
                step += 1
                if step == _PAUSE_GRAMS:
                    step = 0
                    pause()
            m = len(new)
            p = post.get(g)
            if p is None:
                if m < BIG:
                    p = post[g] = array("I", new)
                    grown += sys.getsizeof(g) + nbytes(p)
                    if len(g) == 2:
                        self._register_bigram(g)
                    continue
                post[g] = p = array("I", new[:1])
                grown += sys.getsizeof(g) + nbytes(p)
                if len(g) == 2:
                    self._register_bigram(g)
                new = new[1:]
            elif isinstance(p, Postings):
                at = p.at
                if len(at) - 2 == new[-1] >> 16 == new[0] >> 16:  # all in the last container
                    end = at[-1]
                    width = end - at[-2]
                    # `Postings.append`'s cases for every document: an array container that
                    # stays one (each append sees a width below _ARRAY_GROWS, or between
                    # BITMAP and DENSE - 1), or a bitmap that stays one.
                    if width + m <= _ARRAY_GROWS or (width > BITMAP and width + m < DENSE):
                        data = p.data
                        if end + m <= p.room:  # no reallocation (see `add`)
                            data.extend(map(_LOW.__and__, new))
                        else:
                            before = data.__sizeof__()
                            data.extend(map(_LOW.__and__, new))
                            after = data.__sizeof__()
                            grown += after - before
                            p.room = (after - _H_EMPTY) >> 1
                        at[-1] = end + m
                        p.n += m
                        continue
                    if width == BITMAP and p.cards[-1] >= DENSE:
                        data = p.data
                        s = at[-2]
                        for doc in new:
                            low = doc & _LOW
                            data[s + (low >> 4)] |= 1 << (low & 15)
                        p.cards[-1] += m
                        p.n += m
                        continue
            elif (k := len(p)) + m < BIG:
                before = p.__sizeof__()
                p.extend(new)
                if before < _I_EMPTY + 4 * (k + m):  # it had no room for them: reallocated
                    grown += p.__sizeof__() - before
                continue
            grown -= nbytes(p)
            for doc in new:  # the layout changes on the way: `add`'s steps, one by one
                self._append_gram(g, doc)
            grown += nbytes(post[g])
        self._counted += grown

    def _add_document(self, msg: Message) -> int:
        """`add`'s part before the grams: the new document's number, id, signature,
        importance lane, session list and block bounds."""
        doc = len(self._ids)
        mid = msg.message_id
        self._ids.append(mid)
        self._docs.add(mid, doc)
        self._sig.append(_signature(msg))
        imp = msg.metadata.importance
        self._imp.append(imp)
        lane = self._lanes.get(imp)
        # Bytes the lane and session lists grew by (`_counted`). Every write appends to both:
        # the sizes that may change are read around the append (`nbytes` adds constants).
        if type(lane) is Postings:
            before = lane.data.__sizeof__() + lane.at.__sizeof__() + lane.cards.__sizeof__()
            lane.append(doc)
            grown = lane.data.__sizeof__() + lane.at.__sizeof__() + lane.cards.__sizeof__()
            grown -= before
        else:
            if lane is None:
                lane = self._lanes[imp] = array("I")
                grown = 0
            else:
                grown = -nbytes(lane)
            lane.append(doc)
            if len(lane) == BIG and type(lane) is array:
                lane = self._lanes[imp] = pack(lane)
            grown += nbytes(lane)
        sess = self._sessions.get(msg.session_id)
        if sess is None:
            sess = self._sessions[msg.session_id] = array("I")
            sess.append(doc)
            grown += nbytes(sess)
        else:
            before = sess.__sizeof__()
            sess.append(doc)
            grown += sess.__sizeof__() - before
        self._counted += grown
        self._raise_bounds(doc, msg)
        return doc

    def _append_gram(self, g: str, doc: int) -> None:
        """`add`'s step for one gram of a new document (after every document `g` holds)."""
        p = self._post.get(g)
        if isinstance(p, Postings):
            p.append(doc)
        else:
            self._append_plain(g, p, doc)

    def _append_plain(self, g: str, p: array[int] | None, doc: int) -> int:
        """`add`'s step for gram `g` whose posting list `p` is not a `Postings`: a new plain
        list (None: the gram is new), or `doc` appended, packed once it reaches `BIG`. Returns
        the bytes the posting lists grew by (the caller adds them to `_counted`)."""
        if p is None:
            self._post[g] = array("I", [doc])
            if len(g) == 2:
                self._register_bigram(g)
            return g.__sizeof__() + _ONE_DOC  # (a str's is its sys.getsizeof)
        before = p.__sizeof__()
        p.append(doc)
        n = len(p)
        if n >= BIG:
            q = self._post[g] = pack(p)
            return nbytes(q) - _ARRAY_GC - before
        # `p` was n - 1 long: the append reallocated it only if that was all it had room for.
        return p.__sizeof__() - before if before == _I_EMPTY + 4 * n - 4 else 0

    def build(
        self,
        messages: Iterable[Message],
        *,
        cancelled: Callable[[], bool] | None = None,
        ids: list[str | None] | None = None,
    ) -> bool:
        """Index every message of `messages` into this empty index in one pass: the same index
        as `add` of each in order, for less work. The postings are made a chunk of documents at
        a time (fields of about `_CHUNK_POINTS` code points, within one 65,536-document
        container): NumPy turns the chunk's fields into one list of documents per gram
        (index/gram_batch.py; on a worker thread, so that its arrays come from that thread's C
        heap, reused chunk after chunk, not from the heap the posting lists grow in), and each
        list is appended to its gram's posting list. NumPy is imported by the first chunk
        with a field of two code points or more (not by an empty build). `messages` is read
        once, in order, and no message is kept (the store's lazy snapshot builds each one as
        it is reached). ValueError (index left empty) for an id given
        twice or a non-empty index. `cancelled` is polled every 4,096 messages: when it says
        True the build stops and returns False (the index is left empty). `ids`, when given,
        is the id of each message in order (e.g. the store's snapshot's own list): it becomes
        the index's id table instead of a copy (each message's id is checked against it;
        ValueError when they differ). Its arrays of 32 KiB or more are allocated as their own
        mappings (`heap.large_blocks_mapped`: no heap fragmentation, spare room not resident)."""
        if self._ids:
            raise ValueError("build() needs an empty index")
        with large_blocks_mapped():
            return self._build(messages, cancelled, ids)

    def _build(
        self,
        messages: Iterable[Message],
        cancelled: Callable[[], bool] | None,
        ids: list[str | None] | None,
    ) -> bool:
        """build(), the threshold set."""
        with ThreadPoolExecutor(1, thread_name_prefix="search-build") as worker:
            return self._build_with(messages, cancelled, ids, worker)

    def _build_with(
        self,
        messages: Iterable[Message],
        cancelled: Callable[[], bool] | None,
        ids: list[str | None] | None,
        worker: ThreadPoolExecutor,
    ) -> bool:
        """build(), the threshold set, `worker` the thread that makes the chunks' groups."""
        given = ids is not None
        if ids is None:
            ids = []
        imps = array("b")
        sigs = array("I")
        blk_ts = array("q")
        blk_len = array("I")
        sessions: defaultdict[str, array[int]] = defaultdict(_new_docs)
        post: dict[str, PostingList] = {}
        singles: dict[str, array[int]] = {}
        texts: list[str] = []  # the chunk's fields of two code points or more
        lows = array("H")  # the low bits of each one's document
        points = 0  # code points in `texts`
        add_id = ids.append
        id_at = ids.__getitem__
        add_imp = imps.append
        add_sig = sigs.append
        add_text = texts.append
        add_low = lows.append
        n_ids = len(ids)
        start = 0
        doc = 0
        for doc, msg in enumerate(messages):
            low = doc - start
            if points >= _CHUNK_POINTS or low == _CONTAINER:
                self._add_chunk(post, texts, lows, start, worker)
                texts.clear()
                del lows[:]
                points = 0
                if low == _CONTAINER:
                    self._seal_container(post, start)
                    release_free_memory()  # what the container's chunks let go of (heap.py)
                    start = doc
                    low = 0
            if not doc & (_POLL - 1) and cancelled is not None and cancelled():
                return False
            if not given:
                add_id(msg.message_id)
            elif doc >= n_ids or id_at(doc) != msg.message_id:
                raise ValueError("the ids given are not the messages' ids")
            meta = msg.metadata
            add_imp(meta.importance)
            content = msg.content
            sessions[msg.session_id].append(doc)
            ts = msg.timestamp
            size = len(content)
            add_sig(_signature(msg))
            if meta.summary or meta.tags:
                size = _field_len(msg)
                for text in (content, meta.summary or "", *meta.tags):
                    n = len(text)
                    if n > 1:
                        add_text(text)
                        add_low(low)
                        points += n
                    elif n:
                        self._build_single(singles, text, doc)
            elif size > 1:
                add_text(content)
                add_low(low)
                points += size
            elif size:
                self._build_single(singles, content, doc)
            if not doc & (_BLOCK - 1):
                blk_ts.append(ts)
                blk_len.append(size)
            else:
                if ts > blk_ts[-1]:
                    blk_ts[-1] = ts
                if size > blk_len[-1]:
                    blk_len[-1] = size
        self._add_chunk(post, texts, lows, start, worker)
        del texts, lows
        self._seal_container(post, start)
        release_free_memory()  # what the last container's chunks let go of
        if given and len(imps) != n_ids:
            raise ValueError("the ids given are not the messages' ids")
        copied = 0  # each copy's old array is freed at once: trimmed every _COMPACT_TRIM bytes
        for key, lists in post.items():
            post[key] = _exact(lists)
            copied += nbytes(lists)
            if copied >= _COMPACT_TRIM:
                release_free_memory()
                copied = 0
        for plain in (singles, sessions):
            for key, docs_of in plain.items():
                plain[key] = array("I", docs_of)
        # The appends' bound methods hold the arrays being replaced: without this their old
        # copies (5 MiB at a million) stay until build() returns, through the tail's peak.
        del add_imp, add_sig
        imps = array("b", imps)
        sigs = array("I", sigs)
        release_free_memory()
        try:
            docs = DocTable(ids)
        except ValueError:
            raise ValueError("a message_id is given twice") from None
        lanes = _lanes_of(imps)
        release_free_memory()  # what making the lanes let go of
        self._install(
            post=post,
            singles=singles,
            sessions=dict(sessions),
            lanes=lanes,
            ids=ids,
            docs=docs,
            sig=sigs,
            imp=imps,
            blk_ts=blk_ts,
            blk_len=blk_len,
        )
        return True

    def _install(
        self,
        *,
        post: dict[str, PostingList],
        singles: dict[str, array[int]],
        sessions: dict[str, array[int]],
        lanes: dict[int, PostingList],
        ids: list[str | None],
        docs: DocTable,
        sig: array[int],
        imp: array[int],
        blk_ts: array[int],
        blk_len: array[int],
    ) -> None:
        """Take a whole index's tables at once (`build`, and `search_file` loading one) and
        register its 2-grams."""
        self._post = post
        self._singles = singles
        self._sessions = sessions
        self._lanes = lanes
        self._ids = ids
        self._docs = docs
        self._sig = sig
        self._imp = imp
        self._blk_ts = blk_ts
        self._blk_len = blk_len
        self._ts_bound = array("q", accumulate(blk_ts, max))
        for g in post:
            if len(g) == 2:
                self._register_bigram(g)
        self._counted = self._walk_counted()
        for p in chain(post.values(), lanes.values()):
            if type(p) is Postings:
                p.room = 0  # (build's `_exact` copies replaced their arrays)

    @staticmethod
    def _build_single(singles: dict[str, array[int]], text: str, doc: int) -> None:
        """build(): document `doc` has a field of one code point, `text` (folded here)."""
        ch = fold(text)
        p = singles.get(ch)
        if p is None:
            p = singles[ch] = array("I")
        if not p or p[-1] != doc:
            p.append(doc)

    @staticmethod
    def _add_chunk(
        post: dict[str, PostingList],
        texts: list[str],
        lows: array[int],
        start: int,
        worker: ThreadPoolExecutor,
    ) -> None:
        """build(): a chunk's postings (`gram_batch.chunk_groups` of the chunk's fields `texts`,
        `lows` their documents' low bits, all of the container from document `start`) appended
        to the posting lists: a plain list that stays under `BIG` documents takes them as
        numbers, one that reaches it is packed, a compressed list's last container takes their
        low bits (`Postings.extend_last`; `_seal_container` gives it its kind). Grams new to
        `post` take their places in the order the groups give them. The groups are made on
        `worker`'s thread (see `_build`)."""
        if not texts:
            return
        from convmem_engine.index.gram_batch import chunk_groups  # NumPy: builds only

        high = start >> 16
        get = post.get
        groups = chunk_groups(texts, lows, start)
        while True:
            with heap_blocks():  # NumPy's arrays, on the worker thread: see `_build`
                group = worker.submit(next, groups, None).result()
            if group is None:
                break
            grams, bounds, low_bits, numbers = group
            del group
            for g, a, b in zip(grams, bounds, bounds[1:], strict=False):
                p = get(g)
                if type(p) is Postings:
                    at = p.at
                    if len(at) - 2 == high:  # `extend_last` in line: its container is open
                        data = p.data
                        data += low_bits[a:b]
                        at[-1] = len(data)
                        p.cards[-1] += b - a
                        p.n += b - a
                        continue
                elif p is None:
                    if b - a < BIG:
                        post[g] = numbers[a:b]
                        continue
                    p = post[g] = Postings(array("I", [0]), array("H"), 0)
                elif len(p) + b - a < BIG:
                    p += numbers[a:b]  # type: ignore[operator]
                    continue
                else:
                    p = post[g] = pack(p)  # type: ignore[arg-type]
                p.extend_last(high, low_bits[a:b])

    @staticmethod
    def _seal_container(post: dict[str, PostingList], start: int) -> None:
        """build(): once the container from document `start` is complete, each compressed list's
        part of it in the kind its size asks for (`Postings.seal_last`)."""
        high = start >> 16
        for p in post.values():
            if type(p) is Postings and len(p.at) - 2 == high:
                from convmem_engine.index.gram_batch import bitmap_words  # (loaded by then)

                p.seal_last(bitmap_words)

    def remove(self, msg: Message) -> None:
        """Forget a message given the value previously added; unknown ids are ignored."""
        doc = self._docs.pop(msg.message_id)
        if doc is None:
            return
        if self._sig[doc] == _signature(msg):
            grams, singles = _grams(msg)
            for g in grams:
                self._discard_gram(g, doc)
            for ch in singles:
                self._discard_single(ch, doc)
            self._leave_session(msg.session_id, doc)
        else:
            self._sweep(doc)
        self._ids[doc] = None
        self._sig[doc] = 0
        self._leave_lane(doc)
        self._imp[doc] = -1

    def replace(self, old: Message, new: Message) -> None:
        """Reindex `old` (the value previously added) as `new`; only changed grams move."""
        doc = self._docs.get(old.message_id)
        if doc is None or old.message_id != new.message_id:
            self.remove(old)
            self.add(new)
            return
        new_grams, new_singles = _grams(new)
        if self._sig[doc] == _signature(old):
            old_grams, old_singles = _grams(old)
            for g in old_grams - new_grams:
                self._discard_gram(g, doc)
            for ch in set(old_singles) - set(new_singles):
                self._discard_single(ch, doc)
            added = new_grams - old_grams
            added_singles = set(new_singles) - set(old_singles)
            moved = old.session_id != new.session_id
            if moved:
                self._leave_session(old.session_id, doc)
        else:
            self._sweep(doc)
            added = new_grams
            added_singles = set(new_singles)
            moved = True
        grown = 0  # bytes the tables grew by (`_counted`)
        size = sys.getsizeof
        high = doc >> 16
        if moved:
            sess = self._sessions.get(new.session_id)
            if sess is None:
                sess = self._sessions[new.session_id] = array("I")
            else:
                grown -= nbytes(sess)
            insort(sess, doc)
            grown += nbytes(sess)
        post = self._post
        for g in added:
            p = post.get(g)
            if p is None:
                post[g] = array("I", [doc])
                grown += size(g) + _ONE_DOC
                if len(g) == 2:
                    self._register_bigram(g)
            elif type(p) is Postings:
                if high + 1 < len(p.at):  # a container it has: only its data may resize
                    data = p.data
                    before = data.__sizeof__()
                    p.insert(doc)
                    grown += data.__sizeof__() - before
                else:
                    grown -= nbytes(p)
                    p.insert(doc)
                    grown += nbytes(p)
            else:
                grown -= p.__sizeof__() + _ARRAY_GC
                p = post[g] = insert(p, doc)
                grown += nbytes(p)
        for ch in added_singles:
            sp = self._singles.get(ch)
            if sp is None:
                sp = self._singles[ch] = array("I")
                grown += size(ch)
            else:
                grown -= nbytes(sp)
            insort(sp, doc)
            grown += nbytes(sp)
        self._sig[doc] = _signature(new)
        imp = new.metadata.importance
        if imp != self._imp[doc]:
            self._leave_lane(doc)
            self._imp[doc] = imp
            lane = self._lanes.get(imp)
            if lane is None:
                lane = self._lanes[imp] = array("I", [doc])
            else:
                grown -= nbytes(lane)
                lane = self._lanes[imp] = insert(lane, doc)
            grown += nbytes(lane)
        self._counted += grown
        self._raise_bounds(doc, new)

    def clear(self) -> None:
        self._reset()

    def _leave_session(self, session_id: str, doc: int) -> None:
        sess = self._sessions.get(session_id)
        if sess is not None and _discard(sess, doc) and not sess:  # (its buffer kept)
            del self._sessions[session_id]
            self._counted -= nbytes(sess)

    def _leave_lane(self, doc: int) -> None:
        imp = self._imp[doc]
        lane = self._lanes[imp]
        before = nbytes(lane)
        _discard(lane, doc)
        if not lane:
            del self._lanes[imp]
            self._counted -= before
        else:
            self._counted += nbytes(lane) - before

    def _raise_bounds(self, doc: int, msg: Message) -> None:
        block = doc >> _BLOCK_SHIFT
        ts = msg.timestamp
        size = _field_len(msg)
        # _ts_bound, the prefix maxima of _blk_ts: a bound on the timestamp of every document
        # of a block and the blocks before it, for the early stop of a walk that goes newest
        # first (made per search from _blk_ts, it was half of a typical query's time at 1M
        # messages). An appended block's is the larger of its timestamp and the previous
        # one's; a raised one raises the later ones that are lower (they ascend: up to the
        # first that is not).
        bound = self._ts_bound
        if block == len(bound):
            bound.append(max(ts, bound[-1]) if bound else ts)
        else:
            j = block
            n = len(bound)
            while j < n and bound[j] < ts:
                bound[j] = ts
                j += 1
        if block == len(self._blk_ts):
            self._blk_ts.append(ts)
            self._blk_len.append(size)
            return
        if ts > self._blk_ts[block]:
            self._blk_ts[block] = ts
        if size > self._blk_len[block]:
            self._blk_len[block] = size

    def _register_bigram(self, gram: str) -> None:
        grown = 0
        for ch in set(gram):
            s = self._char_bigrams.get(ch)
            if s is None:
                s = self._char_bigrams[ch] = set()
                grown += ch.__sizeof__() + _SET_GC
            else:
                grown -= s.__sizeof__()
            s.add(gram)
            grown += s.__sizeof__()
        self._counted += grown

    def _discard_gram(self, gram: str, doc: int) -> None:
        """Remove `doc` from `gram`'s list. The byte count relies on CPython's array keeping
        its buffer when one entry is removed (`del a[i]`, `a.pop()`: it reallocates only to
        shrink by 16 entries or more; tests/index/test_memory_accounting.py checks it on the
        interpreter the tests run on), so only a container changing kind resizes one (a
        compressed list's data, `Postings._rewrite`): the only size read here, until a list
        is emptied and dropped."""
        p = self._post.get(gram)
        if p is None:
            return
        if type(p) is Postings:
            data = p.data
            before = data.__sizeof__()
            if not p.discard(doc):
                return
            self._counted += data.__sizeof__() - before
        elif not _discard(p, doc):
            return
        if p:
            return
        del self._post[gram]
        size = sys.getsizeof
        self._counted -= size(gram) + nbytes(p)
        if len(gram) == 2:
            for ch in set(gram):
                s = self._char_bigrams[ch]
                self._counted -= size(s)
                s.discard(gram)
                if s:
                    self._counted += size(s)
                else:
                    del self._char_bigrams[ch]
                    self._counted -= size(ch)

    def _discard_single(self, ch: str, doc: int) -> None:
        p = self._singles.get(ch)
        if p is not None and _discard(p, doc) and not p:  # (its buffer kept: see above)
            del self._singles[ch]
            self._counted -= sys.getsizeof(ch) + nbytes(p)

    def _sweep(self, doc: int) -> None:
        """Remove `doc` from every posting list (when the indexed value is not known)."""
        for g in [g for g, p in self._post.items() if _contains(p, doc)]:
            self._discard_gram(g, doc)
        for ch in [c for c, p in self._singles.items() if _contains(p, doc)]:
            self._discard_single(ch, doc)
        for sid in [k for k, p in self._sessions.items() if _contains(p, doc)]:
            self._leave_session(sid, doc)

    # -- search -----------------------------------------------------------------------------

    def search(
        self,
        query: str,
        messages: Mapping[str, Message],
        *,
        accept: Callable[[Message], bool] | None = None,
        limit: int,
        session_id: str | None = None,
        min_importance: int = 0,
    ) -> list[SearchHit]:
        """The best `limit` matches, best first: score desc, importance desc, timestamp desc,
        message_id desc. Texts are read from `messages` (verification); nothing is mutated.

        `session_id` and `min_importance` restrict the search like an `accept` would, but use
        the index's per-session and per-importance lists, so they also cut the work."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        if not query:
            return []
        scope: array[int] | None = None
        if session_id is not None:
            scope = self._sessions.get(session_id)
            if scope is None:
                return []
        q = _Query(query)
        heap: list[tuple[float, int, int, str]] = []
        if q.multi:
            # Pass 1: documents that may hold the whole phrase (best score 1.0). Pass 2: the
            # rest of the all-words candidates, whose score cannot exceed WORDS_FACTOR (planned
            # only when pass 1 did not stop early).
            seen: set[int] = set()
            phrase_plan = self._phrase_plan(q.phrase, scope)
            if self._run_pass(
                q, messages, accept, limit, heap, phrase_plan, WHOLE_WORD, seen, min_importance
            ):
                words_plan = self._plan(q.terms(), scope)
                self._run_pass(
                    q, messages, accept, limit, heap, words_plan, WORDS_FACTOR, seen, min_importance
                )
        else:
            words_plan = self._plan(q.terms(), scope)
            self._run_pass(
                q, messages, accept, limit, heap, words_plan, WHOLE_WORD, None, min_importance
            )
        return _hits(heap, messages, q)

    @staticmethod
    def scan(
        query: str,
        messages: Mapping[str, Message],
        *,
        accept: Callable[[Message], bool] | None = None,
        limit: int,
        session_id: str | None = None,
        min_importance: int = 0,
        values: Iterable[Message] | None = None,
    ) -> list[SearchHit]:
        """What `search` returns on an index of exactly `messages`, without an index: every
        message is scored with the same function (`_score`) and kept under the same key, so
        results, order and the `limit` guarantee are the same. Linear in the messages (the
        service uses it while its index is still being built). `values`: the messages of
        `messages` to go through, when another iteration than `messages.values()` is wanted
        (the store's, leaving its blocks as they are)."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        if not query:
            return []
        q = _Query(query)
        heap: list[tuple[float, int, int, str]] = []
        for msg in messages.values() if values is None else values:
            mid = msg.message_id
            if session_id is not None and msg.session_id != session_id:
                continue
            imp = msg.metadata.importance
            if imp < min_importance or (accept is not None and not accept(msg)):
                continue
            score = _score(msg, q)
            if score is None:
                continue
            key = (score, imp, msg.timestamp, mid)
            if len(heap) < limit:
                heapq.heappush(heap, key)
            elif key > heap[0]:
                heapq.heapreplace(heap, key)
        return _hits(heap, messages, q)

    def _run_pass(
        self,
        q: _Query,
        messages: Mapping[str, Message],
        accept: Callable[[Message], bool] | None,
        limit: int,
        heap: list[tuple[float, int, int, str]],
        plan: tuple[Candidates | None, list[PostingList]],
        max_score: float,
        seen: set[int] | None,
        min_importance: int,
    ) -> bool:
        """Score the plan's candidates into `heap` (a min-heap of the best `limit` keys).

        Importance levels best first; inside a level, newest document first. Stops as soon as
        no remaining candidate can beat the worst kept key: (max_score, level, block maximum
        timestamp) below it. A first pass (`max_score` 1.0) records the documents it scored in
        `seen`; the second pass skips them. Returns False when it stopped early."""
        cands, filters = plan
        if cands is not None and not cands:
            return True
        ids = self._ids
        imps = self._imp
        lanes = self._lanes
        get = messages.get
        record = seen is not None and max_score == WHOLE_WORD
        skip = seen if seen is not None and not record else None
        ts_bound = self._ts_bound
        # After _ADAPT_AFTER candidates walked while every slot holds a score of at least
        # `cap`, learn which documents may hold a whole-word match; the others can score at
        # most `cap`. Pass 1 (and a one-pass query): the phrase as a whole word, else at most
        # PARTIAL_WORD. Pass 2: every word as a whole word somewhere, else one word is only
        # inside longer words and the score is at most _partial_words_bound(words).
        cap = 0.0
        if max_score == WHOLE_WORD:
            if _whole_word_matters(q.phrase):
                cap = PARTIAL_WORD
        elif len(q.words) <= _BOUND_WORDS and any(map(_whole_word_matters, q.words)):
            cap = _partial_words_bound(len(q.words))
        adapt = cap > 0.0
        tests = self._whole_tests(q, max_score) if adapt else []
        # Pass 1 over many candidates tests the phrase on every one (most lack it: a periodic
        # phrase); over a few, only once `limit` hits are kept (pass 2 would read the others
        # again).
        screen = record and (cands is None or len(cands) > _EAGER_MAX)
        whole: set[int] | None = None
        walked = 0
        levels = sorted(lanes, reverse=True)
        for level in levels:
            if level < min_importance:
                break
            if len(heap) == limit and (max_score, level) < heap[0][:2]:
                return False
            lane = lanes[level]
            stream: Iterable[int]
            checks: list[Callable[[int], bool]] = []  # tests each document of `stream` passes
            if cands is None:
                stream = reversed(lane)
            elif len(lane) * _LANE_RATIO < len(cands):
                stream = filter(checker(cands), reversed(lane))
                checks = [checker(p) for p in filters]
            elif len(lanes) == 1:
                stream = _filtered(cands, filters, limit) if filters else reversed(cands)
            else:
                # Several levels: lazy, level first (a level's walk usually ends within its
                # first hits, before a C intersection of the rest would pay).
                stream = (d for d in reversed(cands) if imps[d] == level)
                checks = [checker(p) for p in filters]
            last_block = -1
            for doc in stream:
                if checks and not all(map(call, checks, repeat(doc))):
                    continue
                if skip is not None and doc in skip:
                    continue
                if len(heap) == limit and heap[0][0] >= max_score:
                    block = doc >> _BLOCK_SHIFT
                    if block != last_block:
                        last_block = block
                        if (max_score, level, ts_bound[block]) < heap[0][:3]:
                            return False
                if adapt and len(heap) == limit and heap[0][0] >= cap:
                    walked += 1
                    if whole is None and walked >= _ADAPT_AFTER:
                        whole = self._whole_docs(q, max_score)
                    if (
                        whole is not None
                        and doc not in whole
                        and (cap, level, ts_bound[doc >> _BLOCK_SHIFT]) < heap[0][:3]
                    ):
                        # Bounds only fall from here on: every remaining document
                        # outside `whole` (this level and below) is out for good.
                        # The candidates among them: intersected in C with each list
                        # that is not much longer than them, the others checked per
                        # document as the narrowed walk reaches it (the same test as
                        # `intersect` would make on every one; the walk often stops
                        # after a few).
                        pool = whole
                        later: list[Callable[[int], bool]] = []
                        lists = filters if cands is None else [cands, *filters]
                        for p in sorted(lists, key=len):
                            if len(pool) * PROBE_RATIO < len(p):
                                later.append(checker(p))
                            else:
                                pool = intersect(pool, p)
                        if skip is not None:
                            pool = pool.difference(skip)
                        rest = [lv for lv in levels if min_importance <= lv <= level]
                        return self._walk_narrowed(
                            q,
                            messages,
                            accept,
                            limit,
                            heap,
                            sorted(pool, reverse=True),
                            rest,
                            doc,
                            max_score,
                            seen if record else None,
                            tests,
                            ts_bound,
                            later,
                        )
                mid = ids[doc]
                if mid is None:
                    continue
                msg = get(mid)
                if msg is None or (accept is not None and not accept(msg)):
                    continue
                bounded = walked >= _PRETEST_AFTER and len(heap) == limit and heap[0][0] >= cap
                full = record and (screen or len(heap) == limit)
                folded: str | None = None
                if full or bounded:
                    # Cheap pre-tests in C before the full score. Pass 1 (see `screen`)
                    # scores only the documents that hold the phrase (the
                    # others score at most WORDS_FACTOR and are left to pass 2, which can
                    # stop early on them). A document without the whole-word match of
                    # `tests` (nor, in pass 2, the phrase) scores at most `cap`: out when
                    # that cannot beat the worst kept hit.
                    text = _fields_text(msg)
                    if full and q.phrase not in text:
                        continue
                    if (
                        bounded
                        and not all(t(text) for t in tests)
                        and (record or max_score == WHOLE_WORD or q.phrase not in text)
                        and (cap, msg.metadata.importance, msg.timestamp, mid) < heap[0]
                    ):
                        continue
                    if len(text) == len(msg.content):
                        folded = text  # no summary or tags: the folded content itself
                if record:
                    seen.add(doc)  # type: ignore[union-attr]
                score = _score(msg, q, folded)
                if score is None:
                    continue
                key = (score, msg.metadata.importance, msg.timestamp, mid)
                if len(heap) < limit:
                    heapq.heappush(heap, key)
                elif key > heap[0]:
                    heapq.heapreplace(heap, key)
        return True

    def _walk_narrowed(
        self,
        q: _Query,
        messages: Mapping[str, Message],
        accept: Callable[[Message], bool] | None,
        limit: int,
        heap: list[tuple[float, int, int, str]],
        docs: list[int],
        levels: list[int],
        below: int,
        max_score: float,
        seen: set[int] | None,
        tests: list[Callable[[str], object]],
        ts_bound: array[int],
        checks: list[Callable[[int], bool]],
    ) -> bool:
        """The rest of a `_run_pass` walk once it is narrowed to `docs` (descending: the
        documents that may hold a whole-word match, not scored yet; the candidates among them
        pass every test of `checks`): `levels` best first, and in the first one only the
        documents below `below`. Every other remaining candidate, and
        every one here that fails a test of `tests` (unless, in pass 2, it holds the phrase),
        scores at most the walk's cap, which can no longer beat the worst kept hit (the bounds
        only fall from here on): they are skipped unscored. Returns False on an early stop."""
        ids = self._ids
        imps = self._imp
        get = messages.get
        phrase = q.phrase
        words_pass = max_score != WHOLE_WORD
        one_level = len(self._lanes) == 1
        test = tests[0] if len(tests) == 1 else None  # the common case, without all()
        start = bisect_left(docs, -below, key=neg)  # docs[start:] are below `below`
        # Whether the kept hits may already end the walk (checked per block); it can only
        # become true when the heap changes.
        stopping = len(heap) == limit and heap[0][0] >= max_score
        for i, level in enumerate(levels):
            if len(heap) == limit and (max_score, level) < heap[0][:2]:
                return False
            part = docs[start:] if i == 0 else docs
            stream = part if one_level else [d for d in part if imps[d] == level]
            last_block = -1
            for doc in stream:
                if stopping:
                    block = doc >> _BLOCK_SHIFT
                    if block != last_block:
                        last_block = block
                        if (max_score, level, ts_bound[block]) < heap[0][:3]:
                            return False
                if checks and not all(map(call, checks, repeat(doc))):
                    continue
                mid = ids[doc]
                if mid is None:
                    continue
                msg = get(mid)
                if msg is None or (accept is not None and not accept(msg)):
                    continue
                # _fields_text, inlined: this loop runs over thousands of documents.
                text = msg.content
                meta = msg.metadata
                if meta.summary or meta.tags:
                    text = "\x00".join((text, meta.summary or "", *meta.tags))
                text = text.lower() if text.isascii() else text.translate(_FOLD)
                if seen is not None and phrase not in text:
                    continue  # pass 1: at most WORDS_FACTOR, a pass-2 candidate
                if not (test(text) if test is not None else all(t(text) for t in tests)) and not (
                    words_pass and phrase in text
                ):
                    continue
                if seen is not None:
                    seen.add(doc)
                score = _score(msg, q, text if len(text) == len(msg.content) else None)
                if score is None:
                    continue
                key = (score, meta.importance, msg.timestamp, mid)
                if len(heap) < limit:
                    heapq.heappush(heap, key)
                elif key > heap[0]:
                    heapq.heapreplace(heap, key)
                else:
                    continue
                stopping = len(heap) == limit and heap[0][0] >= max_score
        return True

    def _phrase_plan(
        self, phrase: str, scope: array[int] | None
    ) -> tuple[Candidates | None, list[PostingList]]:
        """Pass 1's plan: `_plan` of the phrase; for a phrase longer than _LONG_PHRASE code
        points, only the documents of blocks whose longest field ever indexed is at least that
        long (no field of the others can hold it)."""
        n = len(phrase)
        if n <= _LONG_PHRASE:
            return self._plan([phrase], scope)
        sizes = self._blk_len
        if max(sizes, default=0) < n:
            return [], []
        cands, filters = self._plan([phrase], scope)
        if cands is None or not len(cands):  # None: only for a one-code-point term
            return cands, filters
        long = [size >= n for size in sizes]
        return [d for d in cands if long[d >> _BLOCK_SHIFT]], filters

    def _plan(
        self, terms: list[str], scope: array[int] | None
    ) -> tuple[Candidates | None, list[PostingList]]:
        """Ascending candidate document numbers (None: every document), plus posting lists
        each candidate must also be in, for documents containing every term somewhere (and in
        `scope`, a session's documents, when given)."""
        # The lists, in groups of closely related ones (the grams of one word; a phrase's
        # grams across its words; each word-boundary group; the scope): a document with one
        # gram of a word mostly has the others, so the rarest list of each other group comes
        # first, where a candidate that will not match mostly fails.
        groups: list[list[PostingList]] = []
        if scope is not None:
            groups.append([scope])
        singles: list[str] = []
        post = self._post
        for term in terms:
            n = len(term)
            if n == 1:
                singles.append(term)
                continue
            grams = {term} if n == 2 else {term[i : i + 3] for i in range(n - 2)}
            by_word: dict[str, list[PostingList]] = {}
            words = query_words(term)
            for g in grams:
                p = post.get(g)
                if p is None:
                    return [], []
                word = next((w for w in words if g in w), "")
                by_word.setdefault(word, []).append(p)
            groups.extend(by_word.values())
            for group in set(_bounded_grams(term, False)[0]):
                found = [p for g in group if (p := post.get(g)) is not None]
                if not found:
                    return [], []
                if len(found) == 1:
                    groups.append(found)
                elif sum(map(len, found)) <= _EAGER_MAX:  # else left out (a superset)
                    groups.append([array("I", sorted(self._union_within(found, None)))])
        if groups:
            for related in groups:
                related.sort(key=len)
            heads = sorted((related[0] for related in groups), key=len)
            tails = sorted((p for related in groups for p in related[1:]), key=len)
            lists = list({id(p): p for p in (*heads, *tails)}.values())
            if len(lists[0]) > _EAGER_MAX or len(self._lanes) == 1:
                # Stay lazy: the walk checks candidates one by one while enough pass (the
                # early stop usually ends it soon), and intersects the rest in C once they
                # mostly fail (`_filtered`).
                return lists[0], self._filters(lists[1:], scope)
            # Several importance levels (each walked on its own, without `_filtered`) and a
            # small driver: intersect in C, each list short enough relative to the survivors;
            # longer lists are checked per candidate by bisection.
            survivors = set(members(lists[0]))
            rest: list[PostingList] = []
            for p in lists[1:]:
                if len(p) > _INTERSECT_RATIO * len(survivors):
                    rest.append(p)
                    continue
                survivors = intersect(survivors, p)
                if not survivors:
                    return [], []
            return sorted(survivors), self._filters(rest, scope)
        best: list[PostingList] | None = None
        best_size = 0
        if len(singles) > _SINGLES_SIZED:
            # Any one of them can drive (candidates are verified against every word); size
            # only the few with the fewest distinct 2-grams, a cheap estimate of rarity, so a
            # query of a thousand one-character words costs a handful of unions, not 1000.
            bigrams = self._char_bigrams
            singles = heapq.nsmallest(
                _SINGLES_SIZED, singles, key=lambda ch: len(bigrams.get(ch, ()))
            )
        for ch in singles:
            parts: list[PostingList] = [
                p for g in self._char_bigrams.get(ch, ()) if (p := post.get(g)) is not None
            ]
            single = self._singles.get(ch)
            if single is not None:
                parts.append(single)
            size = sum(map(len, parts))
            if best is None or size < best_size:
                best, best_size = parts, size
        if best is not None and best_size * _SCAN_RATIO <= len(self._docs):
            union: set[int] = set()
            for p in best:
                union.update(members(p))
            return sorted(union), []
        return None, []

    @staticmethod
    def _whole_tests(q: _Query, max_score: float) -> list[Callable[[str], object]]:
        """The pre-tests matching `_whole_docs`: the phrase's (pass 1), or every word's that
        needs a boundary (pass 2); a document failing one scores at most the walk's cap."""
        if max_score == WHOLE_WORD:
            return [_whole_pretest(q.phrase)]
        return [_whole_pretest(w) for w in q.words if _whole_word_matters(w)]

    def _whole_docs(self, q: _Query, max_score: float) -> set[int]:
        """Pass 1: `_whole_word_docs(phrase)`. Pass 2: the documents that may hold every word
        (of those that need a boundary) as a whole word: the intersection of their sets."""
        if max_score == WHOLE_WORD:
            return self._whole_word_docs(q.phrase)
        result: set[int] | None = None
        for w in q.words:
            if not _whole_word_matters(w):
                continue
            docs = self._whole_word_docs(w)
            result = docs if result is None else result & docs
            if not result:
                break
        return result if result is not None else set()

    def _whole_word_docs(self, phrase: str) -> set[int]:
        """A superset of the documents where `phrase` occurs with a word boundary on each side
        that needs one: some non-word code point (or a field edge) before / after it."""
        post = self._post
        if len(phrase) == 1:
            seps = [c for c in self._char_bigrams if not _is_word_char(c)]
            return self._whole_char_docs(phrase, seps)
        groups, head_done, tail_done = _bounded_grams(phrase, True)
        result: set[int] | None = None
        # Word-boundary grams: the documents with a gram of every group (smallest first).
        options = sorted(
            ([p for g in group if (p := post.get(g)) is not None] for group in set(groups)),
            key=lambda lists: sum(map(len, lists)),
        )
        for lists in options:
            result = self._union_within(lists, result)
            if not result:
                return result
        if head_done and tail_done:
            return result if result is not None else set()
        seps = [c for c in self._char_bigrams if not _is_word_char(c)]
        if _is_word_char(phrase[0]) and not head_done:
            head = phrase[:2]
            result = self._union_within(
                [p for x in [_START, *seps] if (p := post.get(x + head)) is not None], result
            )
        if _is_word_char(phrase[-1]) and not tail_done:
            tail = phrase[-2:]
            result = self._union_within(
                [p for y in [*seps, _END] if (p := post.get(tail + y)) is not None], result
            )
        return result if result is not None else set()

    @staticmethod
    def _union_within(lists: list[PostingList], within: set[int] | None) -> set[int]:
        """The documents of any of `lists`, only those of `within` when given (then probed
        in each list when much smaller than it, so long lists are never read whole)."""
        out: set[int] = set()
        for p in lists:
            out.update(members(p) if within is None else intersect(within, p))
        return out

    def _whole_char_docs(self, ch: str, seps: list[str]) -> set[int]:
        """`_whole_word_docs` for one (word) code point: fields that are exactly `ch`, and
        3-grams "non-word, ch, non-word" (field edges count as non-word). With many distinct
        non-word code points (CJK text), the weaker "non-word before" and "non-word after"
        2-gram test instead."""
        post = self._post
        result: set[int] = set()
        single = self._singles.get(ch)
        if single is not None:
            result.update(single)
        if len(seps) <= _SEPS_EXACT:
            for x in [_START, *seps]:
                for y in [*seps, _END]:
                    p = post.get(x + ch + y)
                    if p is not None:
                        result.update(members(p))
            return result
        bigrams = self._char_bigrams.get(ch, ())
        left: set[int] = set()
        right: set[int] = set()
        for g in bigrams:
            p = post.get(g)
            if p is None:
                continue
            if g[1] == ch and not _is_word_char(g[0]):
                left.update(members(p))
            if g[0] == ch and not _is_word_char(g[1]):
                right.update(members(p))
            if g[0] == ch and (e := post.get(_START + g)) is not None:
                left.update(members(e))  # a field starting with ch
            if g[1] == ch and (e := post.get(g + _END)) is not None:
                right.update(members(e))  # a field ending with ch
        return result | (left & right)

    @staticmethod
    def _filters(rest: list[PostingList], scope: array[int] | None) -> list[PostingList]:
        """The first few of `rest` (in `_plan`'s order), and always the session scope: term
        lists only save verification work, but the scope is a hard constraint."""
        out = rest[:_FILTERS]
        if scope is not None and any(p is scope for p in rest[_FILTERS:]):
            out.append(scope)
        return out

    # -- accounting -------------------------------------------------------------------------

    def memory_bytes(self) -> int:
        """Bytes allocated by the index's own objects (sys.getsizeof, which for an array
        includes its whole allocated buffer). Message-id and session-id strings are shared
        with the store and not counted; small ints cached by CPython are not counted.

        Constant time: the tables that grow with the index (the posting lists and their keys,
        the one-code-point table, the code-point -> 2-gram map, the session lists and the
        importance lanes) keep their byte count, `_counted`, up to date on every change
        (add, add_many, remove, replace, build, load); only the fixed number of objects left
        (the dicts themselves, the per-document arrays, the id tables) are measured here.
        `memory_bytes_fresh` walks everything instead: `check` compares the two."""
        return self._fixed_bytes() + self._counted

    def memory_bytes_fresh(self) -> int:
        """`memory_bytes` by walking every object (the reference; milliseconds at scale)."""
        return self._fixed_bytes() + self._walk_counted()

    def _fixed_bytes(self) -> int:
        """The objects whose number does not grow with the index."""
        size = sys.getsizeof
        return (
            size(self)
            + size(self._post)
            + size(self._singles)
            + size(self._char_bigrams)
            + size(self._ids)
            + self._docs.nbytes()
            + size(self._sig)
            + size(self._imp)
            + size(self._blk_ts)
            + size(self._blk_len)
            + size(self._ts_bound)
            + size(self._sessions)
            + size(self._lanes)
        )

    def _walk_counted(self) -> int:
        """What `_counted` holds, counted by walking the tables (sys.getsizeof of each)."""
        size = sys.getsizeof
        total = 0
        for table in (self._post, self._singles):
            for g, p in table.items():
                total += size(g) + nbytes(p)
        for ch, s in self._char_bigrams.items():
            total += size(ch) + size(s)
        total += sum(size(p) for p in self._sessions.values())
        total += sum(map(nbytes, self._lanes.values()))
        return total

    def check(self, messages: Mapping[str, Message]) -> list[str]:
        """Compare the index with `messages` (ids and indexed values); [] when consistent.
        Reads only. Cost: one pass over the messages plus one over the posting lists."""
        problems: list[str] = []
        if len(messages) != len(self._docs):
            problems.append(
                f"search index holds {len(self._docs)} messages, store has {len(messages)}"
            )
        counted = self._walk_counted()
        if counted != self._counted:
            problems.append(
                f"search index: its byte count {self._counted} differs from a fresh count {counted}"
            )
        stale = 0
        for mid, msg in messages.items():
            doc = self._docs.get(mid)
            if doc is None or self._sig[doc] != _signature(msg):
                stale += 1
        if stale:
            problems.append(f"search index: {stale} messages missing or indexed with old values")
        if self._ts_bound != array("q", accumulate(self._blk_ts, max)):
            problems.append("search index: the timestamp bounds are not the block maxima's")
        for table in (self._post, self._singles):
            for p in table.values():
                bad = p.check() if isinstance(p, Postings) else ""
                if bad or any(a >= b for a, b in pairwise(p)):
                    problems.append("search index: a posting list is not strictly ascending")
                    return problems
        return problems
