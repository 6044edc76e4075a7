"""The response budget (~8 MiB), measured on the serialized result JSON.

`result_json()` is THE serialization of a tool result (the MCP layer puts exactly this text in
`TextContent.text`), so the budget counts the bytes a host receives: compact separators,
UTF-8, non-ASCII characters unescaped.
"""

from __future__ import annotations

from typing import Any

from convmem_engine.domain import compact_json, limits
from convmem_engine.domain.message import Message


def result_json(result: Any) -> str:
    return compact_json.dumps(result)


def json_bytes(value: Any) -> int:
    return len(result_json(value).encode("utf-8"))


_ESCAPE_MAX = 6  # one code point serializes to at most 6 bytes ("\u001f"; others ≤ 4 bytes)
_MESSAGE_FIXED = 512  # keys, punctuation, numbers, enums of a Message object
_PER_ITEM = 64  # one tag's / relation's / source id's punctuation, or a relation object


def message_bound(msg: Message) -> int:
    """An upper bound on `json_bytes(msg.to_json())`, without serializing."""
    md = msg.metadata
    chars = len(msg.content) + len(msg.session_id)
    if md.summary is not None:
        chars += len(md.summary)
    if md.tool_call_id is not None:
        chars += len(md.tool_call_id)
    for tag in md.tags:
        chars += len(tag)
    items = len(md.tags) + len(md.relations) + len(md.source_message_ids)
    return _ESCAPE_MAX * chars + _PER_ITEM * items + _MESSAGE_FIXED


def text_bound(text: str) -> int:
    return _ESCAPE_MAX * len(text) + 2


class Budget:
    """Adds items to a JSON array until the next one would pass the budget.

    The first item is always taken (every item fits: content is at most 1 MiB, so the biggest
    message serializes to well under 8 MiB even with every character escaped), so a page always
    makes progress.

    Exact but cheap: while the sum of upper bounds (`bound`, when the caller gives one) stays
    within the limit, nothing is serialized; from the item that would pass it on, the items
    taken so far and every later one are measured exactly.
    """

    def __init__(self, reserved: int, limit: int = limits.RESPONSE_BUDGET_BYTES) -> None:
        self.used = reserved  # an upper bound until `exact`, then the exact size
        self.limit = limit
        self.count = 0
        self._reserved = reserved
        self._exact = False
        self._taken: list[Any] = []

    def take(self, item: Any, bound: int | None = None) -> bool:
        sep = 1 if self.count else 0  # "," between items
        if not self._exact:
            if bound is not None and self.used + bound + sep <= self.limit:
                self.used += bound + sep
                self.count += 1
                self._taken.append(item)
                return True
            self._exact = True
            self.used = self._reserved + sum(json_bytes(x) + 1 for x in self._taken)
            self.used -= 1 if self._taken else 0
            self._taken = []
        size = json_bytes(item) + sep
        if self.count and self.used + size > self.limit:
            return False
        self.used += size
        self.count += 1
        return True
