"""Fixtures for service tests: a real MemoryService on a real data dir (real files, fsync),
its operations called as tools (`tool_calls.ToolCalls`: the arguments checked as a host's are)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tool_calls import ToolCalls


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[ToolCalls]:
    service = ToolCalls.open(tmp_path / "data")
    try:
        yield service
        assert service.check() == []
    finally:
        service.close()
