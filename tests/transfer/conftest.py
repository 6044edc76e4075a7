"""Shared fixtures of the transfer tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from convmem_engine.service import MemoryService


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[MemoryService]:
    """An open service on a fresh data dir; it must pass its self-check at the end."""
    service = MemoryService.open(tmp_path / "data")
    try:
        yield service
        assert service.check() == []
    finally:
        service.close()
