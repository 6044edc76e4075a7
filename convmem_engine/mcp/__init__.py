"""The MCP face of ConvMem: seven strict tools over the official SDK's low-level server.

server = build_server(service)                      # one Server, any number of sessions
await serve_lines(server, reader, send)             # one session over newline-delimited JSON-RPC
(`convmem serve` and the app run sessions through convmem_engine.runtime)
"""

from convmem_engine.mcp.line_transport import MAX_LINE_BYTES, serve_chunks, serve_lines
from convmem_engine.mcp.schemas import INSTRUCTIONS, TOOLS, TOOLS_BY_NAME, ToolSpec
from convmem_engine.mcp.server import TOOL_DEFINITIONS, build_server

__all__ = [
    "INSTRUCTIONS",
    "MAX_LINE_BYTES",
    "TOOLS",
    "TOOLS_BY_NAME",
    "TOOL_DEFINITIONS",
    "ToolSpec",
    "build_server",
    "serve_chunks",
    "serve_lines",
]
