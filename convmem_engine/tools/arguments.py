"""Arguments against a tool's generated JSON Schema: the first check of every call.

`check_schema` validates a call with the tool's strict input schema and raises the domain
`ValidationError` whose message names each failing field and its rule (several at once, at most
`MAX_REPORTED_ERRORS`), never the value. The checks of each parameter's kind (exact UTF-8
bytes, what a JSON string says) and the tool's rule across parameters run after it
(`ToolRegistry.validate`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from convmem_engine.domain.errors import ValidationError
from convmem_engine.domain.validation import ULID_RULE

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError as SchemaError

MAX_REPORTED_ERRORS: Final = 5

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _is_integer(_checker: object, instance: object) -> bool:
    # JSON Schema calls 1.0 an integer; the tool reference means a JSON integer literal.
    return isinstance(instance, int) and not isinstance(instance, bool)


@functools.cache
def _validator_class() -> Any:
    # jsonschema is imported on first use: calls that plainly pass never need it
    # (tools.registry.validate_arguments), and it was ~55 ms of every cold start.
    import jsonschema

    checker = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer)
    return jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=checker)


_TYPE_WORDS: Final = {
    "string": "a string",
    "integer": "an integer",
    "object": "an object",
    "array": "an array",
    "boolean": "a boolean",
    "number": "a number",
    "null": "null",
}


def schema_validator(schema: dict[str, Any]) -> Any:
    """A validator for one tool's input schema (checked to be a valid JSON Schema first)."""
    cls = _validator_class()
    cls.check_schema(schema)
    return cls(schema)


def _field(error: SchemaError) -> str:
    path = [str(part) for part in error.absolute_path]
    return ".".join(path) if path else "arguments"


def _describe(error: SchemaError) -> str:
    """One line naming the field and the rule it broke; never the offending value."""
    field = _field(error)
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    keyword = error.validator
    if keyword == "required":
        missing = [name for name in schema.get("required", ()) if name not in _instance(error)]
        names = ", ".join(missing) or "a required argument"
        return f"{names}: required"
    if keyword == "additionalProperties":
        allowed = ", ".join(schema.get("properties", {})) or "none"
        extra = [key for key in _instance(error) if key not in schema.get("properties", {})]
        shown = [key for key in extra if isinstance(key, str) and _NAME.match(key)]
        label = f"unknown argument {', '.join(shown)}" if shown else "unknown argument"
        return f"{label}: not accepted (allowed arguments: {allowed})"
    if keyword == "type":
        wanted = schema.get("type")
        kinds = wanted if isinstance(wanted, list) else [wanted]
        word = " or ".join(_TYPE_WORDS.get(str(kind), str(kind)) for kind in kinds)
        if error.instance is None:  # a null tells us nothing about the value: safe to say
            return f"{field}: must be {word} (omit the argument to use its default)"
        return f"{field}: must be {word}"
    if keyword == "enum":
        return f"{field}: must be one of {', '.join(str(v) for v in schema.get('enum', ()))}"
    if field == "cursor" and keyword in ("minLength", "maxLength"):
        return f"{field}: must be a nextCursor returned by read_messages"
    if keyword == "minLength":
        if schema.get("minLength") == 1:
            return f"{field}: must not be empty"
        return f"{field}: must be at least {schema.get('minLength')} characters"
    if keyword == "maxLength":
        if "pattern" in schema:
            return f"{field}: {ULID_RULE}"
        return f"{field}: must be at most {schema.get('maxLength')} UTF-8 bytes"
    if keyword == "pattern":
        return f"{field}: {ULID_RULE}"
    if keyword in ("minimum", "maximum"):
        low, high = schema.get("minimum"), schema.get("maximum")
        if high is None:
            return f"{field}: must be at least {low}"
        return f"{field}: must be between {low} and {high}"
    return f"{field}: violates the '{keyword}' rule of the schema"


def _instance(error: SchemaError) -> Mapping[str, Any]:
    instance = error.instance
    return instance if isinstance(instance, Mapping) else {}


def _unencodable(arguments: Mapping[str, Any]) -> Iterable[str]:
    """Names of string arguments that are not valid Unicode (an unpaired surrogate)."""
    for key, value in arguments.items():
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                yield key


def check_schema(validator: Any, arguments: Mapping[str, Any]) -> None:
    """Raise `ValidationError` unless `arguments` satisfy the validator's schema."""
    errors = sorted(
        validator.iter_errors(dict(arguments)),
        key=lambda e: (list(map(str, e.absolute_path)), str(e.validator)),
    )
    problems: list[str] = []
    for error in errors:
        text = _describe(error)
        if text not in problems:
            problems.append(text)
    if not problems:
        problems = [f"{name}: must be valid UTF-8 text" for name in _unencodable(arguments)]
    if problems:
        shown = problems[:MAX_REPORTED_ERRORS]
        more = len(problems) - len(shown)
        suffix = f"; and {more} more" if more else ""
        raise ValidationError(f"{'; '.join(shown)}{suffix}")
