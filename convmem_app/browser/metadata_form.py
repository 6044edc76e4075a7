"""The metadata editor's form state and its field-by-field checks (the service's own rules)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from convmem_engine.domain import ValidationError, validation


@dataclass
class MetadataForm:
    """What the editor holds, in the shape of `metadata_json` (summary "" means unset)."""

    tags: list[str] = field(default_factory=list)
    memory_tier: str = "short"
    memory_kind: str = "conversation"
    importance: int = 50
    summary: str = ""
    relations: list[tuple[str, str]] = field(default_factory=list)
    source_message_ids: list[str] = field(default_factory=list)

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> MetadataForm:
        meta = message.get("metadata", {})
        return cls(
            tags=list(meta.get("tags", [])),
            memory_tier=str(meta.get("memory_tier", "short")),
            memory_kind=str(meta.get("memory_kind", "conversation")),
            importance=int(meta.get("importance", 50)),
            summary=str(meta.get("summary") or ""),
            relations=[(str(r["type"]), str(r["message_id"])) for r in meta.get("relations", [])],
            source_message_ids=list(meta.get("source_message_ids", [])),
        )

    def to_metadata(self) -> dict[str, Any]:
        return {
            "tags": list(self.tags),
            "memory_tier": self.memory_tier,
            "memory_kind": self.memory_kind,
            "importance": self.importance,
            "summary": self.summary,
            "relations": [{"type": t, "message_id": m} for t, m in self.relations],
            "source_message_ids": list(self.source_message_ids),
        }


def split_tags(text: str) -> list[str]:
    """Comma-separated tags; surrounding spaces and empty pieces (", ,") are dropped."""
    return [t.strip() for t in text.split(",") if t.strip()]


def split_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def validate(form: MetadataForm) -> dict[str, str]:
    """Field name -> what is wrong (the service's own message); empty when the form can be saved.

    Each field goes through `convmem_engine.domain.validation.metadata_json` on its own, so the
    editor applies exactly the rules `update_message` applies and can point at the field.
    """
    errors: dict[str, str] = {}
    for key, value in form.to_metadata().items():
        try:
            validation.metadata_json(json.dumps({key: value}, ensure_ascii=False))
        except ValidationError as exc:
            errors[key] = exc.message.removeprefix("metadata_json.")
    return errors
