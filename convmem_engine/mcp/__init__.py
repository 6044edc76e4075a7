"""The MCP face of ConvMem: the tool registry's tools over the official SDK's low-level server.

server = build_server(registry_or_service)          # one Server, any number of sessions
await serve_lines(server, reader, send)             # one session over newline-delimited JSON-RPC
(`convmem serve` and the app run sessions through convmem_engine.runtime)

The names below load the SDK when first used, not when a light module of this package
(`http_config`, `http_token`) is imported: `convmem serve` answers the handshake before the SDK
is loaded (convmem_engine/runtime/front.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from convmem_engine.domain.lazy import lazy_exports

if TYPE_CHECKING:
    from convmem_engine.mcp.line_transport import MAX_LINE_BYTES, serve_chunks, serve_lines
    from convmem_engine.mcp.server import build_server, tool_definition

_WHERE = {
    "MAX_LINE_BYTES": "line_transport",
    "serve_chunks": "line_transport",
    "serve_lines": "line_transport",
    "build_server": "server",
    "tool_definition": "server",
}

__all__ = [
    "MAX_LINE_BYTES",
    "build_server",
    "serve_chunks",
    "serve_lines",
    "tool_definition",
]


__getattr__ = lazy_exports(__name__, _WHERE)
