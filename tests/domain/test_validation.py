"""Every limit of seed 000 at its bound and bound ± 1, every type rule, every decision."""

from __future__ import annotations

import json
from typing import Any

import pytest

from convmem_engine.domain import DEFAULT_METADATA, Metadata, Relation, ValidationError, limits
from convmem_engine.domain import validation as v

ULID_A = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
ULID_B = "01ARZ3NDEKTSV4RRFFQ69G5FAW"
SECRET = "s3cr3t-value-never-echoed"


def fails(fn: Any, *args: Any, field: str, **kwargs: Any) -> str:
    with pytest.raises(ValidationError) as err:
        fn(*args, **kwargs)
    assert err.value.code == "VALIDATION_ERROR"
    assert err.value.message.startswith(field), err.value.message
    assert SECRET not in err.value.message
    return err.value.message


# -- text limits ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "field", "max_bytes"),
    [
        (v.session_id, "session_id", limits.SESSION_ID_MAX_BYTES),
        (v.content, "content", limits.CONTENT_MAX_BYTES),
    ],
)
def test_text_bounds(fn: Any, field: str, max_bytes: int) -> None:
    fails(fn, "", field=field)
    assert fn("a") == "a"
    assert fn("a" * max_bytes) == "a" * max_bytes
    assert "at most" in fails(fn, "a" * (max_bytes + 1), field=field)
    # Bytes, not code points: 3-byte characters.
    n = max_bytes // 3
    assert fn("設" * n) == "設" * n
    fails(fn, "設" * n + "ab", field=field)
    fails(fn, 5, field=field)
    fails(fn, None, field=field)
    fails(fn, b"bytes", field=field)
    assert "UTF-8" in fails(fn, "a\ud800b", field=field)


def test_text_messages_never_echo_the_value() -> None:
    fails(v.session_id, SECRET * 100, field="session_id")
    fails(v.role, SECRET, field="role")
    fails(v.message_id, SECRET, field="message_id")
    fails(v.metadata_json, json.dumps({"memory_tier": SECRET}), field="metadata_json.memory_tier")
    fails(v.metadata_json, SECRET, field="metadata_json")


def test_cjk_emoji_combining_text_is_valid() -> None:
    for s in ("設計", "👩‍💻🎉", "e\u0301", "\u0000nul"):
        assert v.content(s) == s
        assert v.session_id(s) == s
        assert v.tag(s, "t") == s


def test_role() -> None:
    for r in ("user", "assistant", "system"):
        assert v.role(r) == r
    fails(v.role, "User", field="role")
    fails(v.role, "tool", field="role")
    fails(v.role, 1, field="role")


# -- ULIDs --------------------------------------------------------------------------------------


def test_message_id_canonical_only() -> None:
    assert v.message_id(ULID_A) == ULID_A
    assert v.message_id("7" + "Z" * 25) == "7" + "Z" * 25
    fails(v.message_id, ULID_A.lower(), field="message_id")  # lowercase: rejected, not folded
    fails(v.message_id, ULID_A[:-1], field="message_id")  # 25
    fails(v.message_id, ULID_A + "0", field="message_id")  # 27
    fails(v.message_id, "8" + "0" * 25, field="message_id")  # overflow
    for bad in "ILOU":
        fails(v.message_id, ULID_A[:-1] + bad, field="message_id")
    fails(v.message_id, 123, field="message_id")


# -- integers -----------------------------------------------------------------------------------


def test_integer_rules() -> None:
    assert v.integer(0, "f", lo=0, hi=10) == 0
    assert v.integer(10, "f", lo=0, hi=10) == 10
    fails(v.integer, -1, "f", lo=0, hi=10, field="f")
    fails(v.integer, 11, "f", lo=0, hi=10, field="f")
    assert "integer" in fails(v.integer, True, "f", lo=0, hi=10, field="f")  # bool is not int
    assert "integer" in fails(v.integer, False, "f", lo=0, hi=10, field="f")
    fails(v.integer, 5.0, "f", lo=0, hi=10, field="f")
    fails(v.integer, "5", "f", lo=0, hi=10, field="f")
    assert v.integer(2**40, "f", lo=1) == 2**40  # no upper bound
    assert "at least 1" in fails(v.integer, 0, "f", lo=1, field="f")


def test_choice() -> None:
    for name in ("history", "content", "context", "sessions"):
        assert v.choice(name, "view", v.VIEWS) == name
    assert "one of history / content" in fails(v.choice, "History", "view", v.VIEWS, field="view")
    assert "string" in fails(v.choice, 1, "view", v.VIEWS, field="view")


# -- metadata_json ------------------------------------------------------------------------------


def md(data: Any) -> Metadata:
    return v.metadata_json(json.dumps(data)).apply()


