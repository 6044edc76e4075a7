"""Hypothesis strategies generated from the tools' own input schemas (`tools/list`).

hypothesis-jsonschema would do this, but its last release (0.23.1) fails on our Hypothesis
(6.170: "'many' object has no attribute 'more'"), so this is the same idea for the keywords our
schemas use: type, enum, minLength/maxLength, pattern, minimum/maximum, properties, required,
additionalProperties: false. Every keyword a schema uses that is not handled here fails loudly
(`UnsupportedSchema`), so a schema change cannot silently narrow the fuzzing.

- `valid_arguments(schema)`: arguments the schema accepts (the service may still refuse them:
  byte limits count UTF-8 bytes, JSON-in-a-string fields must hold the right JSON, ids must
  exist);
- `invalid_arguments(schema)`: arguments that break exactly one rule of the schema (a missing
  required argument, an unknown one, a wrong type, a number out of range, a string too long
  or too short or off its pattern, a lone surrogate), carrying `MARKER` in the broken values,
  so a test can check that no answer echoes what it was sent.
"""

from __future__ import annotations

import json
from typing import Any, Final

from hypothesis import strategies as st

MARKER: Final = "Qx7ECHO"
"""Put into generated strings: must never appear in an error message."""

_HANDLED: Final = frozenset(
    {
        "type",
        "enum",
        "minLength",
        "maxLength",
        "pattern",
        "minimum",
        "maximum",
        "properties",
        "required",
        "additionalProperties",
        "default",
        "description",
        "title",
    }
)
TEXT_CAP: Final = 300
"""Longest generated string (characters) below a schema's maxLength: the 1 MiB limits are
checked by their own tests, the fuzzing wants many calls."""


class UnsupportedSchema(ValueError):
    pass


def _check(schema: dict[str, Any]) -> None:
    unknown = set(schema) - _HANDLED
    if unknown:
        raise UnsupportedSchema(f"schema keywords not generated: {sorted(unknown)}")
    if schema.get("additionalProperties", False) is not False and "properties" in schema:
        raise UnsupportedSchema("only additionalProperties: false is generated")


def json_values(max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """Any JSON value (what a JSON-in-a-string argument or a hostile line may hold)."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=max_leaves,
    )


def _string(schema: dict[str, Any], name: str) -> st.SearchStrategy[str]:
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "pattern" in schema:
        return st.from_regex(schema["pattern"], fullmatch=True)
    low = schema.get("minLength", 0)
    high = min(schema.get("maxLength", TEXT_CAP), max(low, TEXT_CAP))
    text = st.text(min_size=low, max_size=high)
    if name.endswith("_json"):  # the schema says string; the description says JSON inside
        encoded = json_values().map(json.dumps).filter(lambda s: low <= len(s) <= high)
        return st.one_of(text, encoded)
    return text


def _integer(schema: dict[str, Any]) -> st.SearchStrategy[int]:
    return st.integers(min_value=schema.get("minimum"), max_value=schema.get("maximum"))


def valid_value(schema: dict[str, Any], name: str = "") -> st.SearchStrategy[Any]:
    _check(schema)
    kind = schema.get("type")
    if kind == "string":
        return _string(schema, name)
    if kind == "integer":
        return _integer(schema)
    if kind == "boolean":
        return st.booleans()
    if kind == "object":
        return valid_arguments(schema)
    raise UnsupportedSchema(f"type {kind!r} is not generated")


def valid_arguments(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    _check(schema)
    properties: dict[str, Any] = schema.get("properties", {})
    required = list(schema.get("required", ()))
    optional = {k: valid_value(v, k) for k, v in properties.items() if k not in required}
    return st.fixed_dictionaries(
        {k: valid_value(properties[k], k) for k in required}, optional=optional
    )


def _wrong_type(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    kind = schema.get("type")
    others: list[st.SearchStrategy[Any]] = [
        st.none(),
        st.lists(st.just(MARKER), max_size=2),
        st.dictionaries(st.just(MARKER), st.just(MARKER), max_size=1),
    ]
    if kind != "string":
        others.append(st.text(max_size=10).map(lambda s: MARKER + s))
    if kind != "integer":
        others.append(st.integers(min_value=-(2**70), max_value=2**70))
    else:
        others += [
            st.booleans(),
            st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != int(f)),
        ]
        others.append(st.integers(min_value=1, max_value=10).map(float))  # 3.0: not an integer
    if kind != "boolean":
        others.append(st.booleans())
    return st.one_of(others)


def _broken_value(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A value that breaks one rule of `schema` (not only its type)."""
    kind = schema.get("type")
    options = [_wrong_type(schema)]
    if kind == "string":
        options.append(st.just(MARKER + "\ud800"))  # valid JSON, not valid UTF-8 text
        if "enum" in schema:
            options.append(st.text(max_size=10).map(lambda s: MARKER + s))
        if "pattern" in schema:
            options.append(st.text(min_size=0, max_size=40).map(lambda s: (MARKER + s)[:26]))
        if "maxLength" in schema and schema["maxLength"] <= 4096:
            over = schema["maxLength"] + 1 - len(MARKER)
            options.append(st.integers(over, over + 50).map(lambda n: MARKER + "é" * n))
        if schema.get("minLength", 0) > 0:
            options.append(st.just(""))
    if kind == "integer":
        if "minimum" in schema:
            low = schema["minimum"]
            options.append(st.integers(max_value=low - 1, min_value=low - 2**64))
        if "maximum" in schema:
            high = schema["maximum"]
            options.append(st.integers(min_value=high + 1, max_value=high + 2**64))
    return st.one_of(options)


@st.composite
def invalid_arguments(draw: st.DrawFn, schema: dict[str, Any]) -> dict[str, Any]:
    """Arguments breaking exactly one rule of `schema` (valid otherwise)."""
    arguments = dict(draw(valid_arguments(schema)))
    properties: dict[str, Any] = schema.get("properties", {})
    required = list(schema.get("required", ()))
    ways = ["unknown"]
    if required:
        ways.append("missing")
    if properties:
        ways.append("value")
    way = draw(st.sampled_from(ways))
    if way == "unknown":
        # The error may name an unknown argument (a field name, not content): no MARKER in it.
        key = draw(st.text(min_size=1, max_size=12).filter(lambda k: k not in properties))
        arguments[key] = draw(st.one_of(st.just(MARKER), json_values(4)))
    elif way == "missing":
        del arguments[draw(st.sampled_from(required))]
    else:
        name = draw(st.sampled_from(sorted(properties)))
        arguments[name] = draw(_broken_value(properties[name]))
    return arguments
