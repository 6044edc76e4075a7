"""How the store keeps its live messages in memory: one compact `bytes` value per message.

A `Message` object with its strings and ints costs ~230 bytes beyond its id (the object 96,
the timestamp int 32, the content string's 49-byte header); a million of them were most of
`convmem serve`'s memory at 1M messages. The store keeps instead, per message id, one bytes
object (33 bytes of header) holding

    <q timestamp> <I session number> <B role code> <B flags> <I revision>     18 bytes
    [<q updated_at>]                       when flags & UPDATED (it differs from timestamp)
    [<I length> <metadata row as JSON>]    when flags & META (not the default metadata)
    <content, UTF-8>                       the rest

Session ids are numbered in a table of the store (one string per session); roles are codes
into `ROLES`. The `Message` is built when asked for (`get`, the view's `[]`, iteration), with
the id string kept as the dict key, so every reader sees the same id objects. A message that
does not fit the layout (a role that is not one of ROLES, an int out of range, text that is
not valid UTF-8) is kept as its `Message` object: the table holds either, and readers cannot
tell the difference. Memory only: nothing here is on disk.
"""

from __future__ import annotations

import json
import re
import struct
import sys
import threading
from array import array
from bisect import bisect_right
from collections.abc import (
    Callable,
    Collection,
    ItemsView,
    Iterable,
    Iterator,
    KeysView,
    Mapping,
    ValuesView,
)
from dataclasses import dataclass
from itertools import chain, islice, repeat
from operator import itemgetter
from typing import Any, Final

from convmem_engine.domain.message import DEFAULT_METADATA, ROLES, Message, Metadata
from convmem_engine.storage.codec import (
    MESSAGE_SETTERS,
    loads,
    message_from_row,
    message_row,
    metadata_from_row,
    metadata_row,
    row_fields,
)

HEAD: Final = struct.Struct("<qIBBI")
HEAD_SIZE: Final = HEAD.size  # 18
_I64: Final = struct.Struct("<q")
_U32: Final = struct.Struct("<I")
_FIRST: Final = itemgetter(0)
_SESSION_AT: Final = struct.Struct("<8xI")  # a packed value's session number
_SESSION_OF_HEAD: Final = struct.Struct("<8xI6x")  # the session number of an 18-byte header
_HEADS: Final = re.compile(rb"(?s).{%d}" % HEAD.size)
_U32_ARRAY: Final = next(code for code in "IL" if array(code).itemsize == 4)
UPDATED: Final = 1
META: Final = 2
# Snapshot rows (binary_rows / load_binary): <B kind> <I a> <I b> then a + b bytes.
ROW: Final = struct.Struct("<BII")
ROW_SIZE: Final = ROW.size  # 9
PACKED_ROW: Final = 0  # a = id length, b = packed value length: the id (UTF-8), the value
JSON_ROW: Final = 1  # a = 0, b = length: a message kept as a Message, its codec row as JSON
SESSION_ROW: Final = 2  # a = length, b = 0: the next session number's id (UTF-8)
# A block of plain values (no flags), CMSNAP5 only: a = the length of the ids, b = of the
# values: <the ids, UTF-8, 0xFF between two> <each packed value followed by 0xFF>
# (0xFF is never part of UTF-8: the ids split at it; a value is its 18-byte header, then
# UTF-8 up to the 0xFF)
COLUMN_BLOCK: Final = 3
# The session table as a block (CMSNAP5 only): a = the length of the session ids (UTF-8,
# 0xFF between two), b = 0; the ids take the next session numbers, as that many session rows
SESSION_BLOCK: Final = 4
# A block of plain values in two columns, CMSNAP6 only: a = the length of the ids, b = of the
# rest: <the ids, UTF-8, 0xFF between two> <each value's 18-byte header, in order> <each
# value's content, UTF-8, followed by 0xFF> (the values split without a pattern; loaded
# without building them: see _Block)
HEAD_BLOCK: Final = 5
BLOCK_ROWS: Final = 4096  # rows per column block (about 300 kB at the corpus' sizes)
_MIN_BLOCK: Final = 16  # a shorter run of plain values is written as packed rows
_SEPARATOR: Final = b"\xff"
_SEPARATOR_ESCAPED: Final = _SEPARATOR.decode("utf-8", "surrogateescape")
_ROLE_CODES: Final = {r: i for i, r in enumerate(ROLES)}
_BYTES_HEADER: Final = sys.getsizeof(b"")  # 33 on CPython 3.11 (64-bit)
_ASCII_STR: Final = sys.getsizeof("")  # an ASCII str: this + its length (49 on CPython 3.11)
assert sys.getsizeof("ab") == _ASCII_STR + 2
_I64_MIN: Final = -(1 << 63)
_I64_MAX: Final = (1 << 63) - 1
_U32_MAX: Final = (1 << 32) - 1

_S0, _S1, _S2, _S3, _S4, _S5, _S6, _S7 = MESSAGE_SETTERS
_new = object.__new__


def _metadata_json(md: Metadata) -> bytes:
    return json.dumps(metadata_row(md), ensure_ascii=False, separators=(",", ":")).encode("utf-8")


@dataclass(frozen=True, slots=True)
class TableMemory:
    """What the table holds, by `sys.getsizeof` (no allocator overhead): `entry_bytes` the id
    strings and each value's header and fixed fields (for a kept Message: the object and its
    ints), `body_bytes` the contents (UTF-8 in a packed value; the string of a kept Message),
    `metadata_bytes` the non-default metadata (length + JSON; a kept Message's Metadata
    object and strings), `table_bytes` the id -> value dict and the session table."""

    entries: int = 0
    entry_bytes: int = 0
    body_bytes: int = 0
    metadata_bytes: int = 0
    table_bytes: int = 0


def _kept_metadata_bytes(md: Metadata) -> int:
    if md is DEFAULT_METADATA:
        return 0
    size = sys.getsizeof
    n = size(md) + size(md.tags) + size(md.relations) + size(md.source_message_ids)
    n += sum(size(t) for t in md.tags) + sum(size(x) for x in md.source_message_ids)
    n += sum(size(r) + size(r.message_id) for r in md.relations)
    if md.tool_call_id is not None:
        n += size(md.tool_call_id)
    if md.summary is not None:
        n += size(md.summary)
    return n


