"""The MCP server: the SDK's low-level `Server` with seven thin tool handlers.

Each call: look the tool up, validate its arguments against the strict schema, run the one
MemoryService method of the same name in a worker thread (so a slow call never blocks other
requests or sessions), wrap the result. Application errors become the seed's error envelope;
anything unexpected becomes INTERNAL_ERROR and is logged by type and traceback only (exception
messages can quote message content, so they are never logged).
"""

from __future__ import annotations

import functools
import logging
import traceback
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

from convmem_engine.domain.errors import ConvMemError, InternalError
from convmem_engine.mcp.envelope import error_result, ok_result, validate_arguments
from convmem_engine.mcp.schemas import INSTRUCTIONS, SERVER_NAME, TOOLS, TOOLS_BY_NAME, ToolSpec

if TYPE_CHECKING:
    from convmem_engine.service import MemoryService

logger = logging.getLogger(__name__)

SERVER_VERSION = "0.1.0"


def tool_definition(tool: ToolSpec) -> types.Tool:
    return types.Tool(
        name=tool.name,
        title=tool.title,
        description=tool.description,
        input_schema=tool.input_schema,
        annotations=types.ToolAnnotations(
            title=tool.title,
            read_only_hint=tool.read_only,
            destructive_hint=tool.destructive,
            idempotent_hint=tool.idempotent,
            open_world_hint=False,
        ),
    )


TOOL_DEFINITIONS: list[types.Tool] = [tool_definition(tool) for tool in TOOLS]


def _log_unexpected(tool: ToolSpec, exc: BaseException) -> None:
    frames = "".join(traceback.format_tb(exc.__traceback__))
    logger.error("%s failed with %s (message withheld)\n%s", tool.name, type(exc).__name__, frames)


def _input_schema(name: str) -> dict[str, Any] | None:
    tool = TOOLS_BY_NAME.get(name)
    return None if tool is None else tool.input_schema


def build_server(service: MemoryService) -> Server[Any]:
    """A low-level MCP server exposing the seven tools over `service`.

    One server can run any number of sessions at once (`Server.run` per connection).
    """

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOL_DEFINITIONS)

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tool = TOOLS_BY_NAME.get(params.name)
        if tool is None:
            raise MCPError(
                code=types.INVALID_PARAMS,
                message="unknown tool: name must be one of " + ", ".join(TOOLS_BY_NAME),
            )
        arguments = dict(params.arguments or {})
        try:
            validate_arguments(tool, arguments)
            method = getattr(service, tool.method)
            result = await anyio.to_thread.run_sync(functools.partial(method, **arguments))
        except ConvMemError as error:
            return error_result(error)
        except Exception as exc:
            _log_unexpected(tool, exc)
            return error_result(InternalError(f"{tool.name} failed unexpectedly; see the log"))
        return ok_result(result)

    return Server(
        SERVER_NAME,
        version=SERVER_VERSION,
        title="ConvMem",
        description="Durable local conversation memory: write, search, read and curate.",
        instructions=INSTRUCTIONS,
        get_tool_input_schema=_input_schema,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
