"""The registry's argument check skips the JSON Schema walk for calls that plainly pass
(`tools.registry._plainly_valid`). That is only sound if, for every tool, the answer is the
same either way: the same checked values, or a ValidationError with the same message. Random
arguments (declared and undeclared names, every JSON type, strings at the byte limits, non-
ASCII and lone surrogates, JSON texts) are checked both ways for every memory tool and a tool
with a free-form (Custom) parameter."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convmem_engine.domain.errors import ValidationError
from convmem_engine.tools import (
    MEMORY_TOOLS,
    Annotations,
    Choice,
    Custom,
    Integer,
    JsonText,
    Param,
    Text,
    ToolSpec,
    Ulid,
)
from convmem_engine.tools import registry as registry_module
from convmem_engine.tools.registry import validate_arguments

_ULID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"

_FREE = ToolSpec(
    name="free",
    title="Free",
    description="A tool with a free-form parameter.",
    params=(
        Param("anything", Custom({"type": ["string", "null"]}, lambda v, _n: v), "Any."),
        Param("n", Integer(1, 10), "A number."),
        Param("label", Text(40, min_bytes=4), "Four bytes or more.", required=True),
    ),
    annotations=Annotations(read_only=True, destructive=False, idempotent=True),
    handler=lambda _ctx, args: args,
)

SPECS = (*MEMORY_TOOLS, _FREE)

_json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
)
_text = st.one_of(
    st.text(max_size=30),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=0, max_size=6),
    st.sampled_from(["", "a", "é" * 3, "\ud800", "x\udfffy", "é", "€€€", _ULID, _ULID.lower()]),
    st.sampled_from(["user", "assistant", "system", "tool", "hot", "cold", "summary", "fact"]),
    st.sampled_from(['{"tags":["a"]}', "{}", "[]", '["supports"]', "null", "{", '{"a":1,"a":2}']),
    st.builds(lambda n, c: c * n, st.integers(0, 4), st.sampled_from(["é", "ab", "€"])),
)
_values = st.recursive(
    st.one_of(_json_scalars, _text),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=4,
)


def _plausible(param: Param) -> st.SearchStrategy[Any]:
    """Values near what `param` accepts: at its limits, one off, and of a wrong JSON type."""
    kind = param.kind
    wrong = st.sampled_from([None, True, 1.5, [], {}, 0])
    if isinstance(kind, Text):
        sizes = sorted(
            {max(n, 0) for b in (kind.min_bytes, kind.max_bytes) for n in (b - 1, b, b + 1)}
        )
        good = st.builds(
            lambda n, ch: ch * n, st.sampled_from(sizes), st.sampled_from(["a", "é", "€"])
        )
        return st.one_of(
            good,
            st.builds(
                lambda n, ch: (ch * n)[: kind.max_bytes + 1],
                st.integers(0, 3),
                st.sampled_from(["a", "é"]),
            ),
            wrong,
        )
    if isinstance(kind, Integer):
        edges = [kind.minimum - 1, kind.minimum, kind.minimum + 1]
        if kind.maximum is not None:
            edges += [kind.maximum - 1, kind.maximum, kind.maximum + 1]
        return st.one_of(st.sampled_from(edges), wrong)
    if isinstance(kind, Choice):
        return st.one_of(st.sampled_from(kind.choices), st.sampled_from(["", "USER", "x"]), wrong)
    if isinstance(kind, Ulid):
        return st.one_of(
            st.sampled_from([_ULID, _ULID.lower(), _ULID + "\n", _ULID[:-1], "8" + _ULID[1:]]),
            wrong,
        )
    if isinstance(kind, JsonText):
        texts = [
            '{"tags":["a"]}',
            "{}",
            "[]",
            '["supports"]',
            '{"kinds":["fact"]}',
            "null",
            "{",
            "",
        ]
        return st.one_of(st.sampled_from(texts), wrong)
    return st.one_of(_text, wrong)


def _good(param: Param) -> st.SearchStrategy[Any]:
    """Values `param` most likely accepts, so that whole calls often pass."""
    kind = param.kind
    if isinstance(kind, Text):
        return st.sampled_from(["abcd", "é" * 4, "x" * max(kind.min_bytes, 1)])
    if isinstance(kind, Integer):
        return st.just(kind.minimum)
    if isinstance(kind, Choice):
        return st.sampled_from(kind.choices)
    if isinstance(kind, Ulid):
        return st.just(_ULID)
    if isinstance(kind, JsonText):
        return st.sampled_from(["{}", '["supports"]', '{"tags":["a"]}'])
    return _text


@st.composite
def _call(draw: st.DrawFn) -> tuple[ToolSpec[Any], dict[str, Any]]:
    spec = draw(st.sampled_from(SPECS))
    names = [p.name for p in spec.params]
    required = [p.name for p in spec.params if p.required and draw(st.integers(0, 9)) > 0]
    others = [n for n in names if n not in required]
    chosen = required + (draw(st.lists(st.sampled_from(others), unique=True)) if others else [])
    args: dict[str, Any] = {}
    for name in chosen:
        param = spec.param(name)
        good = _good(param)
        args[name] = draw(st.one_of(good, good, good, st.none(), _plausible(param), _values))
    if draw(st.integers(0, 5)) == 0:
        args[draw(st.sampled_from(["extra", "Content", "limit ", "é"]))] = draw(_values)
    return spec, args


def _outcome(spec: ToolSpec[Any], args: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "ok", validate_arguments(spec, args)
    except ValidationError as error:
        return "error", str(error)


def _slow_outcome(
    spec: ToolSpec[Any], args: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> tuple[str, Any]:
    with monkeypatch.context() as patch:
        patch.setattr(registry_module, "_plainly_valid", lambda _spec, _args: None)
        return _outcome(spec, args)


@settings(
    max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(call=_call())
def test_fast_and_schema_paths_agree(
    call: tuple[ToolSpec[Any], dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, args = call
    assert _outcome(spec, args) == _slow_outcome(spec, args, monkeypatch)


@pytest.mark.parametrize(
    ("spec", "args"),
    [
        (_FREE, {"label": "é" * 2}),  # 4 bytes, 2 code points: the schema's minLength refuses
        (_FREE, {"label": "abcd", "anything": 5}),  # the Custom check takes it, the schema not
        (next(s for s in MEMORY_TOOLS if s.name == "write_message"), {"session_id": None}),
    ],
)
def test_calls_the_checks_alone_would_pass_still_get_the_schema_error(
    spec: ToolSpec[Any], args: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _outcome(spec, args)
    assert fast[0] == "error"
    assert fast == _slow_outcome(spec, args, monkeypatch)


def test_a_plain_valid_call_skips_the_schema_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = next(s for s in MEMORY_TOOLS if s.name == "write_message")
    walked: list[object] = []
    monkeypatch.setattr(registry_module, "check_schema", lambda *a: walked.append(a))
    args = {"session_id": "s", "role": "user", "content": "hello", "metadata_json": "{}"}
    assert validate_arguments(spec, args)["content"] == "hello"
    assert walked == []
    with pytest.raises(ValidationError):
        validate_arguments(spec, {**args, "role": "nobody"})
    assert len(walked) == 1  # an error takes the schema's path, for its messages


def test_every_registered_tool_schema_is_a_valid_json_schema() -> None:
    """The validators are made on first use (jsonschema loads lazily), so a broken schema would
    otherwise surface only at the first refused call."""
    from jsonschema import Draft202012Validator

    from convmem_engine.agent.tools import AGENT_RUN, AGENT_STATUS

    for spec in (*SPECS, AGENT_RUN, AGENT_STATUS):
        Draft202012Validator.check_schema(spec.input_schema)
        assert spec.validator is spec.validator  # made once
