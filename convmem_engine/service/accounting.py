"""`memory_estimate`: the project's main allocations, from the real Python objects.

Method (documented in docs/semantics.md): `sys.getsizeof` of the objects themselves, summed
once per message when it enters or leaves the store's live state (so a health call costs
nothing per message), plus the containers of each index measured when asked. Objects shared by
many messages (the default Metadata, the empty tuple, interned enum strings) are not counted;
runtime and allocator overhead are not included, as the seed says.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from convmem_engine.domain.message import DEFAULT_METADATA, Message, Metadata

_size = sys.getsizeof


def entry_bytes(msg: Message) -> int:
    """The store's per-message record: the Message object, its id, session, role, times."""
    return (
        _size(msg)
        + _size(msg.message_id)
        + _size(msg.session_id)
        + _size(msg.timestamp)
        + _size(msg.updated_at)
    )


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
    """Bytes of a CPython dict holding `entries` keys (the store's id -> Message table)."""
    return _size(dict.fromkeys(range(entries)))


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

    def clear(self) -> None:
        self.entries = self.entry_bytes = self.body_bytes = self.metadata_bytes = 0
