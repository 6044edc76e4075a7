"""Helpers shared by the service tests."""

from __future__ import annotations

import json
from typing import Any

from convmem_engine.service import MemoryService


def write(svc: MemoryService, content: str = "hello", session: str = "s1", **md: Any) -> str:
    """Write a message (metadata given as keyword fields) and return its id."""
    result = svc.write_message(
        session_id=session,
        role="user",
        content=content,
        metadata_json=json.dumps(md) if md else None,
    )
    return str(result["message"]["message_id"])


def io_counters(svc: MemoryService) -> dict[str, int]:
    return dict(svc.get_system_health()["io"])
