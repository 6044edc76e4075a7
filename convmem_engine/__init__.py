"""ConvMem engine: durable conversation memory, its indexes and its MCP server. No Qt here."""

__version__ = "0.1.0"
