"""A tool, declared once: its name, description, parameters, annotations, result style, handler.

Each parameter is one `Param`: a name, a description for the model, whether it is required, its
default and its `Kind`. A kind knows the two faces of one rule: the JSON Schema fragment a host
and a model see (`schema`), and the check that turns a raw JSON argument into the value the
handler gets, raising the domain `ValidationError` (`check`, a function of
`convmem_engine.domain.validation`). A tool's input schema is generated from its parameters, so
the schema and the checks cannot drift apart: tests compare the two faces of each kind.

String limits in the tool reference are UTF-8 bytes; JSON Schema can only count characters, so
`maxLength` is the byte limit (a string with more characters than that certainly has more
bytes) and `check` counts the exact bytes. The schemas stay flat (no top-level `oneOf`/`if`):
some hosts refuse anything else; rules between parameters (e.g. which `view` needs which
argument) are the tool's `rule`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal, TypeVar

from convmem_engine.domain import limits
from convmem_engine.domain import validation as v
from convmem_engine.tools.arguments import schema_validator

ResultStyle = Literal["json", "text"]
"""How a result reaches the caller: "json" is one text block holding the result as JSON (the
memory tools, seed 000); "text" is one text block of plain text (the agent tools, seed 002)."""

ULID_PATTERN: Final = f"^{v.ULID_RE.pattern}$"
"""A canonical 26-character ULID: uppercase Crockford base32, first character 0-7."""

Check = Callable[[object, str], Any]
"""(raw value, field name) -> the checked value; raises ValidationError naming the field."""


@dataclass(frozen=True, slots=True)
class Text:
    """A string of `min_bytes`..`max_bytes` UTF-8 bytes. `custom_check` replaces the default
    check when the content has rules of its own (e.g. an opaque cursor, checked where it is
    read)."""

    max_bytes: int
    min_bytes: int = 0
    custom_check: Check | None = None

    def schema(self, description: str, default: object) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "string", "description": description}
        if self.min_bytes:
            out["minLength"] = self.min_bytes
        out["maxLength"] = self.max_bytes
        return _with_default(out, default)

    def check(self, value: object, name: str) -> Any:
        if self.custom_check is not None:
            return self.custom_check(value, name)
        return v.text(value, name, min_bytes=self.min_bytes, max_bytes=self.max_bytes)

    def check_implies_schema(self, value: object) -> bool:
        # bytes >= code points, so the byte limits are stricter than maxLength; a minimum
        # above 1 byte is not (13 two-byte characters are 26 bytes but 13 code points)
        return self.custom_check is None and self.min_bytes <= 1 and isinstance(value, str)


@dataclass(frozen=True, slots=True)
class JsonText:
    """A string holding JSON: never empty ("" is not JSON), at most `max_bytes`; `parse` (a
    domain function) reads what the JSON says."""

    parse: Check
    max_bytes: int = limits.METADATA_JSON_MAX_BYTES

    def schema(self, description: str, default: object) -> dict[str, Any]:
        out = {"type": "string", "description": description, "minLength": 1}
        return _with_default(out | {"maxLength": self.max_bytes}, default)

    def check(self, value: object, name: str) -> Any:
        return self.parse(value, name)

    def check_implies_schema(self, value: object) -> bool:
        return isinstance(value, str)  # the parse reads a non-empty string of max_bytes bytes


@dataclass(frozen=True, slots=True)
class Ulid:
    """A canonical message id."""

    def schema(self, description: str, default: object) -> dict[str, Any]:
        out = {
            "type": "string",
            "description": description,
            "minLength": limits.ULID_LENGTH,
            "maxLength": limits.ULID_LENGTH,
            "pattern": ULID_PATTERN,
        }
        return _with_default(out, default)

    def check(self, value: object, name: str) -> str:
        return v.message_id(value, name)

    def check_implies_schema(self, value: object) -> bool:
        return isinstance(value, str)


@dataclass(frozen=True, slots=True)
class Choice:
    """One of a fixed set of strings."""

    choices: tuple[str, ...]

    def schema(self, description: str, default: object) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "string", "enum": list(self.choices)}
        if default is not None:
            out["default"] = default
        out["description"] = description
        return out

    def check(self, value: object, name: str) -> str:
        return v.choice(value, name, self.choices)

    def check_implies_schema(self, value: object) -> bool:
        return isinstance(value, str)


@dataclass(frozen=True, slots=True)
class Integer:
    """A JSON integer (never a boolean) in `minimum`..`maximum` (no upper bound when None)."""

    minimum: int
    maximum: int | None = None

    def schema(self, description: str, default: object) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "integer", "description": description}
        out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return _with_default(out, default)

    def check(self, value: object, name: str) -> int:
        return v.integer(value, name, lo=self.minimum, hi=self.maximum)

    def check_implies_schema(self, value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Custom:
    """Any other argument: its JSON Schema fragment as given (without "description" and
    "default", which come from the Param) and the check that reads it, which may be stricter
    than the fragment (say how in the description); e.g. seed 002's nullable UUID:
    `Custom({"type": ["string", "null"], "format": "uuid"}, check_uuid)`."""

    fragment: Mapping[str, Any]
    custom_check: Check

    def schema(self, description: str, default: object) -> dict[str, Any]:
        out = {"description": description, **self.fragment}
        return _with_default(out, default)

    def check(self, value: object, name: str) -> Any:
        return self.custom_check(value, name)

    def check_implies_schema(self, value: object) -> bool:
        return False  # the fragment is free-form: the schema always runs


Kind = Text | JsonText | Ulid | Choice | Integer | Custom
"""Every kind has `schema` (its JSON Schema fragment), `check` (the domain check) and
`check_implies_schema(value)`: True when, for a value of this JSON type, `check` accepting it
means the fragment accepts it too (the check is at least as strict). Calls whose every argument
is such a value skip the JSON Schema validator (`tools.registry.validate_arguments`);
tests/tools/test_arguments_fast.py compares both ways on random arguments."""


def _with_default(schema: dict[str, Any], default: object) -> dict[str, Any]:
    if default is not None:
        schema["default"] = default
    return schema


@dataclass(frozen=True, slots=True)
class Param:
    """One argument of a tool. `default` is what an omitted argument means, shown in the
    schema (None: no default). The handler gets only the arguments given, so it applies the
    default itself (a MemoryService keyword default, `args.get(name, default)`)."""

    name: str
    kind: Kind
    description: str
    required: bool = False
    default: str | int | None = None

    def schema(self) -> dict[str, Any]:
        return self.kind.schema(self.description, self.default)

    def check(self, value: object) -> Any:
        return self.kind.check(value, self.name)

    def check_implies_schema(self, value: object) -> bool:
        return self.kind.check_implies_schema(value)


@dataclass(frozen=True, slots=True)
class Annotations:
    """MCP tool annotations (hints to the host, not guarantees)."""

    read_only: bool
    destructive: bool
    idempotent: bool
    open_world: bool = False


C = TypeVar("C")

Handler = Callable[[C, dict[str, Any]], Any]
"""(context, checked arguments) -> result: a JSON-ready dict for "json" tools, a str for
"text" tools. The arguments are those given, each the value its kind's check returned.
Raises `ConvMemError` subclasses for application errors. Runs on a worker thread (never on an
event loop), so it may block."""

Rule = Callable[[Mapping[str, Any]], None]
"""A check across parameters, run on the checked arguments (only those given) after every
parameter's own check; raises ValidationError."""


