"""Seed 000 line by line against the real service (audit additions).

Each test names the seed rule it pins. The service runs on a real data dir (fixture `svc`).
"""

from __future__ import annotations

import json
import random
from typing import Any

from svc_helpers import write

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