def value_sizes(message_id: str, value: bytes | Message) -> tuple[int, int, int]:
    """(entry, body, metadata) bytes of one table entry (see TableMemory)."""
    size = sys.getsizeof
    if type(value) is bytes:
        flags = value[13]
        fixed = HEAD_SIZE + (8 if flags & UPDATED else 0)
        meta = 4 + _U32.unpack_from(value, fixed)[0] if flags & META else 0
        return size(message_id) + _BYTES_HEADER + fixed, len(value) - fixed - meta, meta
    m: Message = value  # type: ignore[assignment]
    entry = size(message_id) + size(m) + size(m.timestamp)
    if m.updated_at is not m.timestamp:
        entry += size(m.updated_at)
    return entry, size(m.content), _kept_metadata_bytes(m.metadata)


class _Block:
    """A column block of a CMSNAP6 snapshot (HEAD_BLOCK) whose values are not built yet: the
    table maps each of its ids to this object until one of them is read or changed, or a
    reader goes through all the values; then the block's values replace it, all at once
    (`MessageTable._open`). Its rows were checked when it was loaded, as a packed row is, so
    building them cannot fail. While it is pending its ids are contiguous in the table, in
    its order: only new ids are added, and a change to one of its ids opens it first."""

    __slots__ = ("ids", "raw", "sessions")

    def __init__(self, ids: list[str], raw: bytes, sessions: array[int]) -> None:
        self.ids: list[str] | None = ids  # the table's keys of its rows (None once opened)
        self.raw = raw  # the headers (18 bytes each), then each content followed by 0xFF
        self.sessions = sessions  # the rows' session numbers (kept: history_columns)

    def values(self, raw: bytes) -> list[bytes]:
        """The packed values of `raw` (this block's), in order."""
        end = len(self.sessions) * HEAD_SIZE
        texts = raw[end:].split(_SEPARATOR)
        texts.pop()  # after the last separator
        return list(map(bytes.__add__, _HEADS.findall(raw, 0, end), texts))


_Value = bytes | Message | _Block
RELEASE_EVERY: Final = 16
"""Blocks opened (~5 MB of buffers at the corpus' sizes) between two `MessageTable.release`."""


