"""Every tool ConvMem serves, declared once, in one registry (service <- tools <- mcp/runtime).

    registry = ToolRegistry.for_service(service)        # the seven memory tools
    registry = registry.with_tools(specs, context)      # e.g. the agent's tools
    registry.get(name) / registry.specs / name in registry
    registry.call(name, arguments)    # check + run in-process; raises the domain errors
    registry.result(name, arguments)  # ToolResult(text, is_error), what transports send

Adding a tool is one `ToolSpec` (name, title, description, `Param`s, `Annotations`, result
style) and one handler `(context, checked_arguments) -> result`; see docs/tools-registry.md.
"""

from convmem_engine.tools.memory import INSTRUCTIONS, MEMORY_TOOLS
from convmem_engine.tools.registry import (
    ToolRegistry,
    ToolResult,
    UnknownToolError,
    validate_arguments,
)
from convmem_engine.tools.spec import (
    Annotations,
    Choice,
    Custom,
    Integer,
    JsonText,
    Kind,
    Param,
    ResultStyle,
    Text,
    ToolSpec,
    Ulid,
)

__all__ = [
    "INSTRUCTIONS",
    "MEMORY_TOOLS",
    "Annotations",
    "Choice",
    "Custom",
    "Integer",
    "JsonText",
    "Kind",
    "Param",
    "ResultStyle",
    "Text",
    "ToolRegistry",
    "ToolResult",
    "ToolSpec",
    "Ulid",
    "UnknownToolError",
    "validate_arguments",
]
