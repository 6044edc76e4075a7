"""The memory agent: `agent_run` / `agent_status` on a local Ollama model (issue 11).

`AgentService` is the one queue of the process; `config` reads `agent.yaml`; `store` keeps
tasks, agent sessions and the audit journal durably; `loop` is the plan/run loop; `texts`
holds every caller-visible text in English and Japanese. No Qt here.

The names below load their module when first used: importing one light module of this package
(`part`, `config`) does not load the Ollama client (`convmem serve` starts faster).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from convmem_engine.domain.lazy import lazy_exports

if TYPE_CHECKING:
    from convmem_engine.agent.config import (
        AgentConfig,
        AgentConfigError,
        load_config,
        save_config,
    )
    from convmem_engine.agent.service import AgentService, Submitted
    from convmem_engine.agent.validation import AgentInputError

_WHERE = {
    "AgentConfig": "config",
    "AgentConfigError": "config",
    "load_config": "config",
    "save_config": "config",
    "AgentService": "service",
    "Submitted": "service",
    "AgentInputError": "validation",
}

__all__ = [
    "AgentConfig",
    "AgentConfigError",
    "AgentInputError",
    "AgentService",
    "Submitted",
    "load_config",
    "save_config",
]


__getattr__ = lazy_exports(__name__, _WHERE)