class MessageTable:
    """The live messages, id -> packed value (or a Message that does not fit), in creation
    order. Not thread-safe by itself: the store serialises writers (its write lock); readers
    may run together (a block they open is opened once: `_open`).

    Held in parts, each a dict in creation order: the parts of a loaded snapshot (one per
    column block, one per run of rows between them) and then `_tail`, where every new id
    goes. A million small dicts' worth of entries cost a fraction of one dict of a million
    (each part's table stays in the CPU's cache while it is filled: at 1M messages ~0.05 s
    against 0.3-0.45 s). An id is found in `_tail` or in the one part whose id range holds
    it (`_lows`, when the parts' ranges are in order and apart, as a store's ULIDs are), or
    else by looking in each part."""

    __slots__ = (
        "_blocks",
        "_body_bytes",
        "_entry_bytes",
        "_highs",
        "_lows",
        "_metadata_bytes",
        "_open_lock",
        "_opened",
        "_others",
        "_parts",
        "_pending",
        "_pristine",
        "_session_bytes",
        "_session_numbers",
        "_sessions",
        "_tail",
        "release",
        "view",
    )

    def __init__(self) -> None:
        self._parts: list[dict[str, _Value]] = []
        self._tail: dict[str, _Value] = {}
        # The block each part was loaded from (None: a run of rows), in step with _parts.
        self._blocks: list[_Block | None] = []
        # The lowest and highest id of each part while they are in order and apart (routing
        # by bisection); None once they are not (then every part is looked in).
        self._lows: list[str] | None = []
        self._highs: list[str] = []
        self._sessions: list[str] = []
        self._session_numbers: dict[str, int] = {}
        self.view: MessagesView = MessagesView(self)
        # The blocks loaded and not opened yet, with their parts (some may have been opened
        # since: their ids are None).
        self._pending: list[tuple[_Block, dict[str, _Value]]] = []
        self._open_lock = threading.Lock()
        self._opened = 0  # blocks opened since `release` was last called
        # Gives the C heap's free pages back to the system (the service's: index/heap.py), or
        # None: called once every RELEASE_EVERY blocks opened and after opening them all. A
        # block's buffer, freed when it is opened, is too large for the small objects its
        # values become to reuse: without this a store whose every block is opened keeps
        # them all resident (at 1M messages ~90 MiB more than the table built at once).
        self.release: Callable[[], object] | None = None
        # Nothing set or popped since the load: every part is as loaded (history_columns reads
        # the blocks' session numbers as they are).
        self._pristine = True
        # kept in step with every set/pop (recount() after a bulk load)
        self._entry_bytes = 0
        self._body_bytes = 0
        self._metadata_bytes = 0
        self._session_bytes = 0  # sys.getsizeof of every session id string of the table
        # how many values are kept Messages or have metadata (0: history_columns applies and
        # with_metadata need not look at each value)
        self._others = 0

    # -- packing ----------------------------------------------------------------------------

    def _session_number(self, session_id: str) -> int:
        n = self._session_numbers.get(session_id)
        if n is None:
            n = len(self._sessions)
            session_id = sys.intern(session_id)
            self._sessions.append(session_id)
            self._session_numbers[session_id] = n
            if session_id:  # "" is also a pruned number's placeholder: never counted
                self._session_bytes += sys.getsizeof(session_id)
        return n

    def pack(self, msg: Message) -> bytes | Message:
        """The value kept for `msg`: packed, or `msg` itself when it does not fit."""
        ts, rev, upd, role = msg.timestamp, msg.revision, msg.updated_at, msg.role
        code = _ROLE_CODES.get(role) if type(role) is str else None
        if (
            code is None
            or type(ts) is not int
            or type(upd) is not int
            or type(rev) is not int
            or type(msg.session_id) is not str
            or type(msg.content) is not str
            or not _I64_MIN <= ts <= _I64_MAX
            or not _I64_MIN <= upd <= _I64_MAX
            or not 0 <= rev <= _U32_MAX
        ):
            return msg
        try:
            content = msg.content.encode("utf-8")
            if not msg.session_id.isascii():
                msg.session_id.encode("utf-8")  # a session table entry is written as UTF-8
            md = msg.metadata
            meta = b"" if md is DEFAULT_METADATA or md == DEFAULT_METADATA else _metadata_json(md)
        except (UnicodeEncodeError, TypeError, ValueError):
            return msg
        flags = (UPDATED if upd != ts else 0) | (META if meta else 0)
        head = HEAD.pack(ts, self._session_number(msg.session_id), code, flags, rev)
        if not flags:
            return head + content
        parts = [head]
        if flags & UPDATED:
            parts.append(_I64.pack(upd))
        if meta:
            parts.append(_U32.pack(len(meta)))
            parts.append(meta)
        parts.append(content)
        return b"".join(parts)

    def unpack(self, message_id: str, value: bytes | Message) -> Message:
        if type(value) is not bytes:
            return value  # type: ignore[return-value]
        ts, session, code, flags, rev = HEAD.unpack_from(value)
        m: Message = _new(Message)
        _S0(m, message_id)
        _S1(m, self._sessions[session])
        _S2(m, ts)
        _S3(m, ROLES[code])
        _S5(m, rev)
        if not flags:
            _S6(m, ts)
            _S7(m, DEFAULT_METADATA)
            _S4(m, value[HEAD_SIZE:].decode("utf-8"))
            return m
        at = HEAD_SIZE
        if flags & UPDATED:
            _S6(m, _I64.unpack_from(value, at)[0])
            at += 8
        else:
            _S6(m, ts)
        if flags & META:
            (n,) = _U32.unpack_from(value, at)
            at += 4
            _S7(m, metadata_from_row(loads(value[at : at + n].decode("utf-8"))))
            at += n
        else:
            _S7(m, DEFAULT_METADATA)
        _S4(m, value[at:].decode("utf-8"))
        return m

    # -- the dict's operations ----------------------------------------------------------------

    def _all(self) -> list[dict[str, _Value]]:
        """Every part, the tail last."""
        return [*self._parts, self._tail]

    def _part_of(self, message_id: str) -> dict[str, _Value] | None:
        """The part that holds `message_id`, or None."""
        if message_id in self._tail:
            return self._tail
        parts = self._parts
        lows = self._lows
        if lows is not None:
            i = bisect_right(lows, message_id) - 1
            if i >= 0 and message_id in parts[i]:
                return parts[i]
            return None
        for part in parts:
            if message_id in part:
                return part
        return None

    def __len__(self) -> int:
        return sum(map(len, self._parts)) + len(self._tail)

    def __contains__(self, message_id: object) -> bool:
        return type(message_id) is str and self._part_of(message_id) is not None

    def max_id(self) -> str | None:
        """The greatest message id, or one at least as great that the table held (a part's
        highest when loaded: the parts' ranges, when in order, say it without a pass over
        every id): a bound that new ids must sort after. None when empty."""
        if not len(self):
            return None
        if self._lows is not None and self._highs:
            high = self._highs[-1]
            return max(high, max(self._tail)) if self._tail else high
        return max(self.iter_keys())

    def iter_keys(self) -> Iterator[str]:
        """The message ids, in order."""
        return chain.from_iterable(self._all())

    def _items(self) -> Iterator[tuple[str, _Value]]:
        return chain.from_iterable([part.items() for part in self._all()])

    def _stored(self) -> Iterator[bytes | Message]:
        """Every value, in order (blocks opened first)."""
        self._open_all()
        return chain.from_iterable([part.values() for part in self._all()])  # type: ignore[misc]

    def stored_items(self) -> Iterator[tuple[str, bytes | Message]]:
        """(id, value as kept: packed bytes or a Message) in order, every block opened."""
        self._open_all()
        return self._items()  # type: ignore[return-value]

    def _value(self, message_id: str) -> tuple[dict[str, _Value] | None, bytes | Message | None]:
        """The part that holds `message_id` and its value (its block opened if it was still
        pending), or (None, None)."""
        part = self._part_of(message_id)
        if part is None:
            return None, None
        v = part[message_id]
        if type(v) is _Block:
            self._open(v, part)
            v = part[message_id]
        return part, v  # type: ignore[return-value]

    def _open(self, block: _Block, part: dict[str, _Value]) -> None:
        """Put the values of `block` in its part in place of it (once, whichever reader comes
        first: readers run together)."""
        with self._open_lock:
            ids = block.ids
            if ids is None:
                return
            part.update(zip(ids, block.values(block.raw), strict=True))
            block.ids = None
            block.raw = b""
            self._opened += 1
            release = self.release if self._opened >= RELEASE_EVERY else None
            if release is not None:
                self._opened = 0
        if release is not None:
            release()

    def _open_all(self) -> None:
        """Open every pending block (before a reader that goes through the values)."""
        if self._pending:
            for block, part in self._pending:
                self._open(block, part)
            self._pending = []
            if self.release is not None and self._opened:
                self._opened = 0
                self.release()

    def get(self, message_id: str) -> Message | None:
        _, v = self._value(message_id)
        if v is None:
            return None
        return self.unpack(message_id, v)

    def _count(self, message_id: str, value: bytes | Message, sign: int) -> None:
        entry, body, meta = value_sizes(message_id, value)
        self._entry_bytes += sign * entry
        self._body_bytes += sign * body
        self._metadata_bytes += sign * meta
        if type(value) is not bytes or value[13] & META:
            self._others += sign

    def set(self, msg: Message) -> None:
        """Insert `msg` (a new id goes last) or replace the value of its id in place."""
        mid = msg.message_id
        part, old = self._value(mid)
        self._pristine = False
        if old is not None:
            self._count(mid, old, -1)
        value = self.pack(msg)
        (self._tail if part is None else part)[mid] = value
        self._count(mid, value, 1)

    def pop(self, message_id: str) -> Message | None:
        part, v = self._value(message_id)  # (its block opened first)
        if part is None or v is None:
            return None
        self._pristine = False
        del part[message_id]
        self._count(message_id, v, -1)
        return self.unpack(message_id, v)

    def clear(self) -> None:
        self._parts = []
        self._blocks = []
        self._tail = {}
        self._lows = []
        self._highs = []
        self._pending = []
        self._pristine = False
        self._entry_bytes = self._body_bytes = self._metadata_bytes = self._others = 0

    def recount(self) -> TableMemory:
        """Count what the table holds from scratch (after a bulk load; the store's check
        compares it with the running counts)."""
        self._open_all()
        size = sys.getsizeof
        entry = sum(map(size, self.iter_keys()))
        body = meta = plain = others = 0
        sizes = value_sizes
        for k, v in self._items():
            if type(v) is bytes and not v[13]:  # the common value: header + content
                plain += 1
                body += len(v)
                continue
            if type(v) is not bytes or v[13] & META:
                others += 1
            e, b, m = sizes(k, v)  # type: ignore[arg-type]
            entry += e - size(k)
            body += b
            meta += m
        entry += plain * (_BYTES_HEADER + HEAD_SIZE)
        body -= plain * HEAD_SIZE
        self._session_bytes = sum(size(s) for s in self._sessions if s)
        self._entry_bytes, self._body_bytes, self._metadata_bytes = entry, body, meta
        self._others = others
        return self.memory()

    def memory(self) -> TableMemory:
        size = sys.getsizeof
        sessions = size(self._sessions) + size(self._session_numbers) + self._session_bytes
        return TableMemory(
            entries=len(self),
            entry_bytes=self._entry_bytes,
            body_bytes=self._body_bytes,
            metadata_bytes=self._metadata_bytes,
            table_bytes=sum(map(size, self._parts)) + size(self._tail) + sessions,
        )

    def keys(self) -> KeysView[str]:
        return self.view.keys()

    def items(self) -> Iterator[tuple[str, Message]]:
        for m in self.values():
            yield m.message_id, m

    def values(self) -> Iterator[Message]:
        self._open_all()
        return self.materialize(self._items())  # type: ignore[arg-type]

    def values_passing(self) -> Iterator[Message]:
        """Every message in order, for a reader that goes through them once (a search while
        the search index builds): a pending block is split as it is reached and stays
        pending. `values` opens them all for good instead (~30 MiB at a million messages),
        which pays for a reader that comes back. Under the store's read lock (readers may
        open blocks meanwhile: each block's state is read under the table's lock)."""
        for part, block in zip(self._all(), [*self._blocks, None], strict=True):
            if block is not None:
                with self._open_lock:
                    ids, raw = block.ids, block.raw
                if ids is not None:  # pending
                    yield from self.materialize(zip(ids, block.values(raw), strict=True))
                    continue
            yield from self.materialize(part.items())  # type: ignore[arg-type]

    def materialize(self, pairs: Iterable[tuple[str, bytes | Message]]) -> Iterator[Message]:
        """The Messages of (id, value) pairs of this table: `unpack` inlined for the common
        value (no updated_at, default metadata), measured ~1.6x faster over a whole store."""
        unpack = self.unpack
        head = HEAD.unpack_from
        sessions = self._sessions
        roles = ROLES
        default = DEFAULT_METADATA
        new = _new
        s0, s1, s2, s3, s4, s5, s6, s7 = MESSAGE_SETTERS
        for k, v in pairs:
            if type(v) is bytes:
                ts, session, code, flags, rev = head(v)
                if not flags:
                    m = new(Message)
                    s0(m, k)
                    s1(m, sessions[session])
                    s2(m, ts)
                    s3(m, roles[code])
                    s4(m, v[HEAD_SIZE:].decode("utf-8"))
                    s5(m, rev)
                    s6(m, ts)
                    s7(m, default)
                    yield m
                    continue
            yield unpack(k, v)

    def with_metadata(self) -> Iterator[Message]:
        """The messages whose metadata is not the default, in order (the others have no
        relations, no summary, the default tier and kind)."""
        if not self._others:
            return iter(())
        return self.materialize(
            (k, v)  # type: ignore[misc]
            for k, v in self._items()
            # (a pending block holds plain values only: no metadata)
            if (
                v[13] & META
                if type(v) is bytes
                else type(v) is not _Block and v.metadata != DEFAULT_METADATA  # type: ignore[union-attr]
            )
        )

    def history_rows(self) -> Iterator[tuple[str, str, Metadata]]:
        """(message_id, session_id, metadata) of every message, in order, without building
        the Messages (what the history index is built from when `history_columns` is None)."""
        self._open_all()
        sessions = self._sessions
        session_at = _U32.unpack_from
        default = DEFAULT_METADATA
        unpack = self.unpack
        for k, v in self._items():
            if type(v) is bytes and not v[13] & META:
                yield k, sessions[session_at(v, 8)[0]], default
                continue
            m = unpack(k, v)  # type: ignore[arg-type]
            yield k, m.session_id, m.metadata

    def history_columns(self) -> tuple[Iterator[str], Iterator[int], list[str]] | None:
        """When every value is packed and none has metadata (so each message's metadata is
        the default): the message ids in order, their session numbers in step, and the
        session id of each number (for HistoryIndex.build_columns; not to be kept). None
        otherwise: then see history_rows. As loaded (nothing changed since), a block's
        numbers are read as they are, without opening it."""
        if self._others:
            return None
        if self._pristine:
            numbers: Iterator[int] = chain.from_iterable(
                [
                    block.sessions
                    if block is not None
                    else map(_FIRST, map(_SESSION_AT.unpack_from, part.values()))  # type: ignore[arg-type]
                    for part, block in zip(self._all(), [*self._blocks, None], strict=True)
                ]
            )
        else:
            packed: Iterator[bytes] = self._stored()  # type: ignore[assignment]
            numbers = map(_FIRST, map(_SESSION_AT.unpack_from, packed))
        return self.iter_keys(), numbers, self._sessions

    def frozen(self) -> FrozenMessages:
        """The messages live now, materialized only when iterated (the table may change
        meanwhile): 16 bytes per message instead of a Message each (the values held in parts
        of FROZEN_PART, which `FrozenMessages.take` lets go of as they are read).

        A block still pending is not opened: the snapshot holds its bytes as they are (the
        table's own, immutable: nothing more while the block stays pending) and splits them
        when a reader reaches it. Opening every block would turn each block's one buffer into
        a bytes object per message for the rest of the process's life: ~30 MiB at a million
        messages (docs/benchmarks.md, "The 1M rebuild start under 500 MiB")."""
        parts: list[_Part] = []
        with self._open_lock:  # no block opens halfway through (readers may run beside)
            for part, block in zip(self._all(), [*self._blocks, None], strict=True):
                if block is not None and block.ids is not None:  # pending: the whole part
                    parts.append(_Block(block.ids, block.raw, block.sessions))
                    continue
                values: Iterator[bytes | Message] = iter(part.values())  # type: ignore[arg-type]
                parts += [
                    list(islice(values, FROZEN_PART)) for _ in range(0, len(part), FROZEN_PART)
                ]
        return FrozenMessages(self, list(self.iter_keys()), parts)

    def rows(self) -> Iterator[list[Any]]:
        """The codec's message rows (codec.message_row) of every message, in order."""
        for m in self.values():
            yield message_row(m)

    # -- loading ------------------------------------------------------------------------------

    def _add_part(self, part: dict[str, _Value], block: _Block | None, low: str, high: str) -> None:
        """Append a loaded part whose ids are between `low` and `high` (routing by range
        while the parts' ranges are in order and apart)."""
        self._parts.append(part)
        self._blocks.append(block)
        lows = self._lows
        if lows is not None:
            if self._highs and low <= self._highs[-1]:
                self._lows = None
            else:
                lows.append(low)
                self._highs.append(high)

    def _row_part(self, message_id: str) -> dict[str, _Value]:
        """The part a loaded row goes into: the last part if it is a run of rows (its range
        widened to the id), else a new one."""
        if not self._blocks or self._blocks[-1] is not None:
            part: dict[str, _Value] = {}
            self._add_part(part, None, message_id, message_id)
            return part
        lows = self._lows
        if lows is not None:
            highs = self._highs
            if message_id > highs[-1]:
                highs[-1] = message_id
            elif message_id < lows[-1]:
                if len(highs) > 1 and message_id <= highs[-2]:
                    self._lows = None
                else:
                    lows[-1] = message_id
        return self._parts[-1]

    def check_unique(self) -> None:
        """After a load: ValueError when an id is in two parts (only possible when their
        ranges are not apart: then counted through a set)."""
        if self._lows is None and len(set(self.iter_keys())) != len(self):
            raise ValueError("a message id twice")

    def load_rows(self, rows: list[Any]) -> None:
        """Add the codec rows of one snapshot line, checking every field's type as
        codec.message_from_row does (TypeError/ValueError on anything else)."""
        numbers = self._session_numbers
        codes = _ROLE_CODES
        pack = HEAD.pack
        for row in rows:
            mid, sid, ts, role, content, rev, upd, md = row_fields(row)
            code = codes.get(role)
            if (
                md == 0
                and type(md) is int
                and upd == ts
                and code is not None
                and 0 <= rev <= _U32_MAX
                and _I64_MIN <= ts <= _I64_MAX
            ):
                try:
                    data = content.encode("utf-8")
                    n = numbers.get(sid)
                    if n is None:
                        sid.encode("utf-8")
                        n = self._session_number(sid)
                    self._row_part(mid)[mid] = pack(ts, n, code, 0, rev) + data
                    continue
                except UnicodeEncodeError:
                    pass
            self._row_part(mid)[mid] = self.pack(message_from_row(row))

    # -- the snapshot's binary rows (docs/storage-format.md, "Snapshot file") -----------------

    def prune_sessions(self) -> None:
        """Forget the session ids no live message uses any more (before a compaction writes
        the table out: a deleted message's session id is then gone from the files too). Their
        numbers stay, as empty placeholders: no value is renumbered, so a reader never sees a
        value and a session table that disagree."""
        used: set[int] = set()
        at = _U32.unpack_from
        for v in self._stored():
            if type(v) is bytes:
                used.add(at(v, 8)[0])
        sessions = self._sessions
        for n, sid in enumerate(sessions):
            if sid and n not in used:
                del self._session_numbers[sid]
                self._session_bytes -= sys.getsizeof(sid)
                sessions[n] = ""

    def binary_rows(self, batch: int, columns: bool = True, heads: bool = False) -> Iterator[bytes]:
        """The body of a snapshot in binary rows, in pieces of about `batch` bytes: first one
        row per session of the session table (in number order), then the messages in creation
        order: with `columns`, each run of plain values (no flags) as column blocks of up to
        BLOCK_ROWS rows (with `heads` (CMSNAP6) as HEAD_BLOCKs, a block still pending as it
        was loaded; else (CMSNAP5) as COLUMN_BLOCKs), the others one row each; without
        (CMSNAP4), one row per message: its packed value as it is, or, for a message kept as
        a `Message`, its codec row as JSON."""
        parts: list[bytes] = []
        size = 0
        row = ROW.pack
        raw_blocks = columns and heads
        if not raw_blocks:
            self._open_all()
        if columns:
            for at in range(0, len(self._sessions), BLOCK_ROWS):
                data = _SEPARATOR.join(
                    s.encode("utf-8") for s in self._sessions[at : at + BLOCK_ROWS]
                )
                parts.append(row(SESSION_BLOCK, len(data), 0))
                parts.append(data)
                size += ROW_SIZE + len(data)
        else:
            for sid in self._sessions:
                data = sid.encode("utf-8")
                parts.append(row(SESSION_ROW, len(data), 0))
                parts.append(data)
                size += ROW_SIZE + len(data)
        run_ids: list[bytes] = []
        run_values: list[bytes] = []
        for part, block in zip(self._all(), [*self._blocks, None], strict=True):
            if raw_blocks and block is not None:
                raw = block.raw
                ids = block.ids
                if ids is not None:  # pending: its part is whole, as it was loaded
                    if run_ids:
                        size += _write_run(parts, run_ids, run_values, heads)
                        run_ids, run_values = [], []
                    id_blob = _SEPARATOR.join(i.encode("utf-8") for i in ids)
                    parts.append(row(HEAD_BLOCK, len(id_blob), len(raw)))
                    parts.append(id_blob)
                    parts.append(raw)
                    size += ROW_SIZE + len(id_blob) + len(raw)
                    if size >= batch:
                        yield b"".join(parts)
                        parts, size = [], 0
                    continue
            for k, v in part.items():
                if size >= batch:
                    yield b"".join(parts)
                    parts, size = [], 0
                if type(v) is bytes:
                    try:
                        mid = k.encode("utf-8")
                    except UnicodeEncodeError:  # only from an old snapshot's JSON: kept as JSON
                        v = self.unpack(k, v)
                    else:
                        if columns and not v[13]:
                            run_ids.append(mid)
                            run_values.append(v)
                            if len(run_ids) == BLOCK_ROWS:
                                size += _write_run(parts, run_ids, run_values, heads)
                                run_ids, run_values = [], []
                            continue
                        if run_ids:
                            size += _write_run(parts, run_ids, run_values, heads)
                            run_ids, run_values = [], []
                        parts.append(row(PACKED_ROW, len(mid), len(v)))
                        parts.append(mid)
                        parts.append(v)
                        size += ROW_SIZE + len(mid) + len(v)
                        continue
                if run_ids:
                    size += _write_run(parts, run_ids, run_values, heads)
                    run_ids, run_values = [], []
                m: Message = v  # type: ignore[assignment]
                data = json.dumps(message_row(m), separators=(",", ":")).encode("ascii")
                parts.append(row(JSON_ROW, 0, len(data)))
                parts.append(data)
                size += ROW_SIZE + len(data)
        if run_ids:
            _write_run(parts, run_ids, run_values, heads)
        if parts:
            yield b"".join(parts)

    def load_binary(
        self,
        buf: bytes,
        pos: int,
        columns: bool = False,
        heads: bool = False,
        before_json: Callable[[], None] | None = None,
    ) -> int:
        """Add the complete binary rows of `buf[pos:]` (see `binary_rows`; column blocks only
        with `columns`: HEAD_BLOCKs with `heads`, else COLUMN_BLOCKs), checking each as the
        codec checks a record: the id and the content valid UTF-8, the session number one of
        the rows before, a known role and flags, the metadata a valid codec row. Counts what
        is added (`memory`). Returns the offset of the first row that is not complete in
        `buf`. ValueError, TypeError or struct.error on anything else. `before_json()` runs
        once before any JSON is decoded (the snapshot's body CRC is checked there)."""
        sessions = self._sessions
        n_sessions = len(sessions)
        row = ROW.unpack_from
        session_at = _U32.unpack_from
        n_roles = len(ROLES)
        size = sys.getsizeof
        end = len(buf)
        while end - pos >= ROW_SIZE:
            kind, a, b = row(buf, pos)
            start = pos + ROW_SIZE
            stop = start + a + b
            if stop > end:
                break
            if kind == HEAD_BLOCK and columns and heads:
                self._load_heads(buf, start, a, stop, n_sessions)
            elif kind == COLUMN_BLOCK and columns and not heads:
                self._load_columns(buf, start, a, stop, n_sessions)
            elif kind == SESSION_BLOCK and columns and not b:
                self._load_sessions(buf[start:stop])
                n_sessions = len(sessions)
            elif kind == PACKED_ROW:
                mid = buf[start : start + a].decode("utf-8")
                v = buf[start + a : stop]
                if b < HEAD_SIZE or session_at(v, 8)[0] >= n_sessions or v[12] >= n_roles:
                    raise ValueError("packed row: short, or session or role out of range")
                if v[13]:
                    if before_json is not None:
                        before_json()
                        before_json = None
                    _check_extras(v, v[13])
                else:
                    v[HEAD_SIZE:].decode("utf-8")
                self._row_part(mid)[mid] = v
                if v[13]:
                    self._count(mid, v, 1)
                else:
                    self._entry_bytes += size(mid) + _BYTES_HEADER + HEAD_SIZE
                    self._body_bytes += b - HEAD_SIZE
            elif kind == SESSION_ROW:
                if b:
                    raise ValueError("session row: unexpected value")
                sid = sys.intern(buf[start:stop].decode("utf-8"))
                if sid:
                    if sid in self._session_numbers:
                        raise ValueError("session row: a session id twice")
                    self._session_numbers[sid] = n_sessions
                    self._session_bytes += sys.getsizeof(sid)
                elif "" not in self._session_numbers:
                    # "" holds the number of a session pruned at a compaction, or is a real
                    # session id "" (the Store API takes it; the tools refuse it): the same
                    # text, so the first such number serves later writes of session "" (else
                    # each reopen that writes one would add a number)
                    self._session_numbers[""] = n_sessions
                sessions.append(sid)
                n_sessions += 1
            elif kind == JSON_ROW:
                if a:
                    raise ValueError("JSON row: unexpected id")
                if before_json is not None:
                    before_json()
                    before_json = None
                self.load_rows([loads(buf[start:stop].decode("utf-8"))])
                n_sessions = len(sessions)
                self._count(*next(reversed(self._parts[-1].items())), 1)  # type: ignore[arg-type]
            else:
                raise ValueError(f"unknown row kind {kind}")
            pos = stop
        return pos

    def _load_sessions(self, block: bytes) -> None:
        """Add a session block: its ids take the next numbers, each checked as a session row
        is (UTF-8, never a session id twice; the first "" serves later writes of "")."""
        sids = list(map(sys.intern, _split_text(block)))
        numbers = self._session_numbers
        base = len(self._sessions)
        before = len(numbers)
        empty = numbers.get("")
        named = list(filter(None, sids))
        numbers.update(zip(sids, range(base, base + len(sids)), strict=True))
        if len(named) < len(sids):  # an empty id: a pruned number's placeholder, or ""
            numbers[""] = base + sids.index("") if empty is None else empty
        if len(numbers) != before + len(named) + (empty is None and len(named) < len(sids)):
            raise ValueError("session block: a session id twice")
        sessions = self._sessions
        for sid in sids:  # one at a time: the list grows (and is counted) as with session rows
            sessions.append(sid)
        self._session_bytes += sum(map(sys.getsizeof, named))

    def _load_columns(
        self, buf: bytes, start: int, ids_length: int, stop: int, n_sessions: int
    ) -> None:
        """Add the column block `buf[start:stop]` (after its row header; the ids its first
        `ids_length` bytes): the ids split at their separators, checked in one decode; the
        values found in place by one regular expression that checks each as load_binary
        checks a packed row (`_values_pattern`)."""
        ids = buf[start : start + ids_length]
        keys = _split_text(ids)
        values = _values_pattern(n_sessions).findall(buf, start + ids_length, stop)
        n = len(values)
        if n != len(keys) or b"" in values:
            raise ValueError("column block: a value is not well formed, or not one per id")
        if sum(map(len, keys)) == len(ids) - (n - 1):  # ASCII ids
            key_bytes = n * _ASCII_STR + len(ids) - (n - 1)
        else:
            key_bytes = sum(map(sys.getsizeof, keys))
        part: dict[str, _Value] = dict(zip(keys, values, strict=True))
        self._add_part(part, None, min(keys), max(keys))
        self._entry_bytes += key_bytes + n * (_BYTES_HEADER + HEAD_SIZE)
        self._body_bytes += stop - start - ids_length - n * (HEAD_SIZE + 1)

    def _load_heads(
        self, buf: bytes, start: int, ids_length: int, stop: int, n_sessions: int
    ) -> None:
        """Add the HEAD_BLOCK `buf[start:stop]` (after its row header; the ids its first
        `ids_length` bytes) as a pending `_Block`, each row checked as load_binary checks a
        packed row, at C speed: the ids and the contents valid UTF-8 (each part is when the
        whole is with its separators made ASCII), one header and one content per id, every
        header's session number below `n_sessions`, a known role and no flags."""
        keys = _split_text(buf[start : start + ids_length])
        n = len(keys)
        end = n * HEAD_SIZE
        raw = buf[start + ids_length : stop]
        texts = raw[end:]
        if len(raw) < end or texts.count(_SEPARATOR) != n or not texts.endswith(_SEPARATOR):
            raise ValueError("column block: not one header and one content per id")
        texts.replace(_SEPARATOR, b"\n").decode("utf-8")
        if max(raw[12:end:HEAD_SIZE]) >= len(ROLES) or raw[13:end:HEAD_SIZE].count(0) != n:
            raise ValueError("column block: a role out of range, or flags")
        heads = memoryview(raw)[:end]
        sessions = array(_U32_ARRAY, map(_FIRST, _SESSION_OF_HEAD.iter_unpack(heads)))
        heads.release()
        if max(sessions) >= n_sessions:
            raise ValueError("column block: a session number out of range")
        if sum(map(len, keys)) == ids_length - (n - 1):  # ASCII ids
            key_bytes = n * _ASCII_STR + ids_length - (n - 1)
        else:
            key_bytes = sum(map(sys.getsizeof, keys))
        block = _Block(keys, raw, sessions)
        part: dict[str, _Value] = dict(zip(keys, repeat(block)))
        self._add_part(part, block, min(keys), max(keys))
        self._pending.append((block, part))
        self._entry_bytes += key_bytes + n * (_BYTES_HEADER + HEAD_SIZE)
        self._body_bytes += len(texts) - n


