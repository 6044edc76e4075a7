"""Per-session history: live message ids in creation order, plus per-session aggregates.

Creation order is ULID order: the service generates strictly increasing ULIDs (also across
restarts), so a sorted list of ids per session is the history. Paging by "ids after X" with
`bisect` stays correct while other clients write (new ids land at the end) and delete (the
position of X is still defined when X itself is gone).

Sessions are ordered by their first live message id (time, then id). A new session always sorts
last; a session whose first live message is deleted moves to its next message's position.

Derived state only: `build()` from the store's messages gives the same index as the sequence of
`add`/`remove`/`replace` calls that led there. Not thread-safe by itself: the service guards it.
"""

from __future__ import annotations

import gc
import sys
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from operator import attrgetter
from typing import Final

from convmem_engine.domain.message import DEFAULT_METADATA, MEMORY_KINDS, Message, Metadata

_KIND_INDEX = {kind: i for i, kind in enumerate(MEMORY_KINDS)}


def _first_id(sess: SessionHistory) -> str:
    return sess.ids[0]


_NO_IDS: tuple[str, ...] = ()
"""A session's `summary_ids` / `kind_summary_ids` while it has none (most sessions: no list of
their own, 112 bytes saved per session, 3 MiB at 27,766 sessions)."""


FREEZE_FROM = 20_000
"""Builds of at least this many messages move what they made out of the collector's scans
(`gc.freeze`: else the first collection after the build walks every list and session it
made, ~0.1 s at 1M messages)."""


@contextmanager
def _collector_paused(freeze: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """The cyclic garbage collector off during a build (if it was on; process-wide, for the
    fraction of a second a build takes). A build makes three containers per session that all
    live on, and each of the collections they would trigger traverses the id lists built so
    far: at 1M messages that cost 0.05-0.25 s CPU of a 0.2-0.45 s build. A build makes no
    cycles, and nothing is lost meanwhile: the next collection after it finds any others."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if freeze():
            gc.freeze()
        gc.enable()


def _remove_sorted(ids: list[str], message_id: str) -> bool:
    i = bisect_left(ids, message_id)
    if i < len(ids) and ids[i] == message_id:
        del ids[i]
        return True
    return False


def _add_sorted(ids: list[str], message_id: str) -> None:
    if not ids or ids[-1] < message_id:
        ids.append(message_id)
    else:
        i = bisect_left(ids, message_id)
        if i == len(ids) or ids[i] != message_id:
            ids.insert(i, message_id)


def _with(ids: Sequence[str], message_id: str) -> Sequence[str]:
    """`ids` (sorted) with `message_id`: the same list, or a new one for `_NO_IDS`."""
    if isinstance(ids, list):
        _add_sorted(ids, message_id)
        return ids
    return [message_id]


def _without(ids: Sequence[str], message_id: str) -> Sequence[str]:
    """`ids` (sorted) without `message_id`; `_NO_IDS` once empty."""
    if isinstance(ids, list) and _remove_sorted(ids, message_id) and not ids:
        return _NO_IDS
    return ids


_LIST_GC: Final = sys.getsizeof([]) - [].__sizeof__()
"""What `sys.getsizeof` adds to a list's `__sizeof__` (the collector's header): the byte counts
call `__sizeof__` directly, several times faster."""


def _own_bytes(ids: Sequence[str]) -> int:
    return ids.__sizeof__() + _LIST_GC if ids is not _NO_IDS else 0


class SessionHistory:
    """One session: ids in creation order, kind counts, and ids carrying a summary (read-only
    sequences for readers: `_NO_IDS` while there are none)."""

    __slots__ = ("ids", "kind_counts", "kind_summary_ids", "session_id", "summary_ids")

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.ids: list[str] = []
        self.kind_counts: list[int] = [0] * len(MEMORY_KINDS)
        self.summary_ids: Sequence[str] = _NO_IDS  # messages whose metadata.summary is set
        self.kind_summary_ids: Sequence[str] = _NO_IDS  # messages of memory_kind "summary"

    def add(self, msg: Message) -> None:
        _add_sorted(self.ids, msg.message_id)
        self.kind_counts[_KIND_INDEX[msg.metadata.memory_kind]] += 1
        if msg.metadata.summary is not None:
            self.summary_ids = _with(self.summary_ids, msg.message_id)
        if msg.metadata.memory_kind == "summary":
            self.kind_summary_ids = _with(self.kind_summary_ids, msg.message_id)

    def remove(self, msg: Message) -> None:
        if _remove_sorted(self.ids, msg.message_id):
            self.kind_counts[_KIND_INDEX[msg.metadata.memory_kind]] -= 1
        if msg.metadata.summary is not None:
            self.summary_ids = _without(self.summary_ids, msg.message_id)
        if msg.metadata.memory_kind == "summary":
            self.kind_summary_ids = _without(self.kind_summary_ids, msg.message_id)

    def kind_count_map(self) -> dict[str, int]:
        return dict(zip(MEMORY_KINDS, self.kind_counts, strict=True))

    def memory_bytes(self) -> int:
        """sys.getsizeof of the session's object and lists (the ids are the store's)."""
        return (
            _SESSION_FIXED
            + self.ids.__sizeof__()
            + _LIST_GC
            + _own_bytes(self.summary_ids)
            + _own_bytes(self.kind_summary_ids)
        )


def _fresh_bytes(sess: SessionHistory) -> int:
    """`SessionHistory.memory_bytes` by `sys.getsizeof` of each object (the reference)."""
    size = sys.getsizeof
    return (
        size(sess)
        + size(sess.ids)
        + size(sess.kind_counts)
        + (size(sess.summary_ids) if sess.summary_ids is not _NO_IDS else 0)
        + (size(sess.kind_summary_ids) if sess.kind_summary_ids is not _NO_IDS else 0)
    )


_SESSION_FIXED: Final = _fresh_bytes(SessionHistory("")) - sys.getsizeof([])
"""A session's object and kind counts (a list that never changes length)."""
_ids_of = attrgetter("ids")


