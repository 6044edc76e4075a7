"""Fixtures for the memory agent: a fake Ollama server, a real MemoryService, the queue."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from convmem_engine.agent import AgentConfig, AgentService
from convmem_engine.service import MemoryService
from tests.agent.fake_ollama import FakeOllama


@pytest.fixture
def fake_ollama() -> Iterator[FakeOllama]:
    fake = FakeOllama().start()
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[MemoryService]:
    svc = MemoryService.open(tmp_path / "data")
    try:
        yield svc
    finally:
        svc.close()


AgentFactory = Callable[..., AgentService]


@pytest.fixture
def make_agent(
    tmp_path: Path, memory: MemoryService, fake_ollama: FakeOllama
) -> Iterator[AgentFactory]:
    made: list[AgentService] = []

    def make(*, start: bool = True, **changes: object) -> AgentService:
        base = AgentConfig(enabled=True, ollama_host=fake_ollama.host, ollama_model="memo")
        agent = AgentService(tmp_path / "data", memory, base.with_changes(**changes))
        if start:
            agent.start()
        made.append(agent)
        return agent

    yield make
    for agent in made:
        if agent._thread is not None and agent._thread.is_alive():
            agent.stop()
