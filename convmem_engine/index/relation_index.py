"""Incoming relations: for each target id, the live messages whose metadata relates to it.

Outgoing relations are read from the message itself (`metadata.relations`); this index answers
the other direction. Entries are `(source_id, type)` kept sorted, so incoming relations come out
in the source's creation order, then by type name. Targets need not be live: a relation to a
deleted message stays indexed while its source lives.

Derived state only; not thread-safe by itself (the service guards it).
"""

from __future__ import annotations

import sys
from bisect import bisect_left
from collections.abc import Iterable
from typing import Final

from convmem_engine.domain.message import Message

_ENTRY: Final = sys.getsizeof(("", ""))  # one (source_id, type) pair
_LIST_GC: Final = sys.getsizeof([]) - [].__sizeof__()  # sys.getsizeof's addition to __sizeof__


class RelationIndex:
    def __init__(self) -> None:
        self._incoming: dict[str, list[tuple[str, str]]] = {}
        # Bytes of every entry list and its pairs, kept up to date by every change (health
        # reads the index's size without walking it).
        self._counted = 0

    def clear(self) -> None:
        self._incoming = {}
        self._counted = 0

    def build(self, messages: Iterable[Message]) -> None:
        self.clear()
        for msg in messages:
            if msg.metadata.relations:
                self.add(msg)

    def add(self, msg: Message) -> None:
        for rel in msg.metadata.relations:
            entries = self._incoming.get(rel.message_id)
            if entries is None:
                entries = self._incoming[rel.message_id] = [(msg.message_id, rel.type)]
                self._counted += entries.__sizeof__() + _LIST_GC + _ENTRY
            else:
                entry = (msg.message_id, rel.type)
                i = bisect_left(entries, entry)
                if i == len(entries) or entries[i] != entry:
                    before = entries.__sizeof__()
                    entries.insert(i, entry)
                    self._counted += entries.__sizeof__() - before + _ENTRY

    def remove(self, msg: Message) -> None:
        for rel in msg.metadata.relations:
            entries = self._incoming.get(rel.message_id)
            if entries is None:
                continue
            entry = (msg.message_id, rel.type)
            i = bisect_left(entries, entry)
            before = entries.__sizeof__()
            if i < len(entries) and entries[i] == entry:
                del entries[i]
                self._counted -= _ENTRY
            if not entries:
                del self._incoming[rel.message_id]
                self._counted -= before + _LIST_GC
            else:
                self._counted += entries.__sizeof__() - before

    def replace(self, old: Message, new: Message) -> None:
        if old.metadata.relations != new.metadata.relations:
            self.remove(old)
            self.add(new)

    def incoming(self, target_id: str) -> list[tuple[str, str]]:
        """`(source_id, type)` pairs of live messages relating to `target_id` (a copy)."""
        return list(self._incoming.get(target_id, ()))

    def incoming_count(self, target_id: str) -> int:
        return len(self._incoming.get(target_id, ()))

    def same_as(self, other: RelationIndex) -> bool:
        return self._incoming == other._incoming

    def target_count(self) -> int:
        return len(self._incoming)

    def memory_bytes(self) -> int:
        """sys.getsizeof of the index's objects (ids are the store's): constant time, the
        entry lists' part kept up to date by every change; `memory_bytes_fresh` walks."""
        return sys.getsizeof(self) + sys.getsizeof(self._incoming) + self._counted

    def memory_bytes_fresh(self) -> int:
        """`memory_bytes` by walking every entry (the reference)."""
        total = sys.getsizeof(self) + sys.getsizeof(self._incoming)
        for entries in self._incoming.values():
            total += sys.getsizeof(entries)
            total += sum(sys.getsizeof(e) for e in entries)
        return total
