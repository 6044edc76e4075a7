"""The fast path's remembered checks (`fast_call.CallChecks`) decide every `tools/call` exactly
as the SDK's own checks (`fast_call.sdk_check`: the envelope ladder, the per-version surface
model, `CallToolRequestParams`) do, whatever came before in the session.

Hypothesis draws sessions of params: plain calls and odd ones (names and arguments of every
JSON type, extra fields, `_meta` with good and bad envelopes, capabilities whose flags are
`true`, `1` or `1.0`, progress tokens, unknown versions), reusing a few `_meta` values so that
remembered verdicts are hit, in both eras and for each negotiated handshake version.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from hypothesis import given, settings
from hypothesis import strategies as st

from convmem_engine.mcp.fast_call import CallChecks, sdk_check

VERSION = types.PROTOCOL_VERSION_META_KEY
CAPS = types.CLIENT_CAPABILITIES_META_KEY
INFO = types.CLIENT_INFO_META_KEY
HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
ABSENT: Any = object()

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
flags = st.sampled_from([True, False, 1, 0, 1.0, "true", None])
capabilities = st.one_of(
    st.just({}),
    st.fixed_dictionaries({}, optional={"roots": st.fixed_dictionaries({"listChanged": flags})}),
    st.fixed_dictionaries(
        {}, optional={"sampling": st.just({}), "elicitation": st.sampled_from([{}, {"form": {}}])}
    ),
    st.fixed_dictionaries({}, optional={"experimental": json_values, "extensions": json_values}),
    json_values,
)
infos = st.one_of(
    st.fixed_dictionaries({"name": st.text(max_size=6), "version": st.text(max_size=6)}),
    st.fixed_dictionaries({"name": json_values}, optional={"version": json_values}),
    json_values,
)
versions = st.sampled_from(["2026-07-28", *HANDSHAKE_VERSIONS, "2099-01-01", ""]) | json_values
metas = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            VERSION: versions,
            CAPS: capabilities,
            INFO: infos,
            "progressToken": json_values,
            "other": json_values,
        },
    ),
    json_values,
)
names = st.sampled_from(["write_message", "read_messages", "", " write_message", "x" * 300])
names = names | st.text(max_size=10) | json_values


@st.composite
def params_of(draw: st.DrawFn, meta_pool: list[Any]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    name = draw(st.just(ABSENT) | names)
    if name is not ABSENT:
        params["name"] = name
    arguments = draw(
        st.sampled_from([ABSENT, {}, None])
        | st.dictionaries(st.text(max_size=5), json_values)
        | json_values
    )
    if arguments is not ABSENT:
        params["arguments"] = arguments
    meta = draw(st.just(ABSENT) | st.sampled_from(meta_pool))
    if meta is not ABSENT:
        params["_meta"] = meta
    extra = draw(
        st.dictionaries(
            st.sampled_from(["task", "inputResponses", "requestState", "cursor", "x"]),
            json_values,
            max_size=2,
        )
    )
    return params | extra


@st.composite
def sessions(draw: st.DrawFn) -> tuple[bool, str, list[dict[str, Any]]]:
    modern = draw(st.booleans())
    handshake_version = draw(st.sampled_from(HANDSHAKE_VERSIONS))
    the_client = {VERSION: "2026-07-28", CAPS: {}, INFO: {"name": "mcp", "version": "0.1.0"}}
    pool = [the_client, *draw(st.lists(metas, min_size=1, max_size=4))]
    calls = draw(st.lists(params_of(pool), min_size=1, max_size=12))
    return modern, handshake_version, calls


@settings(max_examples=200, deadline=None)
@given(sessions())
def test_remembered_checks_decide_as_the_sdk_does(
    session: tuple[bool, str, list[dict[str, Any]]],
) -> None:
    modern, handshake_version, calls = session
    checks = CallChecks()
    for params in calls:
        expected = sdk_check(params, modern, handshake_version)
        got = checks.check(params, modern, handshake_version)
        assert got == expected, params
        if got is not None:  # the same types too (1 == 1.0 == True for ==)
            assert [type(v) for v in got[2].values()] == [type(v) for v in expected[2].values()]


def test_the_sdk_client_s_calls_are_remembered_and_others_are_not() -> None:
    """The plain call of the SDK's client passes once through the SDK's checks and then from
    memory; a refused envelope is checked every time (never remembered)."""
    meta = {VERSION: "2026-07-28", INFO: {"name": "mcp", "version": "0.1.0"}, CAPS: {}}
    checks = CallChecks()
    plain = {"name": "write_message", "arguments": {"content": "hi"}, "_meta": meta}
    assert checks.check(plain, True, "") == ("2026-07-28", "write_message", {"content": "hi"})
    assert len(checks._passed) == 1
    assert checks.check(dict(plain, arguments={"a": 1}), True, "") == (
        "2026-07-28",
        "write_message",
        {"a": 1},
    )
    bad = {"name": "write_message", "_meta": {VERSION: "2099-01-01", CAPS: {}}}
    assert checks.check(bad, True, "") is None
    assert checks.check(bad, True, "") is None
    assert len(checks._passed) == 1
    legacy = {"name": "write_message", "arguments": {}}
    assert checks.check(legacy, False, "2025-11-25") == ("2025-11-25", "write_message", {})
    assert checks.check({**legacy, "_meta": meta}, False, "2025-11-25") is None  # enveloped
