"""The agent against a real Ollama: runs only when one is reachable (marker `real_ollama`).

    OLLAMA_HOST=127.0.0.1:11434 CONVMEM_REAL_OLLAMA_MODEL=qwen3:8b \
        .venv/bin/python -m pytest -m real_ollama tests/agent

The model must have the `tools` capability (`ollama show MODEL`). Without a reachable Ollama
(or without CONVMEM_REAL_OLLAMA_MODEL) the test is skipped, so the default suite never needs
one.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from convmem_engine.agent import AgentConfig, AgentService
from convmem_engine.agent.config import normalize_ollama_host
from convmem_engine.service import MemoryService
from tests.agent.agent_helpers import wait_for

pytestmark = pytest.mark.real_ollama


def _real_ollama() -> tuple[str, str]:
    host = normalize_ollama_host(os.environ.get("OLLAMA_HOST", ""))
    model = os.environ.get("CONVMEM_REAL_OLLAMA_MODEL", "")
    if not model:
        pytest.skip("set CONVMEM_REAL_OLLAMA_MODEL to a tool-capable model to run this")
    try:
        httpx.get(f"{host}/api/version", timeout=2).raise_for_status()
    except httpx.HTTPError:
        pytest.skip(f"no Ollama reachable at {host}")
    return host, model


def test_a_real_model_writes_and_finds_a_memory(tmp_path: Path) -> None:
    host, model = _real_ollama()
    memory = MemoryService.open(tmp_path / "data")
    config = AgentConfig(enabled=True, ollama_host=host, ollama_model=model, max_tokens=200_000)
    agent = AgentService(tmp_path / "data", memory, config.with_changes(ollama_temperature=0.0))
    agent.start()
    try:
        sub = agent.submit(
            {
                "request": "Store this fact as a semantic memory in session 'real-test' with "
                "the tag db: the project's database is PostgreSQL 16."
            }
        )
        task = wait_for(agent, sub.task_id, "completed", "failed", timeout=600)
        assert task.state == "completed", task.result
        assert task.input_tokens > 0 and task.output_tokens > 0
        found = memory.search_messages(query="PostgreSQL")
        assert found["results"], "the model did not write the memory"
        assert any(a.tool == "write_message" and a.ok for a in agent.audit(sub.task_id))
    finally:
        agent.stop()
        memory.close()
