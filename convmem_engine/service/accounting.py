"""`memory_estimate`: the project's main allocations, from the real Python objects.

Method (documented in docs/semantics.md): `sys.getsizeof` of the objects themselves, summed
over every live message on the first health call, then kept up to date as messages enter and
leave the live state (so open pays nothing and later health calls nothing per message), plus
the containers of each index measured when asked. Objects shared by
many messages (the default Metadata, the empty tuple, interned enum strings) are not counted;
runtime and allocator overhead are not included, as the seed says.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass

from convmem_engine.domain.message import DEFAULT_METADATA, Message, Metadata

_size = sys.getsizeof


def entry_bytes(msg: Message) -> int:
    """The store's per-message record: the Message object, its id and its times. Session ids
    are shared by a session's messages (the store interns them): counted once per session by
    `session_ids_bytes`. An `updated_at` that is the same int object as `timestamp` is counted
    once."""
    n = _size(msg) + _size(msg.message_id) + _size(msg.timestamp)
    if msg.updated_at is not msg.timestamp:
        n += _size(msg.updated_at)
    return n


def session_ids_bytes(session_ids: Iterable[str]) -> int:
    return sum(_size(s) for s in session_ids)


def body_bytes(msg: Message) -> int:
    return _size(msg.content)


def metadata_bytes(md: Metadata) -> int:
    if md is DEFAULT_METADATA:
        return 0
    n = _size(md)
    if md.tool_call_id is not None:
        n += _size(md.tool_call_id)
    if md.summary is not None:
        n += _size(md.summary)
    if md.tags:
        n += _size(md.tags) + sum(_size(t) for t in md.tags)
    if md.relations:
        n += _size(md.relations)
        n += sum(_size(r) + _size(r.message_id) for r in md.relations)
    if md.source_message_ids:
        n += _size(md.source_message_ids) + sum(_size(s) for s in md.source_message_ids)
    return n


def dict_table_bytes(entries: int) -> int:
    """Bytes of a CPython dict holding `entries` keys (the store's id -> Message table), from
    CPython's layout: the smallest power-of-two index table whose usable two thirds hold the
    entries, 1/2/4/8-byte indices by table size, 24-byte entries, 96 bytes of headers. Matches
    `sys.getsizeof` of a dict grown to that size (checked in tests) without building one."""
    if entries <= 0:
        return _size({})
    size = 8
    while (size * 2) // 3 < entries:
        size *= 2
    index = 1 if size <= 0xFF else 2 if size <= 0xFFFF else 4 if size <= 0xFFFFFFFF else 8
    return 96 + size * index + ((size * 2) // 3) * 24


@dataclass(slots=True)
class MessageAccounting:
    entries: int = 0
    entry_bytes: int = 0
    body_bytes: int = 0
    metadata_bytes: int = 0

    def add(self, msg: Message) -> None:
        self.entries += 1
        self.entry_bytes += entry_bytes(msg)
        self.body_bytes += body_bytes(msg)
        self.metadata_bytes += metadata_bytes(msg.metadata)

    def remove(self, msg: Message) -> None:
        self.entries -= 1
        self.entry_bytes -= entry_bytes(msg)
        self.body_bytes -= body_bytes(msg)
        self.metadata_bytes -= metadata_bytes(msg.metadata)
