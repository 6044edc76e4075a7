"""`agent_run` / `agent_status` on an MCP server, and the Tasks extension (SEP-2663).

`attach_agent(server, agent)` adds the two tools to a low-level SDK `Server` (listed only while
`enabled: true`), and the `io.modelcontextprotocol/tasks` extension, built on the SDK's
`Extension` API (`MethodBinding`s for `tasks/get`, `tasks/update`, `tasks/cancel`, and an
`intercept_tool_call` for `agent_run`), advertised under `capabilities.extensions`.

Results are text blocks (never structured content) with the seed's lines. `agent_run` answers
as soon as the task is queued:
- when the request's per-request client capabilities (2026-07-28 `_meta`) declare the
  extension: a `CreateTaskResult` (`resultType: "task"`, `taskId` = the agent task's UUID);
- otherwise (and always for the legacy `initialize` eras): the seed's four-line queued text.

Status mapping onto the SEP's statuses (the SEP's normative text wins over its examples):
- `queued`, `planning`, `running` → `working`; `statusMessage` starts with our state word, then
  the progress (`completed_tasks`, `current_task`, tokens).
- `completed` → `completed`, `result` = the `CallToolResult` whose text is the `agent_status` text.
- `failed` → `completed` with `result.isError: true` (the same text, whose `result` line says
  why): the SEP reserves its `failed` for JSON-RPC errors, and an agent failure is a tool-level
  outcome. `statusMessage` starts with `failed`.
- `cancelled` → `cancelled` (`statusMessage` starts with `cancelled`).
`tasks/get` answers `resultType: "complete"`, `ttlSeconds: null` (tasks are kept, see
docs/agent.md), `pollIntervalMilliseconds`; an unknown `taskId` is `-32602`. `tasks/cancel`
and `tasks/update` acknowledge any task id with an empty result; our tasks never ask for input,
so `inputResponses` are ignored.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import anyio.to_thread
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.server.extension import Extension, MethodBinding, compose_tool_call_handler
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from convmem_engine.agent.config import AgentConfig, agent_request_bytes
from convmem_engine.agent.texts import queued_text
from convmem_engine.agent.validation import (
    AGENT_RUN_SCHEMA,
    AGENT_STATUS_SCHEMA,
    AgentInputError,
    is_uuid,
)
from convmem_engine.mcp.line_transport import MAX_LINE_BYTES

if TYPE_CHECKING:
    from convmem_engine.agent.service import AgentService
    from convmem_engine.agent.store import Task

log = logging.getLogger(__name__)

TASKS_EXTENSION: Final = "io.modelcontextprotocol/tasks"
POLL_INTERVAL_MS: Final = 1000

AGENT_RUN_TOOL: Final = types.Tool(
    name="agent_run",
    title="Run the memory agent",
    description=(
        "Queue a natural-language memory task for ConvMem's local agent (an Ollama model that "
        "works with the memory tools). Answers at once with task_id and session_id; poll "
        "agent_status until the status is completed, failed or cancelled."
    ),
    input_schema=AGENT_RUN_SCHEMA,
    annotations=types.ToolAnnotations(
        title="Run the memory agent",
        read_only_hint=False,
        destructive_hint=True,
        open_world_hint=False,
    ),
)

AGENT_STATUS_TOOL: Final = types.Tool(
    name="agent_status",
    title="Memory agent task status",
    description=(
        "State, progress, token usage and result of a memory agent task started by agent_run."
    ),
    input_schema=AGENT_STATUS_SCHEMA,
    annotations=types.ToolAnnotations(
        title="Memory agent task status",
        read_only_hint=True,
        destructive_hint=False,
        open_world_hint=False,
    ),
)

AGENT_TOOLS: Final = {
    AGENT_RUN_TOOL.name: AGENT_RUN_TOOL,
    AGENT_STATUS_TOOL.name: AGENT_STATUS_TOOL,
}


def transport_line_limit(config: AgentConfig) -> int:
    """The message (line or HTTP body) limit a transport serving the agent tools must use: the
    memory tools' own limit, raised to admit an `agent_run` with the configured maximum
    images (base64 grows 4/3). With the agent disabled its tools cannot be called, so the
    memory tools' limit stands."""
    if not config.enabled:
        return MAX_LINE_BYTES
    return max(MAX_LINE_BYTES, agent_request_bytes(config))


def _text_result(text: str, *, is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], is_error=is_error
    )


