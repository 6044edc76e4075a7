"""search_messages through the service: arguments, filters, scope, output fields, budget."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from svc_helpers import io_counters, write
from tool_calls import ToolCalls

from convmem_engine.domain import ValidationError, limits
from convmem_engine.service import MemoryService, result_json


def verr(svc: MemoryService, field: str, **kwargs: Any) -> str:
    with pytest.raises(ValidationError) as err:
        svc.search_messages(**kwargs)
    assert err.value.message.startswith(field), err.value.message
    return err.value.message


def ids(out: dict[str, Any]) -> list[str]:
    return [r["message_id"] for r in out["results"]]


def test_result_fields(svc: MemoryService) -> None:
    mid = write(svc, "the database decision was made", tags=["project"])
    out = svc.search_messages(query="database")
    assert set(out) == {"results"}
    (r,) = out["results"]
    assert r["message_id"] == mid
    base = {
        "message_id",
        "session_id",
        "timestamp",
        "role",
        "content",
        "revision",
        "updated_at",
        "metadata",
    }
    extra = {"score", "score_breakdown", "matched_fields", "relation_count"}
    assert set(r) == base | extra  # context_preview only when context_size > 0
    assert set(r["score_breakdown"]) == {"content", "summary", "tags"}
    assert r["matched_fields"] == ["content"] and r["relation_count"] == 0
    assert isinstance(r["score"], float) and r["score"] > 0
    json.loads(result_json(out))


def test_query_bounds(svc: MemoryService) -> None:
    write(svc, "x")
    verr(svc, "query", query="")
    verr(svc, "query", query="q" * (limits.QUERY_MAX_BYTES + 1))
    verr(svc, "query", query=5)
    assert svc.search_messages(query="q" * limits.QUERY_MAX_BYTES) == {"results": []}
    assert svc.search_messages(query="x")["results"]


def test_parameter_bounds(svc: MemoryService) -> None:
    write(svc, "alpha")
    for name, lo, hi in (("min_importance", 0, 100), ("context_size", 0, 3), ("limit", 1, 100)):
        svc.search_messages(query="alpha", **{name: lo})
        svc.search_messages(query="alpha", **{name: hi})
        verr(svc, name, query="alpha", **{name: lo - 1})
        verr(svc, name, query="alpha", **{name: hi + 1})
        verr(svc, name, query="alpha", **{name: True})
    verr(svc, "session_id", query="alpha", session_id="")
    verr(svc, "filters_json", query="alpha", filters_json="[]")
    verr(svc, "filters_json", query="alpha", filters_json='{"kinds":["semantic"],"x":1}')


def test_limit_default_and_order(svc: MemoryService) -> None:
    for i in range(30):
        write(svc, f"common word {i}", importance=i)
    out = svc.search_messages(query="common")
    assert len(out["results"]) == limits.SEARCH_LIMIT_DEFAULT
    scores = [r["score"] for r in out["results"]]
    assert scores == sorted(scores, reverse=True)
    # equal scores: importance breaks the tie
    assert [r["metadata"]["importance"] for r in out["results"]][:3] == [29, 28, 27]
    assert len(svc.search_messages(query="common", limit=1)["results"]) == 1
    assert (
        svc.search_messages(query="common", limit=100)["results"][-1]["metadata"]["importance"] == 0
    )


def test_filters_or_inside_and_across_tags_all_of(svc: MemoryService) -> None:
    a = write(svc, "topic A", memory_kind="semantic", memory_tier="mid", tags=["p", "q"])
    b = write(svc, "topic B", memory_kind="preference", memory_tier="long", tags=["p"])
    c = write(svc, "topic C", memory_kind="episode", memory_tier="mid", tags=["p", "q"])
    write(svc, "topic D")

    def run(filters: dict[str, Any]) -> set[str]:
        return set(ids(svc.search_messages(query="topic", filters_json=json.dumps(filters))))

    assert run({"kinds": ["semantic", "preference"]}) == {a, b}
    assert run({"tiers": ["mid", "long"]}) == {a, b, c}
    assert run({"kinds": ["semantic", "preference"], "tiers": ["mid"]}) == {a}
    assert run({"tags": ["p"]}) == {a, b, c}
    assert run({"tags": ["p", "q"]}) == {a, c}
    assert run({"tags": ["p", "q"], "kinds": ["episode"]}) == {c}
    assert len(run({})) == 4


def test_min_importance_and_session_scope(svc: MemoryService) -> None:
    low = write(svc, "needle low", session="one", importance=10)
    high = write(svc, "needle high", session="two", importance=60)
    edge = write(svc, "needle edge", session="one", importance=59)
    assert set(ids(svc.search_messages(query="needle", min_importance=59))) == {high, edge}
    assert set(ids(svc.search_messages(query="needle", min_importance=60))) == {high}
    assert set(ids(svc.search_messages(query="needle", session_id="one"))) == {low, edge}
    assert ids(svc.search_messages(query="needle", session_id="nobody")) == []


def test_context_preview_and_relation_count(svc: MemoryService) -> None:
    before = [write(svc, f"before {i}") for i in range(4)]
    hit = write(
        svc, "the unique target", relations=[{"type": "related_to", "message_id": before[0]}]
    )
    after = [
        write(svc, f"after {i}", relations=[{"type": "depends_on", "message_id": hit}])
        for i in range(4)
    ]
    out = svc.search_messages(query="unique target", context_size=2)
    (r,) = out["results"]
    assert [m["message_id"] for m in r["context_preview"]["before"]] == before[2:]
    assert [m["message_id"] for m in r["context_preview"]["after"]] == after[:2]
    assert r["relation_count"] == 1 + 4  # its own outgoing + incoming from live messages
    svc.delete_message(message_id=after[0])
    (r,) = svc.search_messages(query="unique target", context_size=3)["results"]
    assert r["relation_count"] == 4
    assert [m["message_id"] for m in r["context_preview"]["after"]] == after[1:4]
    (r,) = svc.search_messages(query="unique target", context_size=0)["results"]
    assert "context_preview" not in r


def test_search_over_summary_and_tags(svc: MemoryService) -> None:
    s = write(svc, "nothing here", summary="architecture decision")
    t = write(svc, "nothing either", tags=["architecture"])
    out = svc.search_messages(query="architecture")
    by_id = {r["message_id"]: r for r in out["results"]}
    assert set(by_id) == {s, t}
    assert by_id[s]["matched_fields"] == ["summary"] and by_id[t]["matched_fields"] == ["tags"]


def test_cjk_emoji_combining_queries(svc: MemoryService) -> None:
    jp = write(svc, "データベースの設計を決めた")
    write(svc, "設備の話")  # shares 設 but not 設計
    emoji = write(svc, "party 🎉🎊 time")
    comb = write(svc, "cafe\u0301 au lait")
    tag = write(svc, "tagged", tags=["設計メモ"])
    assert set(ids(svc.search_messages(query="設計"))) == {jp, tag}
    assert ids(svc.search_messages(query="🎉🎊")) == [emoji]
    assert ids(svc.search_messages(query="cafe\u0301")) == [comb]
    assert ids(svc.search_messages(query="DATABASE")) == []  # katakana, not ASCII
    assert ids(svc.search_messages(query="PARTY")) == [emoji]  # ASCII case-folded


def test_deleted_and_updated_messages(svc: MemoryService) -> None:
    mid = write(svc, "ephemeral zebra")
    assert ids(svc.search_messages(query="zebra")) == [mid]
    svc.update_message(message_id=mid, content="ephemeral giraffe")
    assert ids(svc.search_messages(query="zebra")) == []
    assert ids(svc.search_messages(query="giraffe")) == [mid]
    svc.delete_message(message_id=mid)
    assert ids(svc.search_messages(query="giraffe")) == []


def test_search_changes_nothing(svc: MemoryService) -> None:
    write(svc, "stable text")
    before = io_counters(svc)
    seq = svc.get_system_health()["last_sequence"]
    for _ in range(5):
        svc.search_messages(query="stable", context_size=3)
    assert io_counters(svc) == before
    assert svc.get_system_health()["last_sequence"] == seq


@pytest.fixture
def small(tmp_path: Path) -> Iterator[MemoryService]:
    service = ToolCalls.open(tmp_path / "small", response_budget=64 * 1024)
    yield service
    service.close()


def test_budget_drops_later_results(small: MemoryService) -> None:
    for i in range(20):
        write(small, f"budget {i} " + "w" * 8000)
    out = small.search_messages(query="budget", limit=100)
    assert 1 <= len(out["results"]) < 20
    assert len(result_json(out).encode()) <= 64 * 1024
