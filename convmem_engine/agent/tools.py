"""`agent_run` and `agent_status` as tool-registry entries (seed 002), served with the memory
tools: `registry.with_tools(AGENT_TOOLS, agent)` when `agent.yaml` says `enabled: true`.

The input schemas are the seed's, byte for byte in content (each property's fragment is given
whole, `"default": null` included). The registry checks the schema first (unknown property,
missing `request`, wrong types); the handlers then apply every other rule of the seed through
`convmem_engine.agent.validation` in the configured language (UUIDs, blank request, the
temperature range, the images, an unknown agent session). Results are plain text
(`result_style="text"`); an input error is the registry's text error (`isError`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from convmem_engine.agent.texts import queued_text
from convmem_engine.agent.validation import AGENT_RUN_SCHEMA, AGENT_STATUS_SCHEMA
from convmem_engine.tools import Annotations, Param, ToolSpec
from convmem_engine.tools.spec import Custom

if TYPE_CHECKING:
    from convmem_engine.agent.service import AgentService


def _as_given(value: object, _name: str) -> object:
    """The handler checks (localized); the schema check already ran."""
    return value


def _params(schema: dict[str, Any]) -> tuple[Param, ...]:
    out = []
    for name, fragment in schema["properties"].items():
        rest = {k: v for k, v in fragment.items() if k != "description"}
        out.append(
            Param(
                name,
                Custom(rest, _as_given),
                fragment["description"],
                required=name in schema["required"],
            )
        )
    return tuple(out)


def _run(agent: AgentService, arguments: dict[str, Any]) -> str:
    submitted = agent.submit(arguments)
    return queued_text(submitted.task_id, submitted.session_id, agent.config.language)


def _status(agent: AgentService, arguments: dict[str, Any]) -> str:
    return agent.status(arguments)


AGENT_RUN: Final = ToolSpec["AgentService"](
    name="agent_run",
    title="Run the memory agent",
    description=(
        "Queue a natural-language memory task for ConvMem's local agent (an Ollama model that "
        "works with the memory tools). Answers at once with task_id and session_id; poll "
        "agent_status until the status is completed, failed or cancelled."
    ),
    params=_params(AGENT_RUN_SCHEMA),
    annotations=Annotations(read_only=False, destructive=True, idempotent=False),
    handler=_run,
    result_style="text",
)

AGENT_STATUS: Final = ToolSpec["AgentService"](
    name="agent_status",
    title="Memory agent task status",
    description=(
        "State, progress, token usage and result of a memory agent task started by agent_run."
    ),
    params=_params(AGENT_STATUS_SCHEMA),
    annotations=Annotations(read_only=True, destructive=False, idempotent=True),
    handler=_status,
    result_style="text",
)

AGENT_TOOLS: Final = (AGENT_RUN, AGENT_STATUS)