def _check_extras(value: bytes, flags: int) -> None:
    """The optional fields of a packed value with flags: present, and well formed."""
    if flags & ~(UPDATED | META):
        raise ValueError("packed row: unknown flags")
    at = HEAD_SIZE
    if flags & UPDATED:
        _I64.unpack_from(value, at)
        at += 8
    if flags & META:
        (n,) = _U32.unpack_from(value, at)
        at += 4
        if at + n > len(value):
            raise ValueError("packed row: metadata runs past the value")
        metadata_from_row(loads(value[at : at + n].decode("utf-8")))
        at += n
    value[at:].decode("utf-8")


def _split_text(data: bytes) -> list[str]:
    """The strings of UTF-8 pieces with 0xFF between two, each checked as valid UTF-8."""
    # each piece is valid if the whole is with its separators made ASCII
    text = data.replace(_SEPARATOR, b"\n").decode("utf-8")
    if b"\n" not in data:  # the common case: one decode, and the text split at "\n"
        return text.split("\n")
    # the separators decode to U+DCFF, and nothing else can (it is checked above)
    return data.decode("utf-8", "surrogateescape").split(_SEPARATOR_ESCAPED)


def _write_run(parts: list[bytes], ids: list[bytes], values: list[bytes], heads: bool) -> int:
    """Append a run of plain values: as a column block (a HEAD_BLOCK with `heads`, else a
    COLUMN_BLOCK), or as packed rows when it is short. Returns the bytes appended."""
    if len(ids) < _MIN_BLOCK:
        written = 0
        for mid, v in zip(ids, values, strict=True):
            parts.append(ROW.pack(PACKED_ROW, len(mid), len(v)))
            parts.append(mid)
            parts.append(v)
            written += ROW_SIZE + len(mid) + len(v)
        return written
    id_blob = _SEPARATOR.join(ids)
    if heads:
        rest = b"".join(
            [*(v[:HEAD_SIZE] for v in values), *(v[HEAD_SIZE:] + _SEPARATOR for v in values)]
        )
        parts.append(ROW.pack(HEAD_BLOCK, len(id_blob), len(rest)))
        parts.append(id_blob)
        parts.append(rest)
        return ROW_SIZE + len(id_blob) + len(rest)
    value_blob = _SEPARATOR.join(values) + _SEPARATOR
    parts.append(ROW.pack(COLUMN_BLOCK, len(id_blob), len(value_blob)))
    parts.append(id_blob)
    parts.append(value_blob)
    return ROW_SIZE + len(id_blob) + len(value_blob)


