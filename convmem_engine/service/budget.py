"""The response budget (~8 MiB), measured on the serialized result JSON.

`result_json()` is THE serialization of a tool result (the MCP layer puts exactly this text in
`TextContent.text`), so the budget counts the bytes a host receives: compact separators,
UTF-8, non-ASCII characters unescaped.
"""

from __future__ import annotations

import json
from typing import Any

from convmem_engine.domain import limits


def result_json(result: Any) -> str:
    return json.dumps(result, ensure_ascii=False, separators=(",", ":"))


def json_bytes(value: Any) -> int:
    return len(result_json(value).encode("utf-8"))


class Budget:
    """Adds items to a JSON array until the next one would pass the budget.

    The first item is always taken (every item fits: content is at most 1 MiB, so the biggest
    message serializes to well under 8 MiB even with every character escaped), so a page always
    makes progress.
    """

    def __init__(self, reserved: int, limit: int = limits.RESPONSE_BUDGET_BYTES) -> None:
        self.used = reserved
        self.limit = limit
        self.count = 0

    def take(self, item: Any) -> bool:
        size = json_bytes(item) + (1 if self.count else 0)  # "," between items
        if self.count and self.used + size > self.limit:
            return False
        self.used += size
        self.count += 1
        return True
