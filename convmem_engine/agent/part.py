"""The agent queue as a part of a running data dir (`convmem serve`, the app's runtime).

`AgentPart.start(...)` reads `agent.yaml` (an `AgentConfigError` names the broken key) and
starts the queue on the open `MemoryService`; `stop()` ends the running task as interrupted by
shutdown and keeps queued tasks for the next start. The MCP side
(`convmem_engine.mcp.agent_tools.attach_agent`, `transport_line_limit`) is one floor up.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from convmem_engine.agent.config import AgentConfig
    from convmem_engine.agent.service import AgentService
    from convmem_engine.service import MemoryService


class AgentPart:
    name = "agent"

    def __init__(
        self, *, read_config: Callable[[str | os.PathLike[str]], AgentConfig] | None = None
    ) -> None:
        """`read_config(data_dir)` reads the settings (default: `agent.yaml`, `load_config`)."""
        self.agent: AgentService | None = None
        self._read_config = read_config

    def start(self, runtime: Any) -> None:
        """The runtime's `Part` seam: start the queue on the runtime's open service."""
        self.start_on(runtime.data_dir, runtime.service)

    def start_on(self, data_dir: str | os.PathLike[str], service: MemoryService) -> AgentService:
        from convmem_engine.agent.config import load_config
        from convmem_engine.agent.service import AgentService  # and the Ollama client

        config = (self._read_config or load_config)(data_dir)
        agent = AgentService(data_dir, service, config)
        agent.start()
        self.agent = agent
        return agent

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.stop()
            self.agent = None

    def health(self) -> dict[str, Any]:
        return {} if self.agent is None else self.agent.health()