class HistoryIndex:
    def __init__(self) -> None:
        self._sessions: dict[str, SessionHistory] = {}
        # Sessions ordered by first live message id; parallel lists (keys sorted).
        self._order_keys: list[str] = []
        self._order_sessions: list[str] = []
        # `memory_bytes` of every session, kept up to date by every change: health reads the
        # index's size without walking its sessions.
        self._counted = 0

    # -- maintenance -------------------------------------------------------------------------

    def clear(self) -> None:
        self._sessions = {}
        self._order_keys = []
        self._order_sessions = []
        self._counted = 0

    def build(self, messages: Iterable[Message]) -> None:
        """The index of `messages` (any order); one pass plus a sort per session (linear for
        the store's creation order, which timsort sees as already sorted)."""
        self.build_rows((m.message_id, m.session_id, m.metadata) for m in messages)

    def build_rows(self, rows: Iterable[tuple[str, str, Metadata]]) -> None:
        """`build` from (message_id, session_id, metadata) of each message: all it reads."""
        with _collector_paused(self._large):
            self._build_rows(rows)

    def _build_rows(self, rows: Iterable[tuple[str, str, Metadata]]) -> None:
        self.clear()
        sessions = self._sessions
        kind_index = _KIND_INDEX
        summary_ids: dict[str, list[str]] = {}
        kind_summary_ids: dict[str, list[str]] = {}
        for mid, session_id, md in rows:
            sess = sessions.get(session_id)
            if sess is None:
                sess = sessions[session_id] = SessionHistory(session_id)
            sess.ids.append(mid)
            sess.kind_counts[kind_index[md.memory_kind]] += 1
            if md.summary is not None:
                summary_ids.setdefault(session_id, []).append(mid)
            if md.memory_kind == "summary":
                kind_summary_ids.setdefault(session_id, []).append(mid)
        for sess in sessions.values():
            # A copy without the spare room of the appends (~1 MiB at a million messages).
            sess.ids = sorted(sess.ids)
        lists = 0  # bytes of the summary id lists
        for sid, ids in summary_ids.items():
            sessions[sid].summary_ids = kept = sorted(ids)
            lists += _own_bytes(kept)
        for sid, ids in kind_summary_ids.items():
            sessions[sid].kind_summary_ids = kept = sorted(ids)
            lists += _own_bytes(kept)
        self._set_order(list(sessions.values()), lists)

    def build_columns(
        self, ids: Iterable[str], numbers: Iterable[int], session_ids: Sequence[str]
    ) -> None:
        """`build_rows` for a store whose every message has the default metadata, from the
        message ids and their sessions' numbers (in step) and the session id of each number:
        the ids are grouped by number at C speed (no Python code per message; 1M messages:
        0.40 -> ~0.2 s CPU), each session's kind count is its length and no session has
        summary ids."""
        with _collector_paused(self._large):
            self._build_columns(ids, numbers, session_ids)

    def _build_columns(
        self, ids: Iterable[str], numbers: Iterable[int], session_ids: Sequence[str]
    ) -> None:
        md = DEFAULT_METADATA
        assert md.summary is None and md.memory_kind != "summary"  # so no summary ids
        self.clear()
        kind = _KIND_INDEX[md.memory_kind]
        groups: list[list[str]] = [[] for _ in session_ids]
        any(map(list.append, map(groups.__getitem__, numbers), ids))
        made: list[SessionHistory] = []
        while groups:  # from the last number: each group is freed once copied
            group = groups.pop()
            if group:
                sess = SessionHistory(session_ids[len(groups)])
                # Sorted (timsort: one comparison per id when they came in creation order,
                # measured as cheap as a plain copy) and without the spare room of the
                # appends, as build_rows does.
                sess.ids = sorted(group)
                sess.kind_counts[kind] = len(group)
                made.append(sess)
        self._set_order(made)

    def _large(self) -> bool:
        """Whether the index holds at least FREEZE_FROM messages."""
        return sum(len(sess.ids) for sess in self._sessions.values()) >= FREEZE_FROM

    def _set_order(self, sessions: list[SessionHistory], summary_bytes: int = 0) -> None:
        """The index of `sessions` (in any order; each with ids, and summary id lists of
        `summary_bytes` in all): kept in session order (first id), whatever order the
        messages came in, as are the order's lists. Counts their bytes (`memory_bytes`) in
        C: ~1 ms at 28,000 sessions."""
        sessions.sort(key=_first_id)
        self._sessions = {sess.session_id: sess for sess in sessions}
        self._order_keys = [sess.ids[0] for sess in sessions]
        self._order_sessions = [sess.session_id for sess in sessions]
        self._counted = (
            len(sessions) * (_SESSION_FIXED + _LIST_GC)
            + sum(map(list.__sizeof__, map(_ids_of, sessions)))
            + summary_bytes
        )

    def _unorder(self, first_id: str) -> None:
        i = bisect_left(self._order_keys, first_id)
        del self._order_keys[i]
        del self._order_sessions[i]

    def _order(self, first_id: str, session_id: str) -> None:
        if not self._order_keys or self._order_keys[-1] < first_id:
            self._order_keys.append(first_id)
            self._order_sessions.append(session_id)
        else:
            i = bisect_left(self._order_keys, first_id)
            self._order_keys.insert(i, first_id)
            self._order_sessions.insert(i, session_id)

    def add(self, msg: Message) -> None:
        sess = self._sessions.get(msg.session_id)
        if sess is None:
            sess = self._sessions[msg.session_id] = SessionHistory(msg.session_id)
            sess.add(msg)
            self._counted += sess.memory_bytes()
            self._order(msg.message_id, msg.session_id)
            return
        before = sess.memory_bytes()
        old_first = sess.ids[0]
        sess.add(msg)
        self._counted += sess.memory_bytes() - before
        if sess.ids[0] != old_first:
            self._unorder(old_first)
            self._order(sess.ids[0], msg.session_id)

    def remove(self, msg: Message) -> None:
        sess = self._sessions.get(msg.session_id)
        if sess is None or not sess.ids:
            return
        before = sess.memory_bytes()
        old_first = sess.ids[0]
        sess.remove(msg)
        if not sess.ids:
            del self._sessions[msg.session_id]
            self._counted -= before
            self._unorder(old_first)
            return
        self._counted += sess.memory_bytes() - before
        if sess.ids[0] != old_first:
            self._unorder(old_first)
            self._order(sess.ids[0], msg.session_id)

    def replace(self, old: Message, new: Message) -> None:
        """An update: same id and session; kind or summary may change."""
        sess = self._sessions[old.session_id]
        before = sess.memory_bytes()
        sess.remove(old)
        sess.add(new)
        self._counted += sess.memory_bytes() - before

    # -- queries -----------------------------------------------------------------------------

    def session_count(self) -> int:
        return len(self._sessions)

    def session_ids(self) -> Iterator[str]:
        """Every session with live messages (as stored: the index keeps the store's strings)."""
        return iter(self._sessions)

    def session(self, session_id: str) -> SessionHistory | None:
        return self._sessions.get(session_id)

    def message_count(self, session_id: str) -> int:
        sess = self._sessions.get(session_id)
        return len(sess.ids) if sess is not None else 0

    def ids_after(self, session_id: str, after: str | None, limit: int) -> tuple[list[str], bool]:
        """Up to `limit` ids of the session after id `after` (None: from the start), and
        whether more follow."""
        sess = self._sessions.get(session_id)
        if sess is None:
            return [], False
        start = 0 if after is None else bisect_right(sess.ids, after)
        page = sess.ids[start : start + limit]
        return page, start + limit < len(sess.ids)

    def neighbours(
        self, session_id: str, message_id: str, before: int, after: int
    ) -> tuple[list[str], list[str]]:
        """Ids of up to `before` earlier and `after` later messages of the same session."""
        sess = self._sessions.get(session_id)
        if sess is None:
            return [], []
        i = bisect_left(sess.ids, message_id)
        j = i + 1 if i < len(sess.ids) and sess.ids[i] == message_id else i
        return sess.ids[max(0, i - before) : i], sess.ids[j : j + after]

    def sessions_after(self, after_key: str | None, limit: int) -> tuple[list[str], bool]:
        """Up to `limit` session ids ordered by first live message id, after key `after_key`."""
        start = 0 if after_key is None else bisect_right(self._order_keys, after_key)
        page = self._order_sessions[start : start + limit]
        return page, start + limit < len(self._order_sessions)

    def memory_bytes(self) -> int:
        """Bytes of the index's own containers by `sys.getsizeof` (ids are shared with the
        store, not counted). Constant time: the sessions' part is kept up to date by every
        change (`_counted`); `memory_bytes_fresh` walks them instead."""
        return self._fixed_bytes() + self._counted

    def memory_bytes_fresh(self) -> int:
        """`memory_bytes` by walking every session (the reference; `check` compares)."""
        return self._fixed_bytes() + sum(map(_fresh_bytes, self._sessions.values()))

    def _fixed_bytes(self) -> int:
        size = sys.getsizeof
        return (
            size(self) + size(self._sessions) + size(self._order_keys) + size(self._order_sessions)
        )
