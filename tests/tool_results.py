"""Reading MCP tool results in tests: shared by every suite that talks to a real server.

On sys.path as `tool_results` (pytest puts tests/ there for tests/conftest.py)."""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
from mcp.client import Client


def payload(result: types.CallToolResult) -> dict[str, Any]:
    """The JSON object of a tool result's one text block."""
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    data: dict[str, Any] = json.loads(block.text)
    return data


async def call(client: Client, name: str, **arguments: Any) -> dict[str, Any]:
    """Call a tool that must succeed; its JSON object."""
    result = await client.call_tool(name, arguments)
    data = payload(result)
    assert result.is_error is False, data
    return data
