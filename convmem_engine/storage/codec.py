"""The storage layer's own message schema (format 3): how a Message is stored in a log record's
payload and in a snapshot row. Owned here, versioned with the format, independent of the tools'
JSON (`Message.to_json()`): adding a field to a tool result cannot change the bytes on disk.

A message is one compact UTF-8 JSON array (`separators=(",", ":")`, `ensure_ascii=False`):

    [message_id, session_id, timestamp, role, content, revision, updated_at, metadata]

    metadata = 0                                    the default metadata
             | [tool_call_id | null, [tag, ...], memory_tier, memory_kind, importance,
                summary | null, [[relation_type, message_id], ...], [source_message_id, ...]]

Positions, not names: a schema change is a format version change (docs/storage-format.md),
and the arrays are smaller and faster to decode than objects. Decoding a log payload checks
every type (`ValueError`/`TypeError` on anything else); snapshot rows, whose CRC was checked
first, are built by `message_from_row` too.
"""

from __future__ import annotations

import dataclasses
import json
import json.scanner
import sys
from typing import Any, Final

from convmem_engine.domain import compact_json
from convmem_engine.domain.message import DEFAULT_METADATA, Message, Metadata, Relation

# Build Message values without the frozen dataclass __init__ (one object.__setattr__ per
# field): the slot descriptors set the same fields directly, measured ~2x faster on open.
MESSAGE_FIELDS: Final = tuple(f.name for f in dataclasses.fields(Message))
assert MESSAGE_FIELDS == (
    "message_id",
    "session_id",
    "timestamp",
    "role",
    "content",
    "revision",
    "updated_at",
    "metadata",
), "the row schema and the fast Message builders follow Message's field order"
MESSAGE_SETTERS: Final = tuple(getattr(Message, name).__set__ for name in MESSAGE_FIELDS)
_S0, _S1, _S2, _S3, _S4, _S5, _S6, _S7 = MESSAGE_SETTERS

METADATA_FIELDS: Final = tuple(f.name for f in dataclasses.fields(Metadata))
assert METADATA_FIELDS == (
    "tool_call_id",
    "tags",
    "memory_tier",
    "memory_kind",
    "importance",
    "summary",
    "relations",
    "source_message_ids",
), "the metadata row follows Metadata's field order: a change here is a format change"

# The C scanner behind json.loads, without loads' encoding detection and wrappers; it refuses
# NaN/Infinity (never written by us) through parse_constant.


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a stored value")


_DECODER: Final = json.JSONDecoder(parse_constant=_no_constant)
_scan_once: Final = json.scanner.make_scanner(_DECODER)  # type: ignore[arg-type]
loads: Final = _DECODER.decode


def metadata_row(md: Metadata) -> Any:
    """0 for the default metadata, else its positional array."""
    if md is DEFAULT_METADATA or md == DEFAULT_METADATA:
        return 0
    return [
        md.tool_call_id,
        list(md.tags),
        md.memory_tier,
        md.memory_kind,
        md.importance,
        md.summary,
        [[r.type, r.message_id] for r in md.relations],
        list(md.source_message_ids),
    ]


def message_row(m: Message) -> list[Any]:
    return [
        m.message_id,
        m.session_id,
        m.timestamp,
        m.role,
        m.content,
        m.revision,
        m.updated_at,
        metadata_row(m.metadata),
    ]


def encode_message(m: Message) -> bytes:
    """The record payload of a PUT/UPDATE. Raises UnicodeEncodeError on lone surrogates."""
    return compact_json.dumps(message_row(m)).encode("utf-8")


def _strs(value: Any) -> tuple[str, ...]:
    if type(value) is not list or not all(type(v) is str for v in value):
        raise TypeError("expected a list of strings")
    return tuple(value)


def metadata_from_row(row: Any) -> Metadata:
    """Metadata from its stored form (0 or the positional array); TypeError/ValueError if not."""
    if row == 0 and type(row) is int:
        return DEFAULT_METADATA
    if type(row) is not list:
        raise TypeError("metadata must be 0 or an array")
    tool_call_id, tags, tier, kind, importance, summary, relations, sources = row
    if (
        (tool_call_id is not None and type(tool_call_id) is not str)
        or type(tier) is not str
        or type(kind) is not str
        or type(importance) is not int
        or (summary is not None and type(summary) is not str)
        or type(relations) is not list
    ):
        raise TypeError("metadata field has the wrong type")
    rels = []
    for r in relations:
        if type(r) is not list or len(r) != 2 or type(r[0]) is not str or type(r[1]) is not str:
            raise TypeError("relation must be [type, message_id]")
        rels.append(Relation(r[0], r[1]))
    md = Metadata(
        tool_call_id=tool_call_id,
        tags=_strs(tags),
        memory_tier=sys.intern(tier),
        memory_kind=sys.intern(kind),
        importance=importance,
        summary=summary,
        relations=tuple(rels),
        source_message_ids=_strs(sources),
    )
    return DEFAULT_METADATA if md == DEFAULT_METADATA else md


def row_fields(row: Any) -> tuple[str, str, int, str, str, int, int, Any]:
    """A stored message row's eight fields, every scalar's type checked (the metadata row is
    read by `metadata_from_row`); TypeError/ValueError when the row is not one."""
    if type(row) is not list:
        raise TypeError("a message row must be an array")
    mid, sid, ts, role, content, rev, upd, md = row
    if not (
        type(mid) is str
        and type(sid) is str
        and type(ts) is int
        and type(role) is str
        and type(content) is str
        and type(rev) is int
        and type(upd) is int
    ):
        raise TypeError("message field has the wrong type")
    return mid, sid, ts, role, content, rev, upd, md


def message_from_row(row: Any) -> Message:
    """A Message from its stored row; TypeError/ValueError when the row is not one."""
    mid, sid, ts, role, content, rev, upd, md = row_fields(row)
    m: Message = object.__new__(Message)
    _S0(m, mid)
    _S1(m, sys.intern(sid))
    _S2(m, ts)
    _S3(m, sys.intern(role))
    _S4(m, content)
    _S5(m, rev)
    _S6(m, ts if upd == ts else upd)  # one int object when equal
    _S7(m, DEFAULT_METADATA if md == 0 and type(md) is int else metadata_from_row(md))
    return m


def decode_message(payload: bytes) -> Message:
    """A PUT/UPDATE payload back to its Message. Raises ValueError/TypeError (UnicodeDecodeError
    is a ValueError) on anything that is not exactly one stored message row."""
    text = payload.decode("utf-8")
    try:
        row, end = _scan_once(text, 0)
    except StopIteration as e:
        raise ValueError("payload is not JSON") from e
    if end != len(text):
        raise ValueError("payload is not one JSON value")
    return message_from_row(row)
