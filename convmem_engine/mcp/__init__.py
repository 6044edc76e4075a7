"""The MCP face of ConvMem: the tool registry's tools over the official SDK's low-level server.

server = build_server(registry_or_service)          # one Server, any number of sessions
await serve_lines(server, reader, send)             # one session over newline-delimited JSON-RPC
(`convmem serve` and the app run sessions through convmem_engine.runtime)
"""

from convmem_engine.mcp.line_transport import MAX_LINE_BYTES, serve_chunks, serve_lines
from convmem_engine.mcp.server import build_server, tool_definition

__all__ = [
    "MAX_LINE_BYTES",
    "build_server",
    "serve_chunks",
    "serve_lines",
    "tool_definition",
]