# Text that is valid UTF-8 as Python's decoder takes it (RFC 3629: no overlong forms, no
# surrogates, nothing past U+10FFFF): runs of ASCII, each after a multibyte character (the
# lookahead spares the alternatives at the end of the text).
_MULTIBYTE: Final = (
    rb"(?:[\xc2-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]|[\xe1-\xec\xee\xef][\x80-\xbf]{2}"
    rb"|\xed[\x80-\x9f][\x80-\xbf]|\xf0[\x90-\xbf][\x80-\xbf]{2}|[\xf1-\xf3][\x80-\xbf]{3}"
    rb"|\xf4[\x80-\x8f][\x80-\xbf]{2})"
)
UTF8_TEXT: Final = rb"[\x00-\x7f]*+(?:(?=[\xc2-\xf4])" + _MULTIBYTE + rb"[\x00-\x7f]*+)*+"
_patterns: dict[int, re.Pattern[bytes]] = {}


def below(limit: int) -> bytes:
    """A pattern matching the 4 bytes of a little-endian u32 below `limit`."""
    if limit > _U32_MAX:
        return rb"(?s:.{4})"
    digits = limit.to_bytes(4, "little")
    options = []
    for i in range(3, -1, -1):  # the most significant byte that differs from the limit's
        if digits[i]:
            lower = b"[\\x00-\\x%02x]" % (digits[i] - 1)
            same = b"".join(b"\\x%02x" % d for d in digits[i + 1 :])
            options.append(b"(?s:.{%d})" % i + lower + same)
    return b"(?:" + b"|".join(options) + b")" if options else rb"(?!)"


