"""The two agent tools' input schemas (exactly as the seed prints them) and their validation.

Every rule of the seed is checked here, in process, before anything is queued: unknown
properties, a missing `request`, types, UUID format, a blank request, the temperature range,
and the image rules (non-null elements and fields at run time, the three MIME types, valid
base64, count, per-image and total limits counting decoded bytes). Messages name the field
and the rule and never echo the value. Whether `session_id` names an existing agent session
is checked by the queue (it needs the store).
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from convmem_engine.agent.config import ImageLimits
from convmem_engine.agent.texts import text
from convmem_engine.domain.errors import ValidationError

AGENT_RUN_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "request": {
            "description": "Non-empty natural-language work request.",
            "type": "string",
        },
        "session_id": {
            "description": "Existing session UUID, or omit to create a session.",
            "type": ["string", "null"],
            "format": "uuid",
            "default": None,
        },
        "temperature": {
            "description": "Task-scoped temperature from 0.0 through 2.0.",
            "type": ["number", "null"],
            "default": None,
        },
        "images": {
            "description": "Optional PNG, JPEG, or WebP images.",
            "type": ["array", "null"],
            "items": {
                "type": ["object", "null"],
                "properties": {
                    "mime_type": {"type": ["string", "null"]},
                    "data_base64": {"type": ["string", "null"]},
                },
                "required": ["mime_type", "data_base64"],
                "additionalProperties": False,
            },
            "default": None,
        },
    },
    "required": ["request"],
    "additionalProperties": False,
}

AGENT_STATUS_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "task_id": {
            "description": "Task UUID returned by agent_run.",
            "type": "string",
            "format": "uuid",
        },
        "session_id": {
            "description": "Optional session UUID used to verify task ownership.",
            "type": ["string", "null"],
            "format": "uuid",
            "default": None,
        },
    },
    "required": ["task_id"],
    "additionalProperties": False,
}

IMAGE_MIME_TYPES: Final = ("image/png", "image/jpeg", "image/webp")

_UUID: Final = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
_NAME: Final = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class AgentInputError(ValidationError):
    """An agent tool's arguments are invalid; answered as a tool error (`isError`)."""


@dataclass(frozen=True, slots=True)
class Image:
    mime_type: str
    data_base64: str
    size: int  # decoded bytes


@dataclass(frozen=True, slots=True)
class RunArguments:
    request: str
    session_id: str | None
    temperature: float | None
    images: tuple[Image, ...]


@dataclass(frozen=True, slots=True)
class StatusArguments:
    task_id: str
    session_id: str | None


def _check_properties(arguments: Mapping[str, Any], schema: Mapping[str, Any], lang: str) -> None:
    allowed = list(schema["properties"])
    extra = [key for key in arguments if key not in allowed]
    if extra:
        shown = [key for key in extra if isinstance(key, str) and _NAME.match(key)]
        if shown:
            raise AgentInputError(
                text(
                    "err.unknown_property", lang, names=", ".join(shown), allowed=", ".join(allowed)
                )
            )
        raise AgentInputError(
            text("err.unknown_property_unnamed", lang, allowed=", ".join(allowed))
        )
    for key in schema["required"]:
        if key not in arguments:
            raise AgentInputError(text("err.required", lang, field=key))


def _kind(lang: str, name: str) -> str:
    return text("kind." + name, lang)


def _uuid(value: object, field: str, lang: str, *, nullable: bool) -> str | None:
    if value is None and nullable:
        return None
    if not isinstance(value, str):
        raise AgentInputError(text("err.type", lang, field=field, kind=_kind(lang, "string")))
    if not _UUID.match(value):
        raise AgentInputError(text("err.uuid", lang, field=field))
    return value.lower()


def is_uuid(value: object) -> bool:
    return isinstance(value, str) and bool(_UUID.match(value))


def _check_item_properties(item: Mapping[str, Any], where: str, lang: str) -> None:
    allowed = ("mime_type", "data_base64")
    extra = [key for key in item if key not in allowed]
    if extra:
        shown = [f"{where}.{key}" for key in extra if isinstance(key, str) and _NAME.match(key)]
        names = ", ".join(shown) if shown else where
        raise AgentInputError(
            text("err.unknown_property", lang, names=names, allowed=", ".join(allowed))
        )
    for key in allowed:
        if key not in item:
            raise AgentInputError(text("err.required", lang, field=f"{where}.{key}"))


