"""Reading format 2, only to upgrade a store to the current format (docs/storage-format.md).

Format 2 stored a PUT/UPDATE payload as the compact JSON object of the tool result's Message
(`Message.to_json()` as it was then). Its keys are frozen here, independent of today's
`to_json()`: this module reads what format 2 wrote, nothing else, and nothing writes it.
Snapshots of format 2 (`CMSNAP2\\n`) are never loaded: their meta only proves how far the log
was durable (see store.py), and the upgrade writes a new snapshot.
"""

from __future__ import annotations

from typing import Any, Final

from convmem_engine.domain.message import DEFAULT_METADATA, Message
from convmem_engine.storage.codec import loads, message_from_row

FORMAT: Final = 2
_META_KEYS: Final = frozenset(
    (
        "tool_call_id",
        "tags",
        "memory_tier",
        "memory_kind",
        "importance",
        "summary",
        "relations",
        "source_message_ids",
    )
)


def _metadata_row(d: Any) -> Any:
    """A format 2 metadata object as the current codec's metadata row (0 for the default)."""
    if d is None:
        return 0
    if type(d) is not dict or not set(d) <= _META_KEYS:
        raise TypeError("format 2 metadata must be an object of the known fields")
    default = DEFAULT_METADATA
    relations = d.get("relations", [])
    if type(relations) is not list:
        raise TypeError("format 2 relations must be an array")
    rels = []
    for r in relations:
        if type(r) is not dict:
            raise TypeError("format 2 relation must be an object")
        rels.append([r["type"], r["message_id"]])
    return [
        d.get("tool_call_id"),
        d.get("tags", list(default.tags)),
        d.get("memory_tier", default.memory_tier),
        d.get("memory_kind", default.memory_kind),
        d.get("importance", default.importance),
        d.get("summary"),
        rels,
        d.get("source_message_ids", list(default.source_message_ids)),
    ]


def decode_message_v2(payload: bytes) -> Message:
    """A format 2 PUT/UPDATE payload. Raises ValueError/TypeError/KeyError if it is not one."""
    d = loads(payload.decode("utf-8"))
    if type(d) is not dict:
        raise TypeError("format 2 payload must be a JSON object")
    row = [
        d["message_id"],
        d["session_id"],
        d["timestamp"],
        d["role"],
        d["content"],
        d["revision"],
        d["updated_at"],
        _metadata_row(d.get("metadata")),
    ]
    return message_from_row(row)


__all__ = ["FORMAT", "decode_message_v2"]
