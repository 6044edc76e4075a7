"""read_messages: the history, content, context and sessions views, cursors and the budget."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from svc_helpers import io_counters, write
from tool_calls import ToolCalls

from convmem_engine.domain import ConflictError, NotFoundError, ValidationError, limits
from convmem_engine.service import MemoryService, result_json

MISSING = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
KINDS = ("conversation", "episode", "semantic", "procedure", "preference", "summary")


def verr(svc: MemoryService, field: str, **kwargs: Any) -> str:
    with pytest.raises(ValidationError) as err:
        svc.read_messages(**kwargs)
    assert err.value.message.startswith(field), err.value.message
    return err.value.message


def all_pages(svc: MemoryService, **kwargs: Any) -> list[list[dict[str, Any]]]:
    key = "sessions" if kwargs.get("view") == "sessions" else "history"
    pages = []
    cursor = None
    while True:
        out = svc.read_messages(**kwargs, cursor=cursor)
        pages.append(out[key])
        cursor = out.get("nextCursor")
        if cursor is None:
            return pages


# -- common parameters --------------------------------------------------------------------------


def test_common_parameter_bounds(svc: MemoryService) -> None:
    write(svc)
    assert svc.read_messages(session_id="s1", limit=1)["history"]
    assert svc.read_messages(session_id="s1", limit=1000)["history"]
    verr(svc, "limit", session_id="s1", limit=0)
    verr(svc, "limit", session_id="s1", limit=1001)
    verr(svc, "limit", session_id="s1", limit=True)
    verr(svc, "limit", session_id="s1", limit="5")
    verr(svc, "view", view="all")
    verr(svc, "cursor", session_id="s1", cursor=5)
    # arguments of other views are validated too, then ignored
    verr(svc, "before", session_id="s1", before=11)
    verr(svc, "content_limit", view="sessions", content_limit=0)
    assert svc.read_messages(session_id="s1", before=10)["history"]


def test_view_defaults_to_history(svc: MemoryService) -> None:
    mid = write(svc)
    assert svc.read_messages(session_id="s1") == svc.read_messages(view="history", session_id="s1")
    assert svc.read_messages(session_id="s1")["history"][0]["message_id"] == mid


# -- history ------------------------------------------------------------------------------------


def test_history_creation_order_and_paging(svc: MemoryService) -> None:
    ids = [write(svc, f"m{i}", session="a" if i % 3 else "b") for i in range(30)]
    a_ids = [mid for i, mid in enumerate(ids) if i % 3]
    pages = all_pages(svc, session_id="a", limit=7)
    assert [len(p) for p in pages] == [7, 7, 6]
    assert [m["message_id"] for p in pages for m in p] == a_ids
    assert all(m["session_id"] == "a" for p in pages for m in p)
    # exact multiple of the limit: the last full page carries a cursor, the next page is empty
    pages = all_pages(svc, session_id="a", limit=10)
    assert [len(p) for p in pages] == [10, 10]
    one = svc.read_messages(session_id="a", limit=20)
    assert "nextCursor" not in one and len(one["history"]) == 20
    assert svc.read_messages(session_id="a", limit=100)["history"][0]["message_id"] == a_ids[0]


def test_history_missing_session_and_required_param(svc: MemoryService) -> None:
    assert svc.read_messages(session_id="nobody") == {"history": []}
    verr(svc, "session_id")
    verr(svc, "session_id", session_id="x" * (limits.SESSION_ID_MAX_BYTES + 1))
    assert svc.read_messages(session_id="x" * limits.SESSION_ID_MAX_BYTES) == {"history": []}


def test_history_cursor_is_opaque_and_bound(svc: MemoryService) -> None:
    for i in range(5):
        write(svc, f"a{i}", session="a")
        write(svc, f"b{i}", session="b")
    cursor = svc.read_messages(session_id="a", limit=2)["nextCursor"]
    assert isinstance(cursor, str) and len(cursor) <= 256
    assert "a" not in json.loads(base64.urlsafe_b64decode(cursor + "==")).get("scope", "a")
    assert "another session" in verr(svc, "cursor", session_id="b", cursor=cursor)
    assert "another view" in verr(svc, "cursor", view="sessions", cursor=cursor)
    verr(svc, "cursor", session_id="a", cursor="garbage!")
    verr(svc, "cursor", session_id="a", cursor="")
    verr(svc, "cursor", session_id="a", cursor="e30")  # "{}"
    verr(svc, "cursor", session_id="a", cursor="A" * 300)
    verr(svc, "cursor", view="content", message_id=MISSING, cursor=cursor)
    sessions_cursor = svc.read_messages(view="sessions", limit=1)["nextCursor"]
    verr(svc, "cursor", session_id="a", cursor=sessions_cursor)


def test_history_cursor_survives_writes_and_deletes(svc: MemoryService) -> None:
    ids = [write(svc, f"m{i}") for i in range(6)]
    out = svc.read_messages(session_id="s1", limit=3)
    assert [m["message_id"] for m in out["history"]] == ids[:3]
    svc.delete_message(message_id=ids[2])  # the cursor's own message
    svc.delete_message(message_id=ids[1])  # an earlier one
    new = write(svc, "later")
    rest = svc.read_messages(session_id="s1", cursor=out["nextCursor"])
    assert [m["message_id"] for m in rest["history"]] == [*ids[3:], new]


def test_history_budget_cuts_the_page_with_a_cursor(svc: MemoryService) -> None:
    big = "x" * limits.CONTENT_MAX_BYTES  # the real 8 MiB budget: 7 of these fit
    ids = [write(svc, big) for i in range(9)]
    out = svc.read_messages(session_id="s1", limit=1000)
    n = len(out["history"])
    assert n == 7 and "nextCursor" in out
    assert len(result_json(out).encode()) <= limits.RESPONSE_BUDGET_BYTES
    pages = all_pages(svc, session_id="s1", limit=1000)
    assert [m["message_id"] for p in pages for m in p] == ids
    for page in pages:
        assert len(result_json({"history": page}).encode()) <= limits.RESPONSE_BUDGET_BYTES


# -- content ------------------------------------------------------------------------------------


def chunks(svc: MemoryService, mid: str, limit: int) -> list[dict[str, Any]]:
    out = []
    offset = 0
    revision = None
    while True:
        r = svc.read_messages(
            view="content",
            message_id=mid,
            content_offset=offset,
            content_limit=limit,
            expected_revision=revision,
        )["content_range"]
        out.append(r)
        revision = r["revision"]
        offset = r["next_content_offset"]
        if r["complete"]:
            return out


def test_content_fields_and_defaults(svc: MemoryService) -> None:
    text = "a" * 14420
    mid = write(svc, text)
    r = svc.read_messages(view="content", message_id=mid)["content_range"]
    assert r == {
        "message_id": mid,
        "revision": 1,
        "total_bytes": 14420,
        "content_offset": 0,
        "next_content_offset": 4096,
        "complete": False,
        "content": "a" * 4096,
    }
    parts = chunks(svc, mid, limits.CONTENT_LIMIT_MAX)
    assert len(parts) == 1 and parts[0]["complete"] and parts[0]["content"] == text


def test_content_shortens_to_a_code_point_boundary(svc: MemoryService) -> None:
    # 4095 ASCII bytes then 3-byte characters: a 4096-byte limit falls inside one
    text = "a" * 4095 + "設" * 4000
    mid = write(svc, text)
    r = svc.read_messages(view="content", message_id=mid, content_limit=4096)["content_range"]
    assert r["next_content_offset"] == 4095 and r["content"] == "a" * 4095
    r = svc.read_messages(view="content", message_id=mid, content_offset=4095, content_limit=4096)[
        "content_range"
    ]
    assert r["next_content_offset"] == 4095 + 4095  # 1365 whole characters
    for limit in (1, 2, 3, 4, 5, 7, 100, 4096):
        parts = chunks(svc, mid, limit)
        assert "".join(p["content"] for p in parts) == text
        assert all(len(p["content"].encode()) <= max(limit, 3) for p in parts)


@pytest.mark.parametrize("char", ["é", "設", "🎉"])
def test_content_one_code_point_exception(svc: MemoryService, char: str) -> None:
    width = len(char.encode())
    mid = write(svc, char * 3)
    for limit in range(1, width):
        r = svc.read_messages(view="content", message_id=mid, content_limit=limit)
        r = r["content_range"]
        assert r["content"] == char and r["next_content_offset"] == width  # up to 3 over
        assert width - limit <= 3
    r = svc.read_messages(view="content", message_id=mid, content_limit=width + 1)
    assert r["content_range"]["content"] == char  # shortened, not extended
    combining = write(svc, "e\u0301" * 2)  # code points, not grapheme clusters
    r = svc.read_messages(view="content", message_id=combining, content_limit=2)["content_range"]
    assert r["content"] == "e" and r["next_content_offset"] == 1


def test_content_offsets(svc: MemoryService) -> None:
    mid = write(svc, "ab設c")  # bytes: a b E8 A8 AD c  (6)
    at = svc.read_messages
    r = at(view="content", message_id=mid, content_offset=6)["content_range"]
    assert r["content"] == "" and r["complete"] and r["next_content_offset"] == 6
    r = at(view="content", message_id=mid, content_offset=2, content_limit=3)["content_range"]
    assert r["content"] == "設" and r["next_content_offset"] == 5
    for bad in (3, 4):
        assert "boundary" in verr(
            svc, "content_offset", view="content", message_id=mid, content_offset=bad
        )
    assert "end" in verr(svc, "content_offset", view="content", message_id=mid, content_offset=7)
    verr(svc, "content_offset", view="content", message_id=mid, content_offset=-1)
    verr(svc, "content_limit", view="content", message_id=mid, content_limit=0)
    verr(svc, "content_limit", view="content", message_id=mid, content_limit=65537)
    assert at(view="content", message_id=mid, content_limit=65536)["content_range"]["complete"]
    verr(svc, "message_id", view="content")
    verr(svc, "message_id", view="content", message_id="bad")
    verr(svc, "expected_revision", view="content", message_id=mid, expected_revision=0)


def test_content_errors_and_revision(svc: MemoryService) -> None:
    mid = write(svc, "abc")
    with pytest.raises(NotFoundError):
        svc.read_messages(view="content", message_id=MISSING)
    with pytest.raises(ConflictError):
        svc.read_messages(view="content", message_id=mid, expected_revision=2)
    svc.update_message(message_id=mid, content="abcd")
    r = svc.read_messages(view="content", message_id=mid, expected_revision=2)["content_range"]
    assert r["revision"] == 2 and r["content"] == "abcd"
    svc.delete_message(message_id=mid)
    with pytest.raises(NotFoundError):
        svc.read_messages(view="content", message_id=mid)


def test_reads_change_no_state(svc: MemoryService) -> None:
    mid = write(svc, "設計 " * 3000, tags=["t"])
    write(svc, "other")
    before = io_counters(svc)
    health = svc.get_system_health()
    chunks(svc, mid, 100)
    svc.read_messages(session_id="s1")
    svc.read_messages(view="context", message_id=mid)
    svc.read_messages(view="sessions")
    svc.search_messages(query="設計", context_size=3)
    assert io_counters(svc) == before
    after = svc.get_system_health()
    for key in ("log_size", "last_sequence", "update_records", "dead_bytes", "active_messages"):
        assert after[key] == health[key]


# -- context ------------------------------------------------------------------------------------


def test_context_shape_and_neighbours(svc: MemoryService) -> None:
    ids = [write(svc, f"m{i}") for i in range(25)]
    write(svc, "elsewhere", session="other")
    out = svc.read_messages(view="context", message_id=ids[12])
    assert set(out) == {"message", "chronological_context", "relations", "session", "truncated"}
    assert out["message"]["message_id"] == ids[12]
    ctx = out["chronological_context"]
    assert [m["message_id"] for m in ctx["before"]] == [ids[11]]
    assert [m["message_id"] for m in ctx["after"]] == [ids[13]]
    assert out["session"] == {"session_id": "s1", "message_count": 25}
    assert out["relations"] == [] and out["truncated"] is False
    out = svc.read_messages(view="context", message_id=ids[12], before=10, after=10)
    ctx = out["chronological_context"]
    assert [m["message_id"] for m in ctx["before"]] == ids[2:12]
    assert [m["message_id"] for m in ctx["after"]] == ids[13:23]
    out = svc.read_messages(view="context", message_id=ids[1], before=10, after=0)
    assert [m["message_id"] for m in out["chronological_context"]["before"]] == ids[:1]
    assert out["chronological_context"]["after"] == []
    for name in ("before", "after"):
        verr(svc, name, view="context", message_id=ids[0], **{name: 11})
        verr(svc, name, view="context", message_id=ids[0], **{name: -1})
    verr(svc, "relation_depth", view="context", message_id=ids[0], relation_depth=3)
    verr(svc, "relation_depth", view="context", message_id=ids[0], relation_depth=-1)
    verr(svc, "message_id", view="context")
    with pytest.raises(NotFoundError):
        svc.read_messages(view="context", message_id=MISSING)


def rel(kind: str, target: str) -> dict[str, str]:
    return {"type": kind, "message_id": target}


def test_context_relations_both_directions_and_depth(svc: MemoryService) -> None:
    a = write(svc, "a")
    b = write(svc, "b", relations=[rel("derived_from", a)])
    c = write(svc, "c", relations=[rel("depends_on", b)])
    d = write(svc, "d", relations=[rel("supersedes", c)])
    out = svc.read_messages(view="context", message_id=b, before=0, after=0)
    got = [
        (r["type"], r["direction"], r["depth"], r["message"]["message_id"])
        for r in out["relations"]
    ]
    assert got == [("derived_from", "outgoing", 1, a), ("depends_on", "incoming", 1, c)]
    out = svc.read_messages(view="context", message_id=b, before=0, after=0, relation_depth=2)
    got = [
        (r["type"], r["direction"], r["depth"], r["message"]["message_id"])
        for r in out["relations"]
    ]
    assert got == [
        ("derived_from", "outgoing", 1, a),
        ("depends_on", "incoming", 1, c),
        ("supersedes", "incoming", 2, d),
    ]
    out = svc.read_messages(view="context", message_id=b, relation_depth=0)
    assert out["relations"] == []
    out = svc.read_messages(
        view="context", message_id=b, relation_depth=2, relation_types_json='["depends_on"]'
    )
    assert [r["message"]["message_id"] for r in out["relations"]] == [c]
    out = svc.read_messages(view="context", message_id=b, relation_types_json="[]")
    assert out["relations"] == []
    verr(svc, "relation_types_json", view="context", message_id=b, relation_types_json='["x"]')
    verr(svc, "relation_types_json", view="context", message_id=b, relation_types_json="{}")


def test_context_deleted_target(svc: MemoryService) -> None:
    a = write(svc, "a")
    b = write(svc, "b", relations=[rel("derived_from", a)])
    svc.delete_message(message_id=a)
    out = svc.read_messages(view="context", message_id=b, relation_depth=2)
    assert out["relations"] == [
        {
            "type": "derived_from",
            "direction": "outgoing",
            "depth": 1,
            "message_id": a,
            "status": "deleted",
        }
    ]
    # the deleted message's own outgoing relations are gone from everyone's incoming side
    c = write(svc, "c")
    e = write(svc, "e", relations=[rel("related_to", c)])
    svc.delete_message(message_id=e)
    assert svc.read_messages(view="context", message_id=c)["relations"] == []


def test_context_cap_and_truncated(svc: MemoryService) -> None:
    hub = write(svc, "hub", session="hub")
    for i in range(60):
        write(svc, f"spoke{i}", session="spokes", relations=[rel("related_to", hub)])
    out = svc.read_messages(view="context", message_id=hub, before=10, after=10)
    assert out["truncated"] is True
    assert 1 + len(out["relations"]) == limits.CONTEXT_MAX_MESSAGES
    small = svc.read_messages(view="context", message_id=hub, relation_types_json='["depends_on"]')
    assert small["truncated"] is False


SMALL_BUDGET = 64 * 1024


@pytest.fixture
def small(tmp_path: Path) -> Iterator[MemoryService]:
    """A service with a 64 KiB response budget (the same code path as 8 MiB, 128x cheaper)."""
    service = ToolCalls.open(tmp_path / "small", response_budget=SMALL_BUDGET)
    yield service
    service.close()


def test_context_budget(small: MemoryService) -> None:
    svc = small
    big = "y" * (SMALL_BUDGET // 8)
    ids = [write(svc, big) for _ in range(21)]
    out = svc.read_messages(view="context", message_id=ids[10], before=10, after=10)
    assert out["truncated"] is True
    assert len(result_json(out).encode()) <= SMALL_BUDGET
    ctx = out["chronological_context"]
    assert ctx["before"][-1]["message_id"] == ids[9] and ctx["after"][0]["message_id"] == ids[11]


# -- sessions -----------------------------------------------------------------------------------


def test_sessions_entry_fields(svc: MemoryService) -> None:
    first = svc.write_message(session_id="c1", role="user", content="one")["message"]
    write(svc, "two", session="c1", memory_kind="semantic")
    write(svc, "three", session="c1", memory_kind="semantic", summary="the summary")
    last = svc.write_message(session_id="c1", role="user", content="four")["message"]
    out = svc.read_messages(view="sessions")
    assert "nextCursor" not in out
    (entry,) = out["sessions"]
    assert entry == {
        "session_id": "c1",
        "message_count": 4,
        "kind_counts": {k: {"conversation": 2, "semantic": 2}.get(k, 0) for k in KINDS},
        "representative_summary": "the summary",
        "started_at": first["timestamp"],
        "last_message_at": last["timestamp"],
    }
    assert list(entry["kind_counts"]) == list(KINDS)


def test_representative_summary_rules(svc: MemoryService) -> None:
    long_content = "長い" * 5000  # never shortened
    write(svc, "plain", session="p")
    write(svc, long_content, session="p")
    write(svc, "kind summary", session="k", memory_kind="summary")
    write(svc, "later plain", session="k")
    a = write(svc, "x", session="m", summary="old summary")
    write(svc, "y", session="m", summary="new summary")
    write(svc, "z", session="m")
    by_id = {s["session_id"]: s for s in svc.read_messages(view="sessions")["sessions"]}
    assert by_id["p"]["representative_summary"] == long_content
    assert by_id["k"]["representative_summary"] == "kind summary"
    assert by_id["m"]["representative_summary"] == "new summary"
    del a


def test_sessions_order_paging_and_deletes(svc: MemoryService) -> None:
    names = [f"s{i:02d}" for i in range(12)]
    firsts = {}
    for name in reversed(names):  # creation order is the reverse of name order
        firsts[name] = write(svc, "m", session=name)
    for name in reversed(names):
        write(svc, "m2", session=name)
    pages = all_pages(svc, view="sessions", limit=5)
    order = [s["session_id"] for p in pages for s in p]
    assert order == list(reversed(names))  # by start time, not by name
    assert [len(p) for p in pages] == [5, 5, 2]
    # a new session during paging appears at the end; deleting a session's only messages removes it
    cursor = svc.read_messages(view="sessions", limit=5)["nextCursor"]
    write(svc, "new", session="aaa-new")
    rest = all_pages(svc, view="sessions", limit=5)
    assert [s["session_id"] for p in rest for s in p][-1] == "aaa-new"
    page = svc.read_messages(view="sessions", limit=100, cursor=cursor)["sessions"]
    assert [s["session_id"] for s in page] == [*list(reversed(names))[5:], "aaa-new"]
    verr(svc, "limit", view="sessions", limit=0)
    assert len(svc.read_messages(view="sessions", limit=1)["sessions"]) == 1
    assert svc.get_system_health()["session_count"] == 13
    # deleting a session's first message moves it to its next message's place
    svc.delete_message(message_id=firsts["s11"])
    order = [s["session_id"] for p in all_pages(svc, view="sessions", limit=5) for s in p]
    assert order.index("s11") > order.index("s10")
    for s_id in [
        firsts["s00"],
        *[m["message_id"] for m in svc.read_messages(session_id="s00")["history"]],
    ]:
        svc.delete_message(message_id=s_id)
    order = [s["session_id"] for p in all_pages(svc, view="sessions", limit=5) for s in p]
    assert "s00" not in order and svc.get_system_health()["session_count"] == 12


def test_sessions_budget(small: MemoryService) -> None:
    svc = small
    big = "z" * (SMALL_BUDGET // 8)
    for i in range(10):
        write(svc, big, session=f"big{i}")
    out = svc.read_messages(view="sessions", limit=1000)
    assert 1 <= len(out["sessions"]) < 10 and "nextCursor" in out
    assert len(result_json(out).encode()) <= SMALL_BUDGET
    pages = all_pages(svc, view="sessions", limit=1000)
    assert [s["session_id"] for p in pages for s in p] == [f"big{i}" for i in range(10)]


def test_history_default_limit_is_100(svc: MemoryService) -> None:
    ids = [write(svc, f"m{i}") for i in range(101)]
    out = svc.read_messages(session_id="s1")
    assert len(out["history"]) == limits.READ_LIMIT_DEFAULT == 100 and "nextCursor" in out
    rest = svc.read_messages(session_id="s1", cursor=out["nextCursor"])
    assert [m["message_id"] for m in rest["history"]] == ids[100:] and "nextCursor" not in rest


def test_contract_defaults_passed_explicitly(svc: MemoryService) -> None:
    mid = write(svc)
    defaults: dict[str, Any] = dict(
        limit=100,
        cursor=None,
        content_offset=0,
        content_limit=4096,
        expected_revision=None,
        before=1,
        after=1,
        relation_depth=1,
        relation_types_json=None,
    )
    assert svc.read_messages(view="history", session_id="s1", **defaults) == svc.read_messages(
        session_id="s1"
    )
    for view in ("content", "context"):
        assert svc.read_messages(view=view, message_id=mid, **defaults) == svc.read_messages(
            view=view, message_id=mid
        )
    assert svc.read_messages(view="sessions", **defaults) == svc.read_messages(view="sessions")


def test_worst_case_escaping_still_fits_the_budget(svc: MemoryService) -> None:
    mid = write(svc, "\x01" * limits.CONTENT_MAX_BYTES, summary="\x02" * limits.SUMMARY_MAX_BYTES)
    write(svc, "\x01" * limits.CONTENT_MAX_BYTES)
    out = svc.read_messages(session_id="s1")
    assert len(out["history"]) == 1 and "nextCursor" in out  # 6 MiB each once escaped
    size = len(result_json(out).encode())
    assert 6 * limits.CONTENT_MAX_BYTES < size <= limits.RESPONSE_BUDGET_BYTES
    r = svc.read_messages(view="content", message_id=mid, content_limit=65536)["content_range"]
    assert r["next_content_offset"] == 65536