def _values_pattern(n_sessions: int) -> re.Pattern[bytes]:
    """The packed values of a column block, each followed by the separator: the header's
    session number below `n_sessions`, a known role, no flags, the content valid UTF-8.
    Anything else at a value's start matches the whole rest as an empty value (one failed
    attempt, never a scan from each later byte)."""
    pattern = _patterns.get(n_sessions)
    if pattern is None:
        roles = b"[\\x00-\\x%02x]" % (len(ROLES) - 1)
        value = rb".{8}" + below(n_sessions) + roles + rb"\x00.{4}" + UTF8_TEXT
        pattern = re.compile(rb"(?s)(" + value + rb")\xff|.+")
        if len(_patterns) >= 16:
            _patterns.clear()
        _patterns[n_sessions] = pattern
    return pattern


FROZEN_PART: Final = 4096
"""Values per part of a `FrozenMessages` (32 KiB of references: the C heap reuses a part
freed by `take`'s reader for what that reader makes next)."""


_Part = list[bytes | Message] | _Block
"""A part of a `FrozenMessages`: up to FROZEN_PART values, or a pending block (split when
reached)."""


def _part_values(part: _Part) -> list[bytes | Message]:
    return part.values(part.raw) if type(part) is _Block else part  # type: ignore[return-value]


