"""ConvMem's own JSON Lines export: lossless, one message a line.

Line 1 is a header `{"convmem_export": 1, "exported_at": <ms>}` (optional on import); every
other line is one message exactly as the tools return it (`Message.to_json()`: id, session,
timestamp, role, content, revision, updated_at, metadata). Importing stores each message with
the same id, times, revision and metadata; a message whose id is already live is left as it is
(re-importing adds nothing). Every field is checked with the tools' own validation; a bad line
is reported by its number.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, Any, Final

from convmem_engine.domain import limits
from convmem_engine.domain import validation as v
from convmem_engine.domain.errors import ValidationError
from convmem_engine.domain.message import Message
from convmem_engine.transfer.records import Skip

SOURCE: Final = "jsonl"
HEADER_KEY: Final = "convmem_export"
EXPORT_VERSION: Final = 1
MESSAGE_KEYS: Final = frozenset(
    ("message_id", "session_id", "timestamp", "role", "content", "revision", "updated_at")
)
_MAX_MS: Final = (1 << 48) - 1
# A line holds at most 1 MiB of content and 1 MiB of metadata, JSON-escaped (up to 6x).
MAX_LINE_BYTES: Final = 16 * limits.MIB


def looks_like(first: object) -> bool:
    return isinstance(first, dict) and (HEADER_KEY in first or MESSAGE_KEYS.issubset(first.keys()))


def message_from_json(data: object) -> Message:
    """A message from its `to_json()` form, every field validated (ValidationError)."""
    if not isinstance(data, dict):
        raise ValidationError("line: must be a JSON object")
    missing = sorted(MESSAGE_KEYS - data.keys())
    if missing:
        raise ValidationError(f"{missing[0]}: is required")
    unknown = sorted(data.keys() - MESSAGE_KEYS - {"metadata"})
    if unknown:
        raise ValidationError("line: has a field that is not part of a message")
    mid = v.message_id(data["message_id"])
    sid = v.session_id(data["session_id"])
    role = v.role(data["role"])
    content = v.content(data["content"])
    timestamp = v.integer(data["timestamp"], "timestamp", lo=0, hi=_MAX_MS)
    revision = v.integer(data["revision"], "revision", lo=1)
    updated_at = v.integer(data["updated_at"], "updated_at", lo=0, hi=_MAX_MS)
    md: Any = data.get("metadata", {})
    if not isinstance(md, dict):
        raise ValidationError("metadata: must be an object")
    metadata = v.metadata_json(json.dumps(md), "metadata").apply()
    return Message(mid, sid, timestamp, role, content, revision, updated_at, metadata)


class JsonlSource:
    """Items of one ConvMem JSONL file, read line by line; progress counts bytes."""

    name = SOURCE

    def __init__(self, stream: IO[bytes], size: int) -> None:
        self._stream = stream
        self.total = size

    def items(self) -> Iterator[tuple[int, Message | Skip]]:
        done = 0
        seen: dict[str, int] = {}
        for n, raw in enumerate(self._stream, 1):
            done += len(raw)
            pos = f"line {n}"
            if not raw.strip():
                continue
            try:
                data = json.loads(raw)
            except (ValueError, RecursionError):
                yield done, Skip(pos, "not valid JSON (or not UTF-8)")
                continue
            if n == 1 and isinstance(data, dict) and HEADER_KEY in data:
                if data.get(HEADER_KEY) != EXPORT_VERSION:
                    yield done, Skip(pos, f"{HEADER_KEY}: must be {EXPORT_VERSION}")
                continue
            try:
                msg = message_from_json(data)
            except ValidationError as e:
                yield done, Skip(pos, f"{e.message}; not imported")
                continue
            first = seen.get(msg.message_id)
            if first is not None:
                yield done, Skip(pos, f"message_id: duplicate of line {first}")
                continue
            seen[msg.message_id] = n
            yield done, msg


def header_line(exported_at: int) -> bytes:
    return json.dumps({HEADER_KEY: EXPORT_VERSION, "exported_at": exported_at}).encode() + b"\n"


def message_line(message: dict[str, Any]) -> bytes:
    """One line of readable UTF-8; U+2028/U+2029 escaped (some readers split lines there)."""
    text = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return text.encode() + b"\n"
