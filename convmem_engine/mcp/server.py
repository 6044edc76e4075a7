"""The MCP server: the SDK's low-level `Server` over a tool registry.

`tools/list` lists the registry's tools; `tools/call` looks the tool up (an unknown name is a
JSON-RPC error), then the registry checks the arguments and runs the handler in a worker thread
(so a slow call never blocks other requests or sessions) and shapes the answer
(`ToolRegistry.result`: application errors become the error envelope, anything unexpected
INTERNAL_ERROR, logged without its message). Over the line transport, `tools/call` for a
registry tool usually skips the SDK's dispatcher (`fast_call.py`) with the same answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio.to_thread
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server._otel import OpenTelemetryMiddleware
from mcp.shared.exceptions import MCPError

from convmem_engine.mcp import fast_call
from convmem_engine.mcp.envelope import call_tool_result
from convmem_engine.tools import ToolRegistry, ToolSpec

if TYPE_CHECKING:
    from convmem_engine.service import MemoryService

SERVER_NAME = "convmem"
SERVER_VERSION = "0.1.0"


def tool_definition(tool: ToolSpec[Any]) -> types.Tool:
    """A tool as `tools/list` shows it."""
    return types.Tool(
        name=tool.name,
        title=tool.title,
        description=tool.description,
        input_schema=tool.input_schema,
        annotations=types.ToolAnnotations(
            title=tool.title,
            read_only_hint=tool.annotations.read_only,
            destructive_hint=tool.annotations.destructive,
            idempotent_hint=tool.annotations.idempotent,
            open_world_hint=tool.annotations.open_world,
        ),
    )


def build_server(tools: ToolRegistry | MemoryService) -> Server[Any]:
    """A low-level MCP server exposing the registry's tools (given a MemoryService: its seven
    memory tools, `ToolRegistry.for_service`).

    One server can run any number of sessions at once (`Server.run` per connection).
    """
    registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry.for_service(tools)
    definitions = [tool_definition(spec) for spec in registry.specs]

    def input_schema(name: str) -> dict[str, Any] | None:
        spec = registry.get(name)
        return None if spec is None else spec.input_schema

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=definitions)

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if params.name not in registry:
            raise MCPError(
                code=types.INVALID_PARAMS,
                message="unknown tool: name must be one of " + ", ".join(registry.names),
            )
        arguments = dict(params.arguments or {})
        result = await anyio.to_thread.run_sync(registry.result, params.name, arguments)
        return call_tool_result(result)

    server: Server[Any] = Server(
        SERVER_NAME,
        version=SERVER_VERSION,
        title="ConvMem",
        description="Durable local conversation memory: write, search, read and curate.",
        instructions=registry.instructions,
        get_tool_input_schema=input_schema,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    if not _tracing_configured():
        # The SDK wraps every request in an OpenTelemetry span by default. With no tracer
        # provider configured the span records nothing, yet it was ~4% of the server's CPU
        # per write_message (py-spy, docs/benchmarks.md); keep it only where someone traces.
        server.middleware = [
            m for m in server.middleware if not isinstance(m, OpenTelemetryMiddleware)
        ]
    # the line transport's tools/call fast path runs this registry the way call_tool does
    fast_call.register(server, registry, call_tool)
    return server


def _tracing_configured() -> bool:
    """True when an OpenTelemetry SDK tracer provider is installed (spans would be recorded)."""
    from opentelemetry import trace

    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