def declares_tasks_extension(ctx: ServerRequestContext[Any, Any]) -> bool:
    """True when this request's (2026-07-28 per-request) client capabilities declare the
    Tasks extension; never for the legacy `initialize` eras."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    declared = capabilities.extensions if capabilities is not None else None
    return bool(declared) and TASKS_EXTENSION in declared  # type: ignore[operator]


class TaskIdParams(types.RequestParams):
    task_id: str = Field(alias="taskId")
    request_state: str | None = Field(alias="requestState", default=None)


class UpdateTaskParams(TaskIdParams):
    input_responses: dict[str, Any] | None = Field(alias="inputResponses", default=None)


class TasksExtension(Extension):
    """SEP-2663 for agent tasks: the agent task's UUID is the MCP task id."""

    identifier = TASKS_EXTENSION

    def __init__(self, agent: AgentService) -> None:
        self.agent = agent

    def methods(self) -> list[MethodBinding]:
        modern = frozenset(MODERN_PROTOCOL_VERSIONS)
        return [
            MethodBinding("tasks/get", TaskIdParams, self._get, modern),
            MethodBinding("tasks/update", UpdateTaskParams, self._update, modern),
            MethodBinding("tasks/cancel", TaskIdParams, self._cancel, modern),
        ]

    async def intercept_tool_call(
        self,
        params: types.CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        if params.name != AGENT_RUN_TOOL.name or not self.agent.config.enabled:
            return await call_next(ctx)
        if not declares_tasks_extension(ctx):
            return await call_next(ctx)
        arguments = dict(params.arguments or {})
        try:
            submitted = await anyio.to_thread.run_sync(
                functools.partial(self.agent.submit, arguments)
            )
        except AgentInputError as error:
            return _text_result(error.message, is_error=True)
        task = self.agent.get(submitted.task_id)
        assert task is not None  # durably created before submit returned
        return {"resultType": "task", **self.task_json(task)}

    # -- the task shape --------------------------------------------------------------------

    def status_message(self, task: Task) -> str:
        total = task.input_tokens + task.output_tokens
        progress = f"completed_tasks {task.completed_steps}/{task.total_steps}"
        if task.state in ("queued", "planning", "running"):
            current = f"; current_task {task.current_task}" if task.current_task else ""
            return f"{task.state}: {progress}{current}; tokens {total}"
        return f"{task.state}: {progress}; tokens {total}; {task.result}".rstrip("; ")

    def task_json(self, task: Task) -> dict[str, Any]:
        status = {
            "queued": "working",
            "planning": "working",
            "running": "working",
            "completed": "completed",
            "failed": "completed",
            "cancelled": "cancelled",
        }[task.state]
        out: dict[str, Any] = {
            "taskId": task.task_id,
            "status": status,
            "statusMessage": self.status_message(task),
            "createdAt": task.created_at,
            "lastUpdatedAt": task.updated_at,
            "ttlSeconds": None,
        }
        if status == "working":
            out["pollIntervalMilliseconds"] = POLL_INTERVAL_MS
        if status == "completed":
            result = _text_result(self.agent.render(task), is_error=task.state == "failed")
            out["result"] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        return out

    # -- methods ---------------------------------------------------------------------------

    async def _get(
        self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams
    ) -> HandlerResult:
        task = self.agent.get(params.task_id.lower()) if is_uuid(params.task_id) else None
        if task is None:
            raise MCPError(
                code=types.INVALID_PARAMS, message="Failed to retrieve task: Task not found"
            )
        return {"resultType": "complete", **self.task_json(task)}

    async def _update(
        self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams
    ) -> HandlerResult:
        return {"resultType": "complete"}

    async def _cancel(
        self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams
    ) -> HandlerResult:
        if is_uuid(params.task_id):
            await anyio.to_thread.run_sync(self.agent.cancel, params.task_id.lower())
        return {"resultType": "complete"}


def _version_gated(binding: MethodBinding) -> Any:
    versions = binding.protocol_versions

    async def gated(ctx: ServerRequestContext[Any, Any], params: Any) -> HandlerResult:
        if versions is not None and ctx.protocol_version not in versions:
            raise MCPError(code=types.METHOD_NOT_FOUND, message="Method not found")
        return await binding.handler(ctx, params)

    return gated


def attach_agent(server: Server[Any], agent: AgentService) -> TasksExtension:
    """Add `agent_run`/`agent_status` and the Tasks extension to `server`."""
    list_entry = server.get_request_handler("tools/list")
    call_entry = server.get_request_handler("tools/call")
    assert list_entry is not None and call_entry is not None
    list_tools = list_entry.handler
    call_tool = call_entry.handler
    schema_of = server.get_tool_input_schema

    async def list_with_agent(ctx: ServerRequestContext[Any, Any], params: Any) -> HandlerResult:
        result = await list_tools(ctx, params)
        if not agent.config.enabled or not isinstance(result, types.ListToolsResult):
            return result
        return result.model_copy(update={"tools": [*result.tools, *AGENT_TOOLS.values()]})

    async def call_with_agent(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> HandlerResult:
        if params.name not in AGENT_TOOLS or not agent.config.enabled:
            return await call_tool(ctx, params)
        arguments = dict(params.arguments or {})
        try:
            if params.name == AGENT_RUN_TOOL.name:
                submitted = await anyio.to_thread.run_sync(
                    functools.partial(agent.submit, arguments)
                )
                return _text_result(
                    queued_text(submitted.task_id, submitted.session_id, agent.config.language)
                )
            text = await anyio.to_thread.run_sync(functools.partial(agent.status, arguments))
            return _text_result(text)
        except AgentInputError as error:
            return _text_result(error.message, is_error=True)
        except Exception as exc:
            log.error("%s failed with %s", params.name, type(exc).__name__)
            return _text_result(f"{params.name} failed unexpectedly; see the log", is_error=True)

    def schema_with_agent(name: str) -> Mapping[str, Any] | None:
        if name in AGENT_TOOLS and agent.config.enabled:
            return AGENT_TOOLS[name].input_schema
        return schema_of(name) if schema_of is not None else None

    extension = TasksExtension(agent)
    for binding in extension.methods():
        server.add_request_handler(binding.method, binding.params_type, _version_gated(binding))
    server.extensions[extension.identifier] = extension.settings()
    server.add_request_handler("tools/list", list_entry.params_type, list_with_agent)
    server.add_request_handler(
        "tools/call",
        types.CallToolRequestParams,
        compose_tool_call_handler([extension], call_with_agent),
    )
    server.get_tool_input_schema = schema_with_agent
    return extension