def _decoded_size(data: str) -> int:
    """The decoded length of a base64 string (exact for valid input), without decoding."""
    padding = len(data) - len(data.rstrip("="))
    return max(0, (len(data) // 4) * 3 - padding)


def _images(value: object, limits: ImageLimits, lang: str) -> tuple[Image, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise AgentInputError(text("err.type", lang, field="images", kind=_kind(lang, "array")))
    if len(value) > limits.max_count:
        raise AgentInputError(text("err.image_count", lang, limit=limits.max_count))
    images: list[Image] = []
    total = 0
    for index, item in enumerate(value):
        where = f"images.{index}"
        if item is None:
            raise AgentInputError(text("err.null", lang, field=where))
        if not isinstance(item, dict):
            raise AgentInputError(text("err.type", lang, field=where, kind=_kind(lang, "object")))
        _check_item_properties(item, where, lang)
        mime, data = item["mime_type"], item["data_base64"]
        for name, field_value in (("mime_type", mime), ("data_base64", data)):
            if field_value is None:
                raise AgentInputError(text("err.null", lang, field=f"{where}.{name}"))
            if not isinstance(field_value, str):
                raise AgentInputError(
                    text("err.type", lang, field=f"{where}.{name}", kind=_kind(lang, "string"))
                )
        assert isinstance(mime, str) and isinstance(data, str)
        if mime.lower() not in IMAGE_MIME_TYPES:
            raise AgentInputError(text("err.mime", lang, field=f"{where}.mime_type"))
        if len(data) % 4 != 0 or not re.fullmatch(r"[A-Za-z0-9+/]*={0,2}", data):
            raise AgentInputError(text("err.base64", lang, field=f"{where}.data_base64"))
        size = _decoded_size(data)
        if size > limits.max_bytes_each:
            raise AgentInputError(
                text(
                    "err.image_size",
                    lang,
                    field=f"{where}.data_base64",
                    limit=limits.max_bytes_each,
                )
            )
        try:
            decoded = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise AgentInputError(text("err.base64", lang, field=f"{where}.data_base64")) from None
        if not decoded:
            raise AgentInputError(text("err.base64", lang, field=f"{where}.data_base64"))
        total += len(decoded)
        if total > limits.max_bytes_total:
            raise AgentInputError(text("err.image_total", lang, limit=limits.max_bytes_total))
        images.append(Image(mime.lower(), data, len(decoded)))
    return tuple(images)


def parse_run_arguments(
    arguments: Mapping[str, Any], limits: ImageLimits, lang: str = "en"
) -> RunArguments:
    _check_properties(arguments, AGENT_RUN_SCHEMA, lang)
    request = arguments["request"]
    if not isinstance(request, str):
        raise AgentInputError(text("err.type", lang, field="request", kind=_kind(lang, "string")))
    if not request.strip():
        raise AgentInputError(text("err.blank", lang, field="request"))
    try:
        request.encode("utf-8")
    except UnicodeEncodeError:
        raise AgentInputError(
            text("err.type", lang, field="request", kind=_kind(lang, "string"))
        ) from None
    session_id = _uuid(arguments.get("session_id"), "session_id", lang, nullable=True)
    temperature = arguments.get("temperature")
    if temperature is not None:
        if not isinstance(temperature, int | float) or isinstance(temperature, bool):
            raise AgentInputError(
                text("err.type", lang, field="temperature", kind=_kind(lang, "number"))
            )
        if not math.isfinite(temperature) or not 0.0 <= temperature <= 2.0:
            raise AgentInputError(text("err.temperature", lang))
        temperature = float(temperature)
    images = _images(arguments.get("images"), limits, lang)
    return RunArguments(request, session_id, temperature, images)


def parse_status_arguments(arguments: Mapping[str, Any], lang: str = "en") -> StatusArguments:
    _check_properties(arguments, AGENT_STATUS_SCHEMA, lang)
    task_id = _uuid(arguments["task_id"], "task_id", lang, nullable=False)
    assert task_id is not None
    session_id = _uuid(arguments.get("session_id"), "session_id", lang, nullable=True)
    return StatusArguments(task_id, session_id)
