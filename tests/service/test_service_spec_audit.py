"""Seed 000 line by line against the real service (audit additions).

Each test names the seed rule it pins. The service runs on a real data dir (fixture `svc`).
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from svc_helpers import write

from convmem_engine.domain.errors import ValidationError
from convmem_engine.service import MemoryService


def _ranked(svc: MemoryService, **kwargs: Any) -> list[str]:
    return [r["message_id"] for r in svc.search_messages(**kwargs)["results"]]


def test_session_scope_and_min_importance_equal_a_brute_force_filter(svc: MemoryService) -> None:
    """search: session scope and min_importance (now cut by the index's own lists) select
    exactly the messages a plain filter over every live message selects, in the seed's order
    (score, then importance, then newer first)."""
    rng = random.Random(7)
    words = ["alpha", "beta", "gamma", "delta"]
    live: dict[str, tuple[str, int, str]] = {}  # id -> (session, importance, content)
    for i in range(240):
        session = f"s{rng.randrange(4)}"
        importance = rng.choice([0, 10, 50, 50, 59, 60, 100])
        content = " ".join(rng.sample(words, 2)) + f" n{i}"
        live[write(svc, content, session=session, importance=importance)] = (
            session,
            importance,
            content,
        )
    for mid in rng.sample(sorted(live), 40):  # moves between importance lists and sessions
        if rng.random() < 0.5:
            svc.delete_message(message_id=mid)
            del live[mid]
        else:
            importance = rng.choice([0, 60, 100])
            svc.update_message(message_id=mid, metadata_json=json.dumps({"importance": importance}))
            live[mid] = (live[mid][0], importance, live[mid][2])
    for word in [*words, "a", "n1"]:
        for scope in (None, "s0", "s3", "nobody"):
            for floor in (0, 59, 60, 100):
                matching = [
                    m
                    for m, (sess, imp, text) in live.items()
                    if (scope is None or sess == scope) and imp >= floor and word in text
                ]
                # score 1.0 for a whole word, 0.8 inside a word; then importance, newer first
                matching.sort(
                    key=lambda m: (
                        1.0 if word in live[m][2].split() else 0.8,
                        live[m][1],
                        m,
                    ),
                    reverse=True,
                )
                got = _ranked(svc, query=word, session_id=scope, min_importance=floor, limit=100)
                assert got == matching[:100], (word, scope, floor)


_TEXT = st.text(
    alphabet=st.sampled_from(["a", " ", "é", "設", "🎉", "\u0301", "\x00"]), min_size=1, max_size=40
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(_TEXT, st.integers(1, 9), st.data())
def test_content_view_byte_ranges(svc: MemoryService, text: str, limit: int, data: Any) -> None:
    """content view: offsets 0 / end / code point boundaries; each chunk ends at the last
    boundary within the limit, or (only when the limit is smaller than the code point at the
    offset) takes that one code point whole, at most 3 bytes over; chunks reassemble the text;
    complete / next_content_offset; any other offset is VALIDATION_ERROR."""
    mid = write(svc, text)
    raw = text.encode()
    boundaries = {len(text[:i].encode()) for i in range(len(text) + 1)}
    offset = data.draw(st.integers(0, len(raw) + 1))
    if offset not in boundaries:
        with pytest.raises(ValidationError) as err:
            svc.read_messages(view="content", message_id=mid, content_offset=offset)
        assert err.value.message.startswith("content_offset: ")
        return
    start = offset
    pieces = []
    while True:
        r = svc.read_messages(
            view="content",
            message_id=mid,
            content_offset=offset,
            content_limit=limit,
            expected_revision=1,
        )["content_range"]
        assert set(r) == {
            "message_id",
            "revision",
            "total_bytes",
            "content_offset",
            "next_content_offset",
            "complete",
            "content",
        }
        assert (r["message_id"], r["revision"], r["total_bytes"]) == (mid, 1, len(raw))
        assert r["content_offset"] == offset
        end = r["next_content_offset"]
        assert end in boundaries and r["content"].encode() == raw[offset:end]
        assert r["complete"] is (end == len(raw))
        best = max(b for b in boundaries if b <= min(offset + limit, len(raw)))
        if best > offset or offset == len(raw):
            assert end == best  # shortened to the last boundary within the limit
        else:
            assert end == min(b for b in boundaries if b > offset)  # one code point whole
            assert end - offset - limit <= 3
        pieces.append(r["content"])
        if r["complete"]:
            break
        assert end > offset
        offset = end
    assert "".join(pieces).encode() == raw[start:]


def test_context_cap_counts_exactly_fifty(svc: MemoryService) -> None:
    """context: at most 50 messages (the message, its neighbours, its relation entries,
    deleted stubs included); truncated only when something was left out."""
    hub = write(svc, "hub", session="hub")
    to_hub = [{"type": "related_to", "message_id": hub}]
    spokes = [write(svc, f"spoke {i}", session="spokes", relations=to_hub) for i in range(49)]
    out = svc.read_messages(view="context", message_id=hub, before=10, after=10)
    assert (len(out["relations"]), out["truncated"]) == (49, False)  # 1 + 49 = 50
    one_more = write(svc, "spoke 49", session="spokes", relations=to_hub)
    out = svc.read_messages(view="context", message_id=hub)
    assert (len(out["relations"]), out["truncated"]) == (49, True)
    # A deleted target counts as a message too: delete a spoke the hub points at.
    svc.delete_message(message_id=one_more)
    svc.update_message(
        message_id=hub,
        metadata_json=json.dumps({"relations": [{"type": "depends_on", "message_id": spokes[0]}]}),
    )
    svc.delete_message(message_id=spokes[0])
    out = svc.read_messages(view="context", message_id=hub)
    stub = {
        "type": "depends_on",
        "direction": "outgoing",
        "depth": 1,
        "message_id": spokes[0],
        "status": "deleted",
    }
    assert out["relations"][0] == stub
    assert (len(out["relations"]), out["truncated"]) == (49, False)  # stub + 48 spokes
    # Neighbours count: 10 before in the spokes session, plus relations, capped at 50.
    mid = spokes[30]
    out = svc.read_messages(view="context", message_id=mid, before=10, after=10, relation_depth=2)
    ctx = out["chronological_context"]
    total = 1 + len(ctx["before"]) + len(ctx["after"]) + len(out["relations"])
    assert total == 50 and out["truncated"] is True
    assert out["session"] == {"session_id": "spokes", "message_count": 48}


def test_next_cursor_only_when_more_follow(svc: MemoryService) -> None:
    """history / sessions: nextCursor is present exactly when more items follow the page
    (a page that ends exactly at the last item has none)."""
    for i in range(3):
        write(svc, f"m{i}", session="s")
    for i in range(2):
        write(svc, f"t{i}", session=f"t{i}")
    assert set(svc.read_messages(session_id="s", limit=3)) == {"history"}
    page = svc.read_messages(session_id="s", limit=2)
    assert set(page) == {"history", "nextCursor"}
    rest = svc.read_messages(session_id="s", limit=2, cursor=page["nextCursor"])
    assert set(rest) == {"history"} and len(rest["history"]) == 1
    assert set(svc.read_messages(view="sessions", limit=3)) == {"sessions"}
    page = svc.read_messages(view="sessions", limit=2)
    assert set(page) == {"sessions", "nextCursor"}
    rest = svc.read_messages(view="sessions", limit=2, cursor=page["nextCursor"])
    assert set(rest) == {"sessions"} and len(rest["sessions"]) == 1
