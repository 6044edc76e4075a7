"""The memory agent: `agent_run` / `agent_status` on a local Ollama model (issue 11).

`AgentService` is the one queue of the process; `config` reads `agent.yaml`; `store` keeps
tasks, agent sessions and the audit journal durably; `loop` is the plan/run loop; `texts`
holds every caller-visible text in English and Japanese. No Qt here.
"""

from convmem_engine.agent.config import AgentConfig, AgentConfigError, load_config, save_config
from convmem_engine.agent.service import AgentService, Submitted
from convmem_engine.agent.validation import AgentInputError

__all__ = [
    "AgentConfig",
    "AgentConfigError",
    "AgentInputError",
    "AgentService",
    "Submitted",
    "load_config",
    "save_config",
]
