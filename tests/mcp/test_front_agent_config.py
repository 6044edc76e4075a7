"""`convmem serve` decides once whether the memory agent is on: as the stdio front saw the data
dir when it started. The front answers `tools/list` without the agent's tools at once when
there is no `agent.yaml` (`listChanged` is false: the list may not change later), so an
`agent.yaml` that appears before the agent part reads its settings must not turn the agent on
in this process; one that was there at the front's start is read as usual."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from convmem_engine.agent.config import AgentConfig, save_config
from convmem_engine.agent.part import AgentPart
from convmem_engine.runtime.front import StdioFront
from convmem_engine.runtime.serve_cli import _config_as_front_saw
from convmem_engine.service import MemoryService

pytestmark = pytest.mark.posix  # os.pipe as stdin/stdout

LIST = b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}\n'


def _initialize() -> str:
    params = {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    }
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params})


def _start(data_dir: Path, *, file_before: bool) -> tuple[list[str], bool]:
    """A front and a service as `serve` composes them, `agent.yaml` (enabled) written before
    the front starts or between its start and the agent part's read: the tool names the front
    answered and whether the agent part is on."""
    enabled = AgentConfig(enabled=True, ollama_model="m")
    data_dir.mkdir(mode=0o700)
    if file_before:
        save_config(data_dir, enabled)
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    front = StdioFront(in_r, out_w, data_dir=data_dir, answer_requests=True)
    service = MemoryService.open(data_dir, on_locked=front.start)
    part = AgentPart(read_config=_config_as_front_saw(front))
    try:
        os.write(in_w, _initialize().encode() + b"\n" + LIST)
        with os.fdopen(out_r, "rb") as out:
            assert json.loads(out.readline())["id"] == 1
            if not file_before:
                line = out.readline()  # answered before the part started: the agent is off
                save_config(data_dir, enabled)  # ... and the file appears only now
            part.start_on(data_dir, service)
            assert part.agent is not None
            front.serve_tools(None, agent_enabled=part.agent.config.enabled)
            if file_before:
                front.stop_answering()  # the SDK answers tools/list with the agent's tools
                return [], part.agent.config.enabled
        answer = json.loads(line)
        return [t["name"] for t in answer["result"]["tools"]], part.agent.config.enabled
    finally:
        part.stop()
        service.close()
        os.close(in_w)


def test_agent_yaml_created_after_the_front_started_leaves_the_agent_off(tmp_path: Path) -> None:
    names, agent_on = _start(tmp_path / "data", file_before=False)
    assert "write_message" in names and "agent_run" not in names
    assert agent_on is False  # the same process never offers agent_run afterwards


def test_agent_yaml_present_at_the_front_start_is_read(tmp_path: Path) -> None:
    _names, agent_on = _start(tmp_path / "data", file_before=True)
    assert agent_on is True