def test_metadata_defaults() -> None:
    assert v.metadata_json(None).apply() == DEFAULT_METADATA
    assert md({}) == DEFAULT_METADATA
    assert md({}).to_json() == {
        "tags": [],
        "memory_tier": "short",
        "memory_kind": "conversation",
        "importance": 50,
        "relations": [],
        "source_message_ids": [],
    }


def test_metadata_json_must_be_an_object_string() -> None:
    for bad in ("[]", '"x"', "1", "null", "true"):
        assert "object" in fails(v.metadata_json, bad, field="metadata_json")
    fails(v.metadata_json, "{", field="metadata_json")
    fails(v.metadata_json, "", field="metadata_json")
    fails(v.metadata_json, {"tags": []}, field="metadata_json")  # a dict, not a string
    fails(v.metadata_json, '{"importance": NaN}', field="metadata_json")
    assert "repeat" in fails(v.metadata_json, '{"tags":[],"tags":[]}', field="metadata_json")
    fails(v.metadata_json, "[" * 100_000 + "]" * 100_000, field="metadata_json")
    too_big = json.dumps({"summary": "a" * limits.METADATA_JSON_MAX_BYTES})
    fails(v.metadata_json, too_big, field="metadata_json")


def test_unknown_metadata_field_is_named() -> None:
    msg = fails(v.metadata_json, '{"deleted": false}', field="metadata_json")
    assert '"deleted"' in msg and "unknown field" in msg
    msg = fails(v.metadata_json, json.dumps({"k" * 500: 1}), field="metadata_json")
    assert len(msg) < 400


def test_tool_call_id() -> None:
    assert md({"tool_call_id": "c" * limits.TOOL_CALL_ID_MAX_BYTES}).tool_call_id is not None
    fails(
        v.metadata_json,
        json.dumps({"tool_call_id": "c" * (limits.TOOL_CALL_ID_MAX_BYTES + 1)}),
        field="metadata_json.tool_call_id",
    )
    assert md({"tool_call_id": ""}).tool_call_id == ""
    assert md({"tool_call_id": None}).tool_call_id is None
    fails(v.metadata_json, '{"tool_call_id": 5}', field="metadata_json.tool_call_id")


def test_tags() -> None:
    tags = [f"t{i}" for i in range(limits.TAGS_MAX_ITEMS)]
    assert md({"tags": tags}).tags == tuple(tags)
    fails(
        v.metadata_json,
        json.dumps({"tags": [*tags, "x"]}),
        field="metadata_json.tags",
    )
    assert md({"tags": ["a" * limits.TAG_MAX_BYTES]}).tags == ("a" * limits.TAG_MAX_BYTES,)
    fails(
        v.metadata_json,
        json.dumps({"tags": ["a" * (limits.TAG_MAX_BYTES + 1)]}),
        field="metadata_json.tags[0]",
    )
    fails(v.metadata_json, '{"tags": ["ok", ""]}', field="metadata_json.tags[1]")
    fails(v.metadata_json, '{"tags": "x"}', field="metadata_json.tags")
    fails(v.metadata_json, '{"tags": [1]}', field="metadata_json.tags[0]")
    fails(v.metadata_json, '{"tags": null}', field="metadata_json.tags")
    # Duplicates are removed, first occurrence kept, order preserved.
    assert md({"tags": ["b", "a", "b", "設計"]}).tags == ("b", "a", "設計")


@pytest.mark.parametrize(
    ("key", "values"),
    [
        ("memory_tier", ("short", "mid", "long", "discard")),
        (
            "memory_kind",
            ("conversation", "episode", "semantic", "procedure", "preference", "summary"),
        ),
    ],
)
def test_enums(key: str, values: tuple[str, ...]) -> None:
    for value in values:
        assert getattr(md({key: value}), key) == value
    fails(v.metadata_json, json.dumps({key: "other"}), field=f"metadata_json.{key}")
    fails(v.metadata_json, json.dumps({key: None}), field=f"metadata_json.{key}")


def test_importance() -> None:
    assert md({"importance": 0}).importance == 0
    assert md({"importance": 100}).importance == 100
    for bad in (-1, 101, 50.5, 50.0, True, "50", None):
        fails(v.metadata_json, json.dumps({"importance": bad}), field="metadata_json.importance")


def test_summary() -> None:
    assert md({"summary": "s" * limits.SUMMARY_MAX_BYTES}).summary == "s" * limits.SUMMARY_MAX_BYTES
    fails(
        v.metadata_json,
        json.dumps({"summary": "s" * (limits.SUMMARY_MAX_BYTES + 1)}),
        field="metadata_json.summary",
    )
    assert md({"summary": ""}).summary is None
    assert "summary" not in md({"summary": ""}).to_json()
    assert md({"summary": None}).summary is None