def _drained(parts: list[_Part]) -> Iterator[bytes | Message]:
    """The values of `parts` in order, each part dropped (from `parts` too) once read."""
    parts.reverse()
    while parts:
        yield from _part_values(parts.pop())


class FrozenMessages(Collection[Message]):
    """The values of a table at one moment: iterable (any number of times) and sized, or
    taken once (`take`) by a reader that lets go of them as it goes."""

    __slots__ = ("_keys", "_parts", "_table")

    def __init__(self, table: MessageTable, keys: list[str], parts: list[_Part]) -> None:
        self._table = table
        self._keys = keys
        self._parts = parts  # the values, FROZEN_PART at a time or a pending block's bytes

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[Message]:
        values = chain.from_iterable(map(_part_values, self._parts))
        return self._table.materialize(zip(self._keys, values, strict=True))

    def take(self) -> tuple[list[str], Iterator[Message]]:
        """The message ids in order (a list the caller may keep, e.g. as a search index's id
        table, instead of a copy) and the messages, built as the iterator reaches them; each
        part of the snapshot's values goes once the iterator has passed it (a build that
        reads a million messages holds ~8 MiB less by its end). The snapshot is empty after.
        """
        keys = self._keys
        parts = self._parts
        self._keys = []
        self._parts = []
        return keys, self._table.materialize(zip(keys, _drained(parts), strict=True))

    def __contains__(self, item: object) -> bool:
        return any(m == item for m in self)