@dataclass(frozen=True)
class ToolSpec(Generic[C]):
    """One tool. `handler` gets the context the tool is registered with (the MemoryService
    for the memory tools) and the checked arguments of the parameters that were given."""

    name: str
    title: str
    description: str
    params: tuple[Param, ...]
    annotations: Annotations
    handler: Handler[C]
    result_style: ResultStyle = "json"
    rule: Rule | None = None
    input_schema: dict[str, Any] = field(init=False, repr=False, compare=False)
    param_names: frozenset[str] = field(init=False, repr=False, compare=False)
    required_names: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"tool {self.name}: a parameter is declared twice")
        properties = {p.name: p.schema() for p in self.params}
        schema: dict[str, Any] = {
            "type": "object",
            "properties": properties,
            "additionalProperties": False,
        }
        required = [p.name for p in self.params if p.required]
        if required:
            schema["required"] = required
        object.__setattr__(self, "input_schema", schema)
        object.__setattr__(self, "param_names", frozenset(names))
        object.__setattr__(self, "required_names", tuple(required))

    @functools.cached_property
    def validator(self) -> Any:
        """The JSON Schema validator of `input_schema` (see `tools.arguments`), made (and the
        schema checked) on first use: the first call that does not plainly pass. Every
        registered tool's schema is checked in tests/tools/test_arguments_fast.py."""
        return schema_validator(self.input_schema)

    @property
    def read_only(self) -> bool:
        return self.annotations.read_only

    @property
    def destructive(self) -> bool:
        return self.annotations.destructive

    @property
    def idempotent(self) -> bool:
        return self.annotations.idempotent

    def param(self, name: str) -> Param:
        """The parameter called `name` (KeyError if there is none)."""
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)