def test_relations() -> None:
    rels = [{"type": t, "message_id": ULID_A} for t in ("depends_on", "derived_from")]
    assert md({"relations": rels}).relations == (
        Relation("depends_on", ULID_A),
        Relation("derived_from", ULID_A),
    )
    many = [{"type": "related_to", "message_id": ULID_B}] * limits.RELATIONS_MAX_ITEMS
    assert md({"relations": many}).relations == (Relation("related_to", ULID_B),)  # deduped
    fails(
        v.metadata_json,
        json.dumps({"relations": [*many, many[0]]}),
        field="metadata_json.relations",
    )
    for t in ("depends_on", "derived_from", "supersedes", "related_to"):
        assert md({"relations": [{"type": t, "message_id": ULID_A}]}).relations[0].type == t
    base = "metadata_json.relations[0]"
    fails(
        v.metadata_json,
        json.dumps({"relations": [{"type": "x", "message_id": ULID_A}]}),
        field=f"{base}.type",
    )
    fails(
        v.metadata_json,
        json.dumps({"relations": [{"type": "related_to"}]}),
        field=f"{base}.message_id",
    )
    fails(
        v.metadata_json, json.dumps({"relations": [{"message_id": ULID_A}]}), field=f"{base}.type"
    )
    fails(
        v.metadata_json,
        json.dumps({"relations": [{"type": "related_to", "message_id": ULID_A.lower()}]}),
        field=f"{base}.message_id",
    )
    fails(
        v.metadata_json,
        json.dumps({"relations": [{"type": "related_to", "message_id": ULID_A, "w": 1}]}),
        field=base,
    )
    fails(v.metadata_json, json.dumps({"relations": ["x"]}), field=base)
    fails(v.metadata_json, json.dumps({"relations": {}}), field="metadata_json.relations")


def test_source_message_ids() -> None:
    ids = [ULID_A[:-2] + f"{i:02d}" for i in range(limits.SOURCE_IDS_MAX_ITEMS)]
    assert md({"source_message_ids": ids}).source_message_ids == tuple(ids)
    fails(
        v.metadata_json,
        json.dumps({"source_message_ids": [*ids, ULID_B]}),
        field="metadata_json.source_message_ids",
    )
    fails(
        v.metadata_json,
        json.dumps({"source_message_ids": [ULID_A, "short"]}),
        field="metadata_json.source_message_ids[1]",
    )
    assert md({"source_message_ids": [ULID_A, ULID_A]}).source_message_ids == (ULID_A,)


def test_patch_keeps_absent_fields() -> None:
    base = md({"tags": ["a"], "importance": 90, "summary": "s", "tool_call_id": "c"})
    patched = v.metadata_json('{"importance": 10}').apply(base)
    assert patched.tags == ("a",) and patched.summary == "s" and patched.tool_call_id == "c"
    assert patched.importance == 10
    assert v.metadata_json('{"summary": ""}').apply(base).summary is None
    assert v.metadata_json("{}").apply(base) is base


# -- relation_types_json / filters_json ---------------------------------------------------------


def test_relation_types_json() -> None:
    assert v.relation_types_json(None) == frozenset(
        ("depends_on", "derived_from", "supersedes", "related_to")
    )
    assert v.relation_types_json('["supersedes"]') == frozenset(("supersedes",))
    assert v.relation_types_json("[]") == frozenset()
    fails(v.relation_types_json, '["nope"]', field="relation_types_json[0]")
    fails(v.relation_types_json, '{"a":1}', field="relation_types_json")
    fails(v.relation_types_json, "not json", field="relation_types_json")
    fails(v.relation_types_json, ["supersedes"], field="relation_types_json")


def test_filters_json() -> None:
    f = v.filters_json('{"kinds":["semantic","preference"],"tiers":["mid"],"tags":["p","q"]}')
    assert f.kinds == {"semantic", "preference"} and f.tiers == {"mid"} and f.tags == {"p", "q"}
    assert v.filters_json(None).empty and v.filters_json("{}").empty
    assert v.filters_json('{"kinds":[]}').empty
    assert "unknown filter" in fails(v.filters_json, '{"kind":["semantic"]}', field="filters_json")
    fails(v.filters_json, '{"kinds":["x"]}', field="filters_json.kinds[0]")
    fails(v.filters_json, '{"tiers":["x"]}', field="filters_json.tiers[0]")
    fails(v.filters_json, '{"tags":[""]}', field="filters_json.tags[0]")
    fails(v.filters_json, '{"tags":null}', field="filters_json.tags")
    fails(v.filters_json, "[]", field="filters_json")
    semantic_mid = md({"memory_kind": "semantic", "memory_tier": "mid", "tags": ["p", "q", "r"]})
    assert f.accepts(semantic_mid)
    assert not f.accepts(md({"memory_kind": "semantic", "memory_tier": "mid", "tags": ["p"]}))
    assert not f.accepts(md({"memory_kind": "semantic", "memory_tier": "long", "tags": ["p", "q"]}))
    assert not f.accepts(md({"memory_kind": "episode", "memory_tier": "mid", "tags": ["p", "q"]}))
