"""The agent queue as a part of a running data dir (`convmem serve`, the app's runtime).

`AgentPart.start(...)` reads `agent.yaml` (an `AgentConfigError` names the broken key) and
starts the queue on the open `MemoryService`; `attach(server)` adds `agent_run`,
`agent_status` and the Tasks extension to an MCP server; `line_limit()` is the transport
message limit the configuration needs; `stop()` ends the running task as interrupted by
shutdown and keeps queued tasks for the next start.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from convmem_engine.agent.config import load_config, transport_line_limit
from convmem_engine.agent.mcp_tools import attach_agent
from convmem_engine.agent.service import AgentService

if TYPE_CHECKING:
    from mcp.server import Server

    from convmem_engine.service import MemoryService


class AgentPart:
    name = "agent"

    def __init__(self) -> None:
        self.agent: AgentService | None = None

    def start_on(self, data_dir: str | os.PathLike[str], service: MemoryService) -> AgentService:
        agent = AgentService(data_dir, service, load_config(data_dir))
        agent.start()
        self.agent = agent
        return agent

    def attach(self, server: Server[Any]) -> None:
        assert self.agent is not None
        attach_agent(server, self.agent)

    def line_limit(self) -> int:
        assert self.agent is not None
        return transport_line_limit(self.agent.config)

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.stop()
            self.agent = None

    def health(self) -> dict[str, Any]:
        return {} if self.agent is None else self.agent.health()
