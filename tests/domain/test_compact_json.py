"""`compact_json.dumps` is `json.dumps(value, ensure_ascii=False, separators=(",", ":"))`."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convmem_engine.domain import compact_json


def _reference(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()  # every code point, lone surrogates and U+2028 included
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(_VALUES)
def test_the_same_text_as_json_dumps(value: Any) -> None:
    assert compact_json.dumps(value) == _reference(value)


def test_the_same_refusals_as_json_dumps() -> None:
    circular: list[Any] = []
    circular.append(circular)
    with pytest.raises(ValueError, match="Circular reference detected"):
        compact_json.dumps(circular)
    with pytest.raises(TypeError, match="Object of type object is not JSON serializable"):
        compact_json.dumps({"a": object()})
    with pytest.raises(TypeError):
        _reference({"a": object()})


def test_a_tuple_and_non_string_keys_as_json_dumps() -> None:
    value = {1: (1, 2), 2.5: "x", None: [], False: {}}
    assert compact_json.dumps(value) == _reference(value)
