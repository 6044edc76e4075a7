"""Tool results as MCP sees them (seed 000's envelope): one `TextContent` holding the registry's
`ToolResult.text` (the result, or for an application error the error envelope), `isError` set
for application errors."""

from __future__ import annotations

import mcp_types as types

from convmem_engine.tools import ToolResult


def call_tool_result(result: ToolResult) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=result.text)], is_error=result.is_error
    )