class MessagesView(Mapping[str, Message]):
    """A read-only live view of a MessageTable as {message_id: Message}, in creation order."""

    __slots__ = ("_table",)

    def __init__(self, table: MessageTable) -> None:
        self._table = table

    def __getitem__(self, message_id: str) -> Message:
        m = self._table.get(message_id)
        if m is None:
            raise KeyError(message_id)
        return m

    def get(self, message_id: str, default: Any = None) -> Any:
        m = self._table.get(message_id)
        return default if m is None else m

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._table

    def __len__(self) -> int:
        return len(self._table)

    def __iter__(self) -> Iterator[str]:
        return self._table.iter_keys()

    def max_id(self) -> str | None:
        return self._table.max_id()

    def values(self) -> ValuesView[Message]:
        return _Values(self)

    def frozen(self) -> FrozenMessages:
        """The live messages at this moment, built when iterated (see MessageTable.frozen)."""
        return self._table.frozen()

    def with_metadata(self) -> Iterator[Message]:
        return self._table.with_metadata()

    def history_rows(self) -> Iterator[tuple[str, str, Metadata]]:
        return self._table.history_rows()

    def history_columns(self) -> tuple[Iterator[str], Iterator[int], list[str]] | None:
        return self._table.history_columns()

    def memory(self) -> TableMemory:
        return self._table.memory()

    def items(self) -> ItemsView[str, Message]:
        return _Items(self)

    def values_passing(self) -> Iterator[Message]:
        """See MessageTable.values_passing (pending blocks left pending)."""
        return self._table.values_passing()


class _Values(ValuesView[Message]):
    __slots__ = ()
    _mapping: MessagesView

    def __iter__(self) -> Iterator[Message]:
        return self._mapping._table.values()


class _Items(ItemsView[str, Message]):
    __slots__ = ()
    _mapping: MessagesView

    def __iter__(self) -> Iterator[tuple[str, Message]]:
        return self._mapping._table.items()
