"""What every import source produces: ready messages, skipped records, and stable ids.

An imported message's id is derived from its source, so importing the same file twice (or
again after an interrupted run) finds the same ids and stores nothing twice:
the id's 48-bit time is the message's original time in UTC milliseconds (bumped by 1 ms where
two messages of one conversation share a millisecond, so history keeps the original order), and
its 80 random bits are the first 80 bits of SHA-256 of the record's identity in its source
(source name, conversation id, message id). The message's `timestamp` keeps the original time
unchanged.

Positions ("conversation 3, message 12", "line 40") name where a record is in the file and never
repeat its content.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from ulid import ULID

from convmem_engine.domain import limits
from convmem_engine.domain import validation as v
from convmem_engine.domain.errors import ValidationError
from convmem_engine.domain.message import DEFAULT_IMPORTANCE, Message, Metadata, Relation

RANDOM_BITS: Final = 80
_MAX_MS: Final = (1 << 48) - 1


class ImportFormatError(ValidationError):
    """The file is not in the expected format at all (nothing can be imported from it)."""


@dataclass(frozen=True, slots=True)
class Skip:
    """A record that will not be stored, where it is and why."""

    position: str
    reason: str


class ConversationsSource:
    """A `conversations.json` of a chat export (a JSON array of conversations): its items
    conversation by conversation, progress counting conversations. A subclass names its source
    and turns one conversation into messages and skips (`_conversation`)."""

    name: str

    def __init__(self, data: object) -> None:
        if not isinstance(data, list):
            raise ImportFormatError("conversations.json: must be a JSON array of conversations")
        self._data: list[Any] = data
        self.total = len(data)

    def items(self) -> Iterator[tuple[int, Message | Skip]]:
        for ci, conv in enumerate(self._data, 1):
            for item in self._conversation(ci, conv):
                yield ci - 1, item

    def _conversation(self, ci: int, conv: object) -> Iterator[Message | Skip]:
        raise NotImplementedError


def identity_bits(*parts: str) -> int:
    """The 80 random bits of an imported message's id, from its identity in the source."""
    digest = hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[: RANDOM_BITS // 8], "big")


def random_bits_of(message_id: str) -> int:
    return int.from_bytes(ULID.from_str(message_id).bytes, "big") & ((1 << RANDOM_BITS) - 1)


_CROCKFORD: Final = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def make_id(id_ms: int, bits: int) -> str:
    """The canonical ULID text of (48-bit milliseconds, 80 random bits)."""
    value = (clamp_ms(id_ms) << RANDOM_BITS) | bits
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


def clamp_ms(ms: int) -> int:
    return min(max(ms, 0), _MAX_MS)


def valid_tags(*tags: str) -> tuple[str, ...]:
    """The tags that pass the tag rules (a too-long tool name is simply not tagged)."""
    out: list[str] = []
    for t in tags:
        try:
            out.append(v.tag(t, "tags"))
        except ValidationError:
            continue
    return tuple(dict.fromkeys(out))[: limits.TAGS_MAX_ITEMS]


def fitting_summary(text: str | None) -> str | None:
    """A title or label as `metadata.summary` when it fits the limit, else None."""
    if not text or not text.strip():
        return None
    try:
        return v.text(text, "summary", min_bytes=1, max_bytes=limits.SUMMARY_MAX_BYTES)
    except ValidationError:
        return None


def build_message(
    position: str,
    *,
    message_id: str,
    session_id: str,
    role: str,
    content: str,
    timestamp: int,
    updated_at: int | None = None,
    tags: tuple[str, ...] = (),
    memory_tier: str = "short",
    memory_kind: str = "conversation",
    summary: str | None = None,
    relations: tuple[Relation, ...] = (),
) -> Message | Skip:
    """A validated message, or why the record cannot be stored (never shortened silently)."""
    if not content.strip():
        return Skip(position, "empty message (no text)")
    try:
        sid = v.session_id(session_id)
        text = v.content(content)
    except ValidationError as e:
        return Skip(position, f"{e.message}; not imported (nothing is shortened)")
    ts = clamp_ms(timestamp)
    metadata = Metadata(
        tags=tags,
        memory_tier=memory_tier,
        memory_kind=memory_kind,
        importance=DEFAULT_IMPORTANCE,
        summary=summary,
        relations=relations,
    )
    return Message(
        message_id, sid, ts, role, text, 1, max(ts, clamp_ms(updated_at or ts)), metadata
    )
