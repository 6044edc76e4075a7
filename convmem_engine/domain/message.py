"""Immutable message values: what the store persists and what every tool returns.

A `Message` is never changed in place: an update produces a new value with `revision + 1`.
`to_json()` gives exactly the Message object of the tool reference (seed 000): `tool_call_id`
and `summary` are omitted when unset; every other metadata field is always present.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

ROLES: Final = ("user", "assistant", "system")
MEMORY_TIERS: Final = ("short", "mid", "long", "discard")
MEMORY_KINDS: Final = ("conversation", "episode", "semantic", "procedure", "preference", "summary")
RELATION_TYPES: Final = ("depends_on", "derived_from", "supersedes", "related_to")

DEFAULT_TIER: Final = "short"
DEFAULT_KIND: Final = "conversation"
DEFAULT_IMPORTANCE: Final = 50


@dataclass(frozen=True, slots=True)
class Relation:
    type: str
    message_id: str

    def to_json(self) -> dict[str, str]:
        return {"type": self.type, "message_id": self.message_id}


@dataclass(frozen=True, slots=True)
class Metadata:
    tool_call_id: str | None = None
    tags: tuple[str, ...] = ()
    memory_tier: str = DEFAULT_TIER
    memory_kind: str = DEFAULT_KIND
    importance: int = DEFAULT_IMPORTANCE
    summary: str | None = None
    relations: tuple[Relation, ...] = ()
    source_message_ids: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        out["tags"] = list(self.tags)
        out["memory_tier"] = self.memory_tier
        out["memory_kind"] = self.memory_kind
        out["importance"] = self.importance
        if self.summary is not None:
            out["summary"] = self.summary
        out["relations"] = [r.to_json() for r in self.relations]
        out["source_message_ids"] = list(self.source_message_ids)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Metadata:
        """Rebuild from `to_json()` output (trusted, already validated data)."""
        if not data:
            return DEFAULT_METADATA
        return cls(
            tool_call_id=data.get("tool_call_id"),
            tags=tuple(data.get("tags", ())),
            memory_tier=data.get("memory_tier", DEFAULT_TIER),
            memory_kind=data.get("memory_kind", DEFAULT_KIND),
            importance=int(data.get("importance", DEFAULT_IMPORTANCE)),
            summary=data.get("summary"),
            relations=tuple(
                Relation(r["type"], r["message_id"]) for r in data.get("relations", ())
            ),
            source_message_ids=tuple(data.get("source_message_ids", ())),
        )


DEFAULT_METADATA: Final = Metadata()


@dataclass(frozen=True, slots=True)
class Message:
    message_id: str
    session_id: str
    timestamp: int
    role: str
    content: str
    revision: int = 1
    updated_at: int = 0
    metadata: Metadata = field(default=DEFAULT_METADATA)

    def to_json(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "session_id": self.session_id,
            "timestamp": self.timestamp,
            "role": self.role,
            "content": self.content,
            "revision": self.revision,
            "updated_at": self.updated_at,
            "metadata": self.metadata.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Message:
        """Rebuild from `to_json()` output (trusted, already validated data)."""
        return cls(
            message_id=data["message_id"],
            session_id=data["session_id"],
            timestamp=int(data["timestamp"]),
            role=data["role"],
            content=data["content"],
            revision=int(data["revision"]),
            updated_at=int(data["updated_at"]),
            metadata=Metadata.from_json(data.get("metadata") or {}),
        )
