"""The search index's text rules: how text is folded and cut into words and grams, and how a
message's fields match and score a query (see docs/search.md).

Folding is ASCII-only (A-Z -> a-z, every other code point unchanged). A field's grams are its
code-point 2-grams and 3-grams, its two edge grams (START + first two, last two + END) and its
word-boundary grams (`_word_grams`). A field matches a needle at WHOLE_WORD when the needle is
found with a word boundary on both sides, else PARTIAL_WORD; the overall score weighs content,
summary and tags. `search_index.SearchIndex` keeps the postings and runs the queries with
these rules; `gram_batch` makes the same grams in bulk for the batch build.
"""

from __future__ import annotations

import re
import unicodedata
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from operator import add
from typing import Final

from convmem_engine.domain.message import Message

FIELDS: Final = ("content", "summary", "tags")

# Field weights for the overall score, and the per-field score levels.
CONTENT_WEIGHT: Final = 1.0
SUMMARY_WEIGHT: Final = 0.9
TAGS_WEIGHT: Final = 0.8
WHOLE_WORD: Final = 1.0  # needle found with a word boundary on both sides
PARTIAL_WORD: Final = 0.8  # needle found only inside a longer word
WORDS_FACTOR: Final = 0.5  # field without the phrase: 0.5 * mean of the words' levels

_ROUND: Final = 6
_PRETEST_MAX: Final = 32  # whole-word pre-test by regex for needles up to this long


_START: Final = "\x02"  # edge-gram markers: field start / field end
_END: Final = "\x03"
_WORD: Final = "\x01"  # word-boundary gram marker (see `_word_grams`)

_FOLD: Final = {c: c + 32 for c in range(0x41, 0x5B)}
_ASCII_WORD: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
# Scripts written without spaces between words: no word boundaries inside them.
_NO_SPACE_SCRIPTS: Final = (
    (0x0E00, 0x0EFF),  # Thai, Lao
    (0x1000, 0x109F),  # Myanmar
    (0x1780, 0x17FF),  # Khmer
    (0x2E80, 0x9FFF),  # CJK radicals, punctuation, kana, CJK ideographs
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFF66, 0xFF9F),  # halfwidth katakana
    (0x20000, 0x3FFFF),  # CJK extensions
)


_ASCII_WORDS: Final = re.compile("[0-9a-z_]+")
_MAYBE_WORDS: Final = re.compile("[0-9a-z_\x80-\U0010ffff]+")


def fold(text: str) -> str:
    """ASCII case folding: A-Z become a-z, every other code point is unchanged."""
    return text.lower() if text.isascii() else text.translate(_FOLD)


@lru_cache(maxsize=8192)
def _is_word_char_slow(ch: str) -> bool:
    cp = ord(ch)
    for lo, hi in _NO_SPACE_SCRIPTS:
        if lo <= cp <= hi:
            return False
    return ch.isalnum() or unicodedata.category(ch)[0] == "M"


def _is_word_char(ch: str) -> bool:
    if ch < "\x80":
        return ch in _ASCII_WORD
    return _is_word_char_slow(ch)


@lru_cache(maxsize=8192)
def _is_separator(ch: str) -> bool:
    if ch.isspace():
        return True
    cat = unicodedata.category(ch)
    return cat == "Cc" or cat[0] == "Z" or (cat[0] == "P" and cat != "Pc")


def _text_words(folded: str) -> list[str]:
    """The words of a folded text: maximal runs of word code points (`_is_word_char`)."""
    if folded.isascii():
        return _ASCII_WORDS.findall(folded)
    words: list[str] = []
    for run in _MAYBE_WORDS.findall(folded):
        if run.isascii():
            words.append(run)
        else:
            words.extend(run[a:b] for a, b in _word_spans(run))
    return words


