"""`agent_run` / `agent_status` on an MCP server, and the Tasks extension (SEP-2663).

`build_agent_server(service, agent)` serves the tool registry with the two agent tools
(`convmem_engine.agent.tools`, registered only while `enabled: true`) and the
`io.modelcontextprotocol/tasks` extension, built on the SDK's
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

import logging
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
from convmem_engine.agent.service import Submitted
from convmem_engine.agent.tools import AGENT_RUN, AGENT_TOOLS
from convmem_engine.agent.validation import is_uuid
from convmem_engine.domain.errors import ConvMemError
from convmem_engine.mcp import fast_call
from convmem_engine.mcp.line_transport import MAX_LINE_BYTES
from convmem_engine.mcp.server import build_server
from convmem_engine.tools import ToolRegistry
from convmem_engine.tools.registry import error_text

if TYPE_CHECKING:
    from convmem_engine.agent.service import AgentService
    from convmem_engine.agent.store import Task
    from convmem_engine.service import MemoryService

log = logging.getLogger(__name__)

TASKS_EXTENSION: Final = "io.modelcontextprotocol/tasks"
POLL_INTERVAL_MS: Final = 1000


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

    def __init__(self, agent: AgentService, registry: ToolRegistry) -> None:
        self.agent = agent
        self.registry = registry

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
        spec = self.registry.get(params.name)
        if spec is None or spec is not AGENT_RUN or not declares_tasks_extension(ctx):
            return await call_next(ctx)
        arguments = dict(params.arguments or {})

        def submit() -> Submitted:
            self.registry.validate(AGENT_RUN.name, arguments)  # the schema check, as tools/call
            return self.agent.submit(arguments)

        try:
            submitted = await anyio.to_thread.run_sync(submit)
        except ConvMemError as error:
            return _text_result(error_text(spec, error), is_error=True)
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


def agent_registry(service: MemoryService, agent: AgentService) -> ToolRegistry:
    """The memory tools, and `agent_run`/`agent_status` when the agent is enabled."""
    registry = ToolRegistry.for_service(service)
    if agent.config.enabled:
        registry = registry.with_tools(AGENT_TOOLS, agent)
    return registry


def install_tasks_extension(
    server: Server[Any], agent: AgentService, registry: ToolRegistry
) -> TasksExtension:
    """Apply the Tasks extension to a low-level server: its methods, its `tools/call`
    interceptor and its capability (what `MCPServer(extensions=[...])` does for the
    high-level server)."""
    call_entry = server.get_request_handler("tools/call")
    assert call_entry is not None
    extension = TasksExtension(agent, registry)
    for binding in extension.methods():
        server.add_request_handler(binding.method, binding.params_type, _version_gated(binding))
    server.extensions[extension.identifier] = extension.settings()
    handler = compose_tool_call_handler([extension], call_entry.handler)
    server.add_request_handler("tools/call", types.CallToolRequestParams, handler)
    # every other tool passes the interceptor untouched: the line transport's fast path may
    # still serve it; agent_run is the interceptor's
    fast_call.register(server, registry, handler, exclude=frozenset({AGENT_RUN.name}))
    return extension


def build_agent_server(service: MemoryService, agent: AgentService) -> Server[Any]:
    """The MCP server of a runtime with the agent: the registry's tools (the agent's listed
    only when enabled) and the Tasks extension."""
    registry = agent_registry(service, agent)
    server = build_server(registry)
    install_tasks_extension(server, agent, registry)
    return server
