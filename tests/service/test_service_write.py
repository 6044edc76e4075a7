"""write_message and update_message: every row of seed 000's tables, every error code."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from svc_helpers import io_counters, write
from tool_calls import ToolCalls
from ulid import ULID

from convmem_engine.domain import ConflictError, NotFoundError, ValidationError, limits
from convmem_engine.service import MemoryService

MISSING = "01ARZ3NDEKTSV4RRFFQ69G5FAV"


def verr(fn: Any, field: str, **kwargs: Any) -> str:
    with pytest.raises(ValidationError) as err:
        fn(**kwargs)
    assert err.value.message.startswith(field), err.value.message
    return err.value.message


# -- write_message ------------------------------------------------------------------------------


def test_write_returns_the_message_object(svc: MemoryService) -> None:
    before = time.time_ns() // 1_000_000
    result = svc.write_message(session_id="conversation-1", role="user", content="Remember this")
    after = time.time_ns() // 1_000_000
    assert result["status"] == "OK" and set(result) == {"status", "message"}
    m = result["message"]
    assert set(m) == {
        "message_id",
        "session_id",
        "timestamp",
        "role",
        "content",
        "revision",
        "updated_at",
        "metadata",
    }
    assert ULID.from_str(m["message_id"]).milliseconds == m["timestamp"]
    assert before <= m["timestamp"] <= after
    assert m["updated_at"] == m["timestamp"] and m["revision"] == 1
    assert m["metadata"] == {
        "tags": [],
        "memory_tier": "short",
        "memory_kind": "conversation",
        "importance": 50,
        "relations": [],
        "source_message_ids": [],
    }
    assert m["session_id"] == "conversation-1" and m["content"] == "Remember this"


def test_write_with_every_metadata_field(svc: MemoryService) -> None:
    target = write(svc, "target")
    md = {
        "tool_call_id": "call-1",
        "tags": ["project", "decision", "設計", "🎉"],
        "memory_tier": "long",
        "memory_kind": "semantic",
        "importance": 80,
        "summary": "optional summary",
        "relations": [{"type": "derived_from", "message_id": target}],
        "source_message_ids": [MISSING],
    }
    m = svc.write_message(
        session_id="s", role="assistant", content="x", metadata_json=json.dumps(md)
    )
    assert m["message"]["metadata"] == md


def test_ids_strictly_increase(svc: MemoryService) -> None:
    ids = [write(svc, f"m{i}") for i in range(50)]
    assert ids == sorted(ids) and len(set(ids)) == 50


def test_ids_increase_when_the_clock_goes_back(tmp_path: Path) -> None:
    now = [2_000_000_000_000]
    s = ToolCalls.open(tmp_path / "d", clock=lambda: now[0])
    try:
        a = write(s)
        now[0] -= 10_000  # the clock steps back ten seconds
        b = write(s)
        assert b > a
        assert ULID.from_str(b).milliseconds == 2_000_000_000_000
    finally:
        s.close()
    # After a restart with the clock still behind, ids keep increasing.
    s = ToolCalls.open(tmp_path / "d", clock=lambda: now[0])
    try:
        assert write(s) > b
    finally:
        s.close()


@pytest.mark.parametrize("role", ["user", "assistant", "system"])
def test_roles(svc: MemoryService, role: str) -> None:
    assert svc.write_message(session_id="s", role=role, content="c")["message"]["role"] == role


def test_write_bounds(svc: MemoryService) -> None:
    ok = dict(session_id="s", role="user", content="c")
    svc.write_message(**{**ok, "session_id": "a" * limits.SESSION_ID_MAX_BYTES})
    verr(svc.write_message, "session_id", **{**ok, "session_id": "a" * 257})
    verr(svc.write_message, "session_id", **{**ok, "session_id": ""})
    svc.write_message(**{**ok, "content": "x"})
    svc.write_message(**{**ok, "content": "x" * limits.CONTENT_MAX_BYTES})
    verr(svc.write_message, "content", **{**ok, "content": "x" * (limits.CONTENT_MAX_BYTES + 1)})
    verr(svc.write_message, "content", **{**ok, "content": ""})
    verr(svc.write_message, "content", **{**ok, "content": "\udc80"})
    verr(svc.write_message, "role", **{**ok, "role": "tool"})
    verr(svc.write_message, "session_id", **{**ok, "session_id": 7})
    verr(svc.write_message, "metadata_json", **ok, metadata_json="[]")
    verr(svc.write_message, "metadata_json.importance", **ok, metadata_json='{"importance":101}')
    verr(svc.write_message, "metadata_json", **ok, metadata_json='{"mystery":1}')
    assert verr(svc.write_message, "content", session_id="s", role="user") == "content: required"
    with pytest.raises(TypeError):  # the typed operation itself: Python's own check
        svc.service.write_message(session_id="s", role="user")


def test_write_nothing_on_validation_error(svc: MemoryService) -> None:
    before = io_counters(svc)
    with pytest.raises(ValidationError):
        svc.write_message(session_id="s", role="user", content="c", metadata_json='{"tags":[""]}')
    assert io_counters(svc) == before
    assert svc.get_system_health()["active_messages"] == 0


def test_relation_targets_must_be_live(svc: MemoryService) -> None:
    rel = json.dumps({"relations": [{"type": "depends_on", "message_id": MISSING}]})
    msg = verr(
        svc.write_message,
        "metadata_json.relations[0].message_id",
        session_id="s",
        role="user",
        content="c",
        metadata_json=rel,
    )
    assert "live message" in msg
    target = write(svc)
    svc.delete_message(message_id=target)
    rel = json.dumps({"relations": [{"type": "depends_on", "message_id": target}]})
    verr(
        svc.write_message,
        "metadata_json.relations[0]",
        session_id="s",
        role="user",
        content="c",
        metadata_json=rel,
    )


def test_kept_relation_to_a_deleted_target_does_not_block_updates(svc: MemoryService) -> None:
    target = write(svc, "target")
    other = write(svc, "other")
    src = write(svc, "src", relations=[{"type": "depends_on", "message_id": target}])
    svc.delete_message(message_id=target)
    # Unrelated update: fine. Adding a relation while keeping the dangling one: fine.
    svc.update_message(message_id=src, content="src2")
    rels = [
        {"type": "depends_on", "message_id": target},
        {"type": "related_to", "message_id": other},
    ]
    out = svc.update_message(message_id=src, metadata_json=json.dumps({"relations": rels}))
    assert out["message"]["metadata"]["relations"] == rels
    # A relation to itself is rejected.
    own = json.dumps({"relations": [{"type": "related_to", "message_id": src}]})
    assert "itself" in verr(
        svc.update_message, "metadata_json.relations[0]", message_id=src, metadata_json=own
    )


# -- update_message -----------------------------------------------------------------------------


def test_update_content_and_metadata(svc: MemoryService) -> None:
    mid = write(svc, "old", tags=["a"], importance=70, summary="sum")
    first = svc.read_messages(view="content", message_id=mid)["content_range"]
    out = svc.update_message(message_id=mid, content="new content", expected_revision=1)
    assert out["status"] == "OK" and out["changed"] is True
    m = out["message"]
    assert m["content"] == "new content" and m["revision"] == 2
    assert m["metadata"]["tags"] == ["a"] and m["metadata"]["importance"] == 70
    assert m["updated_at"] >= m["timestamp"]
    out = svc.update_message(message_id=mid, metadata_json='{"importance": 10, "summary": ""}')
    m = out["message"]
    assert m["revision"] == 3 and m["metadata"]["importance"] == 10
    assert "summary" not in m["metadata"] and m["metadata"]["tags"] == ["a"]
    assert m["content"] == "new content"
    # identity, session, role and creation time never change
    assert (m["message_id"], m["session_id"], m["role"]) == (mid, "s1", "user")
    assert first["revision"] == 1


def test_identical_update_is_a_no_op(svc: MemoryService) -> None:
    mid = write(svc, "same", tags=["a", "b"], importance=70)
    before = io_counters(svc)
    health = svc.get_system_health()
    for kwargs in (
        {"content": "same"},
        {"metadata_json": '{"tags": ["a", "b"], "importance": 70}'},
        {"metadata_json": "{}"},
        {"content": "same", "metadata_json": '{"memory_tier": "short"}'},
        {"metadata_json": '{"summary": ""}'},  # already unset
    ):
        out = svc.update_message(message_id=mid, **kwargs)
        assert out["changed"] is False, kwargs
        assert out["message"]["revision"] == 1
    assert io_counters(svc) == before
    after = svc.get_system_health()
    assert after["last_sequence"] == health["last_sequence"]
    assert after["log_size"] == health["log_size"]


def test_update_errors(svc: MemoryService) -> None:
    mid = write(svc)
    verr(svc.update_message, "content, metadata_json", message_id=mid)
    verr(svc.update_message, "message_id", message_id="nope", content="x")
    verr(svc.update_message, "message_id", message_id=mid.lower(), content="x")
    verr(svc.update_message, "content", message_id=mid, content="")
    verr(
        svc.update_message, "content", message_id=mid, content="x" * (limits.CONTENT_MAX_BYTES + 1)
    )
    verr(svc.update_message, "expected_revision", message_id=mid, content="x", expected_revision=0)
    verr(
        svc.update_message, "expected_revision", message_id=mid, content="x", expected_revision=True
    )
    verr(svc.update_message, "metadata_json.tags", message_id=mid, metadata_json='{"tags":"x"}')
    with pytest.raises(ConflictError) as conflict:
        svc.update_message(message_id=mid, content="x", expected_revision=2)
    assert conflict.value.code == "CONFLICT"
    with pytest.raises(NotFoundError) as missing:
        svc.update_message(message_id=MISSING, content="x")
    assert missing.value.code == "NOT_FOUND"
    svc.delete_message(message_id=mid)
    with pytest.raises(NotFoundError):
        svc.update_message(message_id=mid, content="x")
    with pytest.raises(NotFoundError):  # NOT_FOUND before CONFLICT
        svc.update_message(message_id=mid, content="x", expected_revision=5)


def test_update_content_bound(svc: MemoryService) -> None:
    mid = write(svc)
    out = svc.update_message(message_id=mid, content="y" * limits.CONTENT_MAX_BYTES)
    assert out["changed"] and len(out["message"]["content"]) == limits.CONTENT_MAX_BYTES


def test_update_survives_reopen(tmp_path: Path) -> None:
    s = ToolCalls.open(tmp_path / "d")
    mid = write(s, "v1")
    s.update_message(message_id=mid, content="v2", metadata_json='{"tags":["t"]}')
    s.close()
    s = ToolCalls.open(tmp_path / "d")
    try:
        m = s.read_messages(session_id="s1")["history"][0]
        assert (m["content"], m["revision"], m["metadata"]["tags"]) == ("v2", 2, ["t"])
        assert s.check() == []
    finally:
        s.close()


def test_cjk_emoji_combining_roundtrip(svc: MemoryService) -> None:
    text = "設計の決定 👩‍💻 Cafe\u0301 한국어"
    mid = write(svc, text, session="セッション🎉", tags=["設計", "e\u0301", "👩‍💻"])
    m = svc.read_messages(session_id="セッション🎉")["history"][0]
    assert m["content"] == text and m["metadata"]["tags"] == ["設計", "e\u0301", "👩‍💻"]
    assert m["message_id"] == mid
