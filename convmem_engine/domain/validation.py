"""The domain's rules for every value a tool argument can carry, against seed 000's limits.

The tool registry's parameter kinds (`convmem_engine.tools.spec`) check each argument with
these functions; import (convmem_engine.transfer) and the GUI's inline checks use them too.
Each function takes a raw value (whatever JSON type the caller sent), checks its type, size
and range, and returns the normalised value or raises `ValidationError`. Messages name the field
and the constraint and never repeat the value. `bool` is never accepted where an integer is
expected (JSON `true` is not `1`).

Decisions where the seed is silent (see docs/semantics.md):
- ULIDs must be canonical: 26 characters of uppercase Crockford base32 whose first character is
  0-7; lowercase is rejected, not folded.
- An unknown metadata or filter field is a VALIDATION_ERROR naming the field.
- Duplicate tags, relations and source ids are removed (first occurrence kept); the item limit
  applies to the array as sent.
- `summary` "" and `null` mean unset; `tool_call_id` `null` means unset, "" is a value.
- A JSON object with a repeated key, `NaN`/`Infinity`, or nesting too deep is rejected.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from convmem_engine.domain import limits
from convmem_engine.domain.errors import ValidationError
from convmem_engine.domain.message import (
    DEFAULT_METADATA,
    MEMORY_KINDS,
    MEMORY_TIERS,
    RELATION_TYPES,
    ROLES,
    Message,
    Metadata,
    Relation,
)

ULID_RE: Final = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")
VIEWS: Final = ("history", "content", "context", "sessions")
METADATA_FIELDS: Final = (
    "tool_call_id",
    "tags",
    "memory_tier",
    "memory_kind",
    "importance",
    "summary",
    "relations",
    "source_message_ids",
)
FILTER_FIELDS: Final = ("kinds", "tiers", "tags")
ULID_RULE: Final = (
    f"must be a canonical {limits.ULID_LENGTH}-character ULID (uppercase Crockford base32)"
)
_NAME_SHOWN_MAX: Final = 64


def _fail(field: str, constraint: str) -> ValidationError:
    return ValidationError(f"{field}: {constraint}")


def _quote_name(name: str) -> str:
    """Show an unknown key (a name, not a value), shortened and escaped."""
    shown = name if len(name) <= _NAME_SHOWN_MAX else name[:_NAME_SHOWN_MAX] + "…"
    return json.dumps(shown, ensure_ascii=True)


def utf8_len(value: str, field: str) -> int:
    """Byte length of `value` in UTF-8; lone surrogates are not valid UTF-8."""
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise _fail(field, "must be valid UTF-8 text") from None


def require_str(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise _fail(field, "must be a string")
    return value


def text(value: object, field: str, *, min_bytes: int, max_bytes: int) -> str:
    """A string of `min_bytes`..`max_bytes` UTF-8 bytes."""
    s = require_str(value, field)
    # A str of n code points is at least n bytes: reject huge inputs before encoding them.
    if len(s) > max_bytes:
        raise _fail(field, f"must be at most {max_bytes} UTF-8 bytes")
    n = utf8_len(s, field)
    if n < min_bytes:
        if min_bytes == 1:
            raise _fail(field, "must not be empty")
        raise _fail(field, f"must be at least {min_bytes} UTF-8 bytes")
    if n > max_bytes:
        raise _fail(field, f"must be at most {max_bytes} UTF-8 bytes")
    return s


def session_id(value: object, field: str = "session_id") -> str:
    return text(value, field, min_bytes=1, max_bytes=limits.SESSION_ID_MAX_BYTES)


def choice(value: object, field: str, choices: tuple[str, ...]) -> str:
    """One of `choices`."""
    s = require_str(value, field)
    if s not in choices:
        raise _fail(field, "must be one of " + " / ".join(choices))
    return s


def role(value: object, field: str = "role") -> str:
    return choice(value, field, ROLES)


def content(value: object, field: str = "content") -> str:
    return text(value, field, min_bytes=1, max_bytes=limits.CONTENT_MAX_BYTES)


def message_id(value: object, field: str = "message_id") -> str:
    s = require_str(value, field)
    if len(s) != limits.ULID_LENGTH or ULID_RE.fullmatch(s) is None:
        raise _fail(field, ULID_RULE)
    return s


def integer(value: object, field: str, *, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(field, "must be an integer")
    if value < lo or (hi is not None and value > hi):
        if hi is None:
            raise _fail(field, f"must be at least {lo}")
        raise _fail(field, f"must be between {lo} and {hi}")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(name)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, val in pairs:
        if key in out:
            raise KeyError(key)
        out[key] = val
    return out


def json_string(
    value: object, field: str, *, max_bytes: int = limits.METADATA_JSON_MAX_BYTES
) -> Any:
    """Parse a string argument holding JSON (strict: no NaN, no repeated keys)."""
    s = text(value, field, min_bytes=1, max_bytes=max_bytes)
    try:
        return json.loads(s, parse_constant=_reject_constant, object_pairs_hook=_unique_pairs)
    except KeyError:
        raise _fail(field, "must not repeat an object key") from None
    except (ValueError, RecursionError):
        raise _fail(field, "must be valid JSON") from None


def json_object(value: object, field: str) -> dict[str, Any]:
    data = json_string(value, field)
    if not isinstance(data, dict):
        raise _fail(field, "must be a JSON object")
    return data


def _string_list(value: object, field: str, *, max_items: int, item: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _fail(field, "must be an array")
    if len(value) > max_items:
        raise _fail(field, f"must have at most {max_items} items")
    seen: dict[str, None] = {}
    for i, raw in enumerate(value):
        seen.setdefault(item(raw, f"{field}[{i}]"), None)
    return tuple(seen)


def tag(value: object, field: str) -> str:
    return text(value, field, min_bytes=1, max_bytes=limits.TAG_MAX_BYTES)


def _enum(choices: tuple[str, ...]) -> Any:
    def check(value: object, field: str) -> str:
        return choice(value, field, choices)

    return check


memory_tier = _enum(MEMORY_TIERS)
memory_kind = _enum(MEMORY_KINDS)
relation_type = _enum(RELATION_TYPES)


def _relations(value: object, field: str) -> tuple[Relation, ...]:
    if not isinstance(value, list):
        raise _fail(field, "must be an array")
    if len(value) > limits.RELATIONS_MAX_ITEMS:
        raise _fail(field, f"must have at most {limits.RELATIONS_MAX_ITEMS} items")
    seen: dict[Relation, None] = {}
    for i, raw in enumerate(value):
        at = f"{field}[{i}]"
        if not isinstance(raw, dict):
            raise _fail(at, 'must be an object {"type", "message_id"}')
        for key in raw:
            if key not in ("type", "message_id"):
                raise _fail(f"{at}.{_quote_name(key)}", "unknown field; allowed: type, message_id")
        if "type" not in raw:
            raise _fail(f"{at}.type", "is required")
        if "message_id" not in raw:
            raise _fail(f"{at}.message_id", "is required")
        rel = Relation(
            relation_type(raw["type"], f"{at}.type"),
            message_id(raw["message_id"], f"{at}.message_id"),
        )
        seen.setdefault(rel, None)
    return tuple(seen)


def _optional_text(value: object, field: str, max_bytes: int, *, empty_unsets: bool) -> str | None:
    if value is None:
        return None
    s = text(value, field, min_bytes=0, max_bytes=max_bytes)
    if empty_unsets and s == "":
        return None
    return s


@dataclass(frozen=True, slots=True)
class MetadataPatch:
    """The metadata fields a caller sent, already normalised; absent fields are not in `fields`."""

    fields: Mapping[str, Any]

    def apply(self, base: Metadata = DEFAULT_METADATA) -> Metadata:
        if not self.fields:
            return base
        return replace(base, **self.fields)


def metadata_json(value: object, field: str = "metadata_json") -> MetadataPatch:
    """Parse `metadata_json`; `None` (omitted) is the empty patch `{}`."""
    if value is None:
        return MetadataPatch({})
    data = json_object(value, field)
    out: dict[str, Any] = {}
    for key, raw in data.items():
        at = f"{field}.{key}" if key in METADATA_FIELDS else ""
        if key == "tool_call_id":
            out[key] = _optional_text(raw, at, limits.TOOL_CALL_ID_MAX_BYTES, empty_unsets=False)
        elif key == "tags":
            out[key] = _string_list(raw, at, max_items=limits.TAGS_MAX_ITEMS, item=tag)
        elif key == "memory_tier":
            out[key] = memory_tier(raw, at)
        elif key == "memory_kind":
            out[key] = memory_kind(raw, at)
        elif key == "importance":
            out[key] = integer(raw, at, lo=limits.IMPORTANCE_MIN, hi=limits.IMPORTANCE_MAX)
        elif key == "summary":
            out[key] = _optional_text(raw, at, limits.SUMMARY_MAX_BYTES, empty_unsets=True)
        elif key == "relations":
            out[key] = _relations(raw, at)
        elif key == "source_message_ids":
            out[key] = _string_list(raw, at, max_items=limits.SOURCE_IDS_MAX_ITEMS, item=message_id)
        else:
            raise _fail(
                f"{field}.{_quote_name(key)}",
                "unknown field; allowed: " + ", ".join(METADATA_FIELDS),
            )
    return MetadataPatch(out)


def relation_types_json(value: object, field: str = "relation_types_json") -> frozenset[str]:
    """`None` (omitted) means every relation type."""
    if value is None:
        return frozenset(RELATION_TYPES)
    data = json_string(value, field)
    if not isinstance(data, list):
        raise _fail(field, "must be a JSON array of relation types")
    if len(data) > len(RELATION_TYPES) * 4:
        raise _fail(field, f"must have at most {len(RELATION_TYPES) * 4} items")
    return frozenset(relation_type(raw, f"{field}[{i}]") for i, raw in enumerate(data))


@dataclass(frozen=True, slots=True)
class SearchFilters:
    """`filters_json`: kinds OR, tiers OR, AND across; every tag in `tags` required.

    An empty or omitted array puts no constraint on its category.
    """

    kinds: frozenset[str] = frozenset()
    tiers: frozenset[str] = frozenset()
    tags: frozenset[str] = frozenset()

    def accepts(self, metadata: Metadata) -> bool:
        if self.kinds and metadata.memory_kind not in self.kinds:
            return False
        if self.tiers and metadata.memory_tier not in self.tiers:
            return False
        return not self.tags or self.tags.issubset(metadata.tags)

    def accepts_message(self, msg: Message) -> bool:
        return self.accepts(msg.metadata)

    @property
    def empty(self) -> bool:
        return not (self.kinds or self.tiers or self.tags)


def filters_json(value: object, field: str = "filters_json") -> SearchFilters:
    if value is None:
        return SearchFilters()
    data = json_object(value, field)
    kinds: tuple[str, ...] = ()
    tiers: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    for key, raw in data.items():
        if key == "kinds":
            kinds = _string_list(
                raw, f"{field}.kinds", max_items=len(MEMORY_KINDS), item=memory_kind
            )
        elif key == "tiers":
            tiers = _string_list(
                raw, f"{field}.tiers", max_items=len(MEMORY_TIERS), item=memory_tier
            )
        elif key == "tags":
            tags = _string_list(raw, f"{field}.tags", max_items=limits.TAGS_MAX_ITEMS, item=tag)
        else:
            raise _fail(
                f"{field}.{_quote_name(key)}",
                "unknown filter; allowed: " + ", ".join(FILTER_FIELDS),
            )
    return SearchFilters(frozenset(kinds), frozenset(tiers), frozenset(tags))