def _word_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each maximal run of word code points (`_is_word_char`) of `text`."""
    spans: list[tuple[int, int]] = []
    start = -1
    for i, ch in enumerate(text):
        if _is_word_char(ch):
            if start < 0:
                start = i
        elif start >= 0:
            spans.append((start, i))
            start = -1
    if start >= 0:
        spans.append((start, len(text)))
    return spans


def _word_grams(folded: str, grams: set[str]) -> None:
    """Add the word-boundary grams of a folded field (words: `_text_words`) to `grams`: 4 to
    6 code points each, so never a text gram: every word of 2 to 4 code points whole, WORD +
    it + WORD, and every word of 4 or more as its start, WORD + its first three. A run of word
    code points of a query that a non-word code point of the query (or, for a whole-word test,
    the needle's edge) bounds must be such a word, or the start of one, in the text
    (`_bounded_grams`)."""
    add_gram = grams.add
    for w in _text_words(folded):
        n = len(w)
        if n < 5:
            if n > 1:
                add_gram(f"{_WORD}{w}{_WORD}")
                if n == 4:
                    add_gram(_WORD + w[:3])
        else:
            add_gram(_WORD + w[:3])


def _bounded_grams(needle: str, whole: bool) -> tuple[list[tuple[str, ...]], bool, bool]:
    """Word-boundary grams (`_word_grams`) a field holding `needle` has, from the needle's runs
    of word code points that a non-word code point of the needle bounds (with `whole`, the
    needle's edges bound its first and last run too: an occurrence with a word boundary on
    each side that needs one): groups of which the field has at least one. A run bounded on
    both sides is a whole word (2 to 4 code points: its own gram, exact); one bounded on the
    left starts a word (4+ code points: that start; 3: that start or the run as a whole word).
    Plus whether the first / last run got a group for its bounded outer side."""
    runs = _word_spans(needle)
    groups: list[tuple[str, ...]] = []
    head = tail = False
    n = len(needle)
    for k, (a, b) in enumerate(runs):
        left = a > 0 or whole
        right = b < n or whole
        w = needle[a:b]
        m = b - a
        got_left = got_right = False
        if left and right and 1 < m < 5:
            groups.append((f"{_WORD}{w}{_WORD}",))
            got_left = got_right = True
        elif left and m > 3:
            groups.append((_WORD + w[:3],))
            got_left = True
        elif left and m == 3:
            groups.append((f"{_WORD}{w}{_WORD}", _WORD + w))
            got_left = True
        if k == 0 and a == 0:
            head = got_left
        if k == len(runs) - 1 and b == n:
            tail = got_right
    return groups, head, tail


def query_words(folded: str) -> list[str]:
    """Maximal runs of code points that are not whitespace, punctuation (except `_`) or
    control characters; duplicates removed, first occurrence order kept."""
    words: list[str] = []
    start = -1
    for i, ch in enumerate(folded):
        if _is_separator(ch):
            if start >= 0:
                words.append(folded[start:i])
                start = -1
        elif start < 0:
            start = i
    if start >= 0:
        words.append(folded[start:])
    return list(dict.fromkeys(words))


def _periodic_end(hay: str, start: int, q: int) -> int:
    """The first x >= start with hay[x] != hay[x - q] (len(hay) if none). Slice compares
    of doubling length, then a binary search: O(x - start) character compares, in C."""
    h = len(hay)
    pos = start
    step = 64
    while pos < h:
        size = min(step, h - pos)
        if hay[pos : pos + size] == hay[pos - q : pos - q + size]:
            pos += size
            step *= 2
            continue
        lo, hi = 0, size  # hay[pos : pos + lo] matches; hay[pos : pos + hi] does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if hay[pos : pos + mid] == hay[pos - q : pos - q + mid]:
                lo = mid
            else:
                hi = mid
        return pos + lo
    return h


def _match_level(needle: str, hay: str) -> float:
    """WHOLE_WORD, PARTIAL_WORD or 0.0 for the best occurrence of `needle` in `hay`.

    Linear in len(hay) even for periodic texts ("aaaa" in a megabyte of "a"): when two
    occurrences overlap (at i and i + q, q < len(needle)), the text is q-periodic from i for a
    while and every occurrence inside that run but the last has the same neighbouring
    characters as the one at i + q, so only that last one is checked, and the scan goes on
    after it."""
    i = hay.find(needle)
    if i < 0:
        return 0.0
    first_word = _is_word_char(needle[0])
    last_word = _is_word_char(needle[-1])
    if not first_word and not last_word:
        return WHOLE_WORD
    n = len(needle)
    h = len(hay)

    def whole(at: int) -> bool:
        return (not first_word or at == 0 or not _is_word_char(hay[at - 1])) and (
            not last_word or at + n == h or not _is_word_char(hay[at + n])
        )

    while True:
        if whole(i):
            return WHOLE_WORD
        j = hay.find(needle, i + 1)
        if j < 0:
            return PARTIAL_WORD
        q = j - i
        if q < n and not whole(j):
            # hay[x] == hay[x - q] for i + q <= x < end; the occurrences i + t*q that end by
            # `end` are copies with the same neighbours as j, except possibly the last.
            end = _periodic_end(hay, j + n, q)
            last = i + q * ((end - n - i) // q)
            if last > j and whole(last):
                return WHOLE_WORD
            j = max(j, last)
        i = j


def _tags_level(needle: str, tags: Sequence[str]) -> float:
    best = 0.0
    for tag in tags:
        level = _match_level(needle, tag)
        if level > best:
            best = level
            if best == WHOLE_WORD:
                break
    return best


def _fields_text(msg: Message) -> str:
    """The folded content, summary and tags of `msg` joined by U+0000 (for the pre-tests: a
    needle without U+0000 never spans two fields, and U+0000 is a non-word character, like
    a field edge)."""
    text = msg.content
    meta = msg.metadata
    if meta.summary or meta.tags:
        text = "\x00".join((text, meta.summary or "", *meta.tags))
    return text.lower() if text.isascii() else text.translate(_FOLD)


@lru_cache(maxsize=256)
def _whole_pretest(needle: str) -> Callable[[str], object]:
    """A test on `_fields_text` that is true whenever `needle` occurs in some field with a word
    boundary on each side that needs one (`_match_level` WHOLE_WORD). A superset: only ASCII
    neighbours are tested (an ASCII letter, digit or `_` is a word character; any other
    neighbour passes), so a false result proves no whole-word occurrence and a true one is
    verified as usual. One regex search in C, the needle's literal first: for a needle of
    n code points, at most n + 1 compares per occurrence found."""
    first = _is_word_char(needle[0])
    last = _is_word_char(needle[-1])
    if not (first or last) or len(needle) > _PRETEST_MAX:

        def found(text: str) -> bool:
            return needle in text

        return found
    body = re.escape(needle)
    pattern = body
    if first:
        pattern += f"(?<![0-9a-z_]{body})"
    if last:
        pattern += "(?![0-9a-z_])"
    return re.compile(pattern).search


@dataclass(frozen=True, slots=True)
class SearchHit:
    message_id: str
    score: float
    score_breakdown: dict[str, float]
    matched_fields: list[str]


class _Query:
    __slots__ = ("multi", "phrase", "words")

    def __init__(self, query: str) -> None:
        folded = fold(query)
        self.phrase = folded.strip() or folded
        self.words = query_words(self.phrase)
        # Word matching adds nothing when the only word is the phrase itself.
        self.multi = bool(self.words) and self.words != [self.phrase]

    def terms(self) -> list[str]:
        """Strings every match contains somewhere (in some field)."""
        return self.words if self.words else [self.phrase]


def _breakdown(
    msg: Message, q: _Query, content: str | None = None, c: float | None = None
) -> tuple[float, float, float] | None:
    """Per-field scores (content, summary, tags), or None when the message does not match.
    `content`/`c` may pass the folded content and its phrase level when already known."""
    if content is None:
        content = fold(msg.content)
    if c is None:
        c = _match_level(q.phrase, content)
    meta = msg.metadata
    summary = fold(meta.summary) if meta.summary else ""
    tags = [fold(t) for t in meta.tags]
    phrase = q.phrase
    s = _match_level(phrase, summary) if summary else 0.0
    t = _tags_level(phrase, tags) if tags else 0.0
    if not q.multi:
        if c == 0.0 and s == 0.0 and t == 0.0:
            return None
        return (c, s, t)
    found_all = True
    phrase_found = c > 0.0 or s > 0.0 or t > 0.0
    cw = sw = tw = 0.0
    for w in q.words:
        lc = _match_level(w, content)
        ls = _match_level(w, summary) if summary else 0.0
        lt = _tags_level(w, tags) if tags else 0.0
        if lc == 0.0 and ls == 0.0 and lt == 0.0:
            if not phrase_found:
                return None  # neither the phrase nor every word: no match (stop early)
            found_all = False
        cw += lc
        sw += ls
        tw += lt
    if not found_all and c == 0.0 and s == 0.0 and t == 0.0:
        return None
    n = len(q.words)
    if c == 0.0:
        c = WORDS_FACTOR * cw / n
    if s == 0.0:
        s = WORDS_FACTOR * sw / n
    if t == 0.0:
        t = WORDS_FACTOR * tw / n
    return (round(c, _ROUND), round(s, _ROUND), round(t, _ROUND))


def _hits(
    heap: list[tuple[float, int, int, str]], messages: Mapping[str, Message], q: _Query
) -> list[SearchHit]:
    """The kept keys, best first, as hits with their score breakdown."""
    hits: list[SearchHit] = []
    for score, _imp, _ts, mid in sorted(heap, reverse=True):
        meta = messages[mid].metadata
        if not meta.summary and not meta.tags and CONTENT_WEIGHT == 1.0:
            # Content only: its score is the overall score (`_overall` of (c, 0.0, 0.0) with
            # CONTENT_WEIGHT 1.0), so it is not matched again.
            parts: tuple[float, float, float] | None = (score, 0.0, 0.0)
        else:
            parts = _breakdown(messages[mid], q)
        assert parts is not None
        hits.append(
            SearchHit(
                message_id=mid,
                score=score,
                score_breakdown=dict(zip(FIELDS, parts, strict=True)),
                matched_fields=[f for f, v in zip(FIELDS, parts, strict=True) if v > 0.0],
            )
        )
    return hits


@lru_cache(maxsize=64)
def _partial_words_bound(n: int) -> float:
    """The best words-only score (no phrase in any field) of a message in which one of the
    `n` words is found only inside longer words: the field sum of `_breakdown` with that word
    at PARTIAL_WORD and every other at WHOLE_WORD, in each position (the float sums are
    computed exactly as `_breakdown` does, so the bound is never below a real score)."""
    best = 0.0
    for k in range(n):
        total = 0.0
        for i in range(n):
            total += PARTIAL_WORD if i == k else WHOLE_WORD
        best = max(best, round(WORDS_FACTOR * total / n, _ROUND))
    return best


def _whole_word_matters(phrase: str) -> bool:
    """Whether a found phrase can still be a partial-word match (needs a boundary check)."""
    return _is_word_char(phrase[0]) or _is_word_char(phrase[-1])


def _overall(parts: tuple[float, float, float]) -> float:
    c, s, t = parts
    return round(max(c * CONTENT_WEIGHT, s * SUMMARY_WEIGHT, t * TAGS_WEIGHT), _ROUND)


def _score(msg: Message, q: _Query, folded: str | None = None) -> float | None:
    """The overall score, or None when the message does not match. `folded`: the folded
    content, when the caller has it."""
    if folded is None:
        content = msg.content
        folded = content.lower() if content.isascii() else content.translate(_FOLD)
    c = _match_level(q.phrase, folded)
    # The phrase as a whole word in the content is the best possible score.
    if c == WHOLE_WORD:
        return WHOLE_WORD * CONTENT_WEIGHT
    meta = msg.metadata
    if not q.multi and not meta.summary and not meta.tags:
        return c * CONTENT_WEIGHT if c else None
    parts = _breakdown(msg, q, folded, c)
    return None if parts is None else _overall(parts)


def _field_len(msg: Message) -> int:
    """The length in code points of the longest indexed field (folding keeps lengths)."""
    meta = msg.metadata
    size = len(msg.content)
    if meta.summary and len(meta.summary) > size:
        size = len(meta.summary)
    for tag in meta.tags:
        if len(tag) > size:
            size = len(tag)
    return size


def _signature(msg: Message) -> int:
    """Checksum of the indexed fields (CRC-32 of their UTF-8, 32 bits: 4 MiB less than a 64-bit
    one at a million documents); detects a `remove(old)` whose value is not the indexed one
    (all but one in 4 billion). The same in every process (unlike `hash`), so a persisted
    index keeps its signatures (see search_file.py)."""
    meta = msg.metadata
    data = "\x1f".join((msg.session_id, msg.content, meta.summary or "", *meta.tags)).encode(
        "utf-8", "surrogatepass"
    )
    return zlib.crc32(data)


def _grams(msg: Message) -> tuple[set[str], list[str]]:
    """All 2-grams and 3-grams of the folded fields, the two edge grams of each field (START +
    first two code points, last two + END), their word-boundary grams (`_word_grams`), and the
    fields that are one code point."""
    grams: set[str] = set()
    singles: list[str] = []
    meta = msg.metadata
    # (most messages have no summary and no tags: no list of fields for them)
    texts = (msg.content,) if not meta.summary and not meta.tags else _fields(msg)
    for text in texts:
        t = text.lower() if text.isascii() else text.translate(_FOLD)
        n = len(t)
        if n >= 2:
            bigrams = list(map(add, t, t[1:]))
            grams.update(bigrams)
            if n >= 3:
                grams.update(map(add, bigrams, t[2:]))
            grams.add(_START + bigrams[0])
            grams.add(bigrams[-1] + _END)
            _word_grams(t, grams)
        elif n == 1:
            singles.append(t)
    return grams, singles


def _fields(msg: Message) -> list[str]:
    """The indexed fields of `msg`: content, summary (when not empty), each tag."""
    meta = msg.metadata
    texts = [msg.content]
    if meta.summary:
        texts.append(meta.summary)
    texts.extend(meta.tags)
    return texts
