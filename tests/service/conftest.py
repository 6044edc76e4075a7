"""Fixtures for service tests: a real MemoryService on a real data dir (real files, fsync)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from convmem_engine.service import MemoryService


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[MemoryService]:
    service = MemoryService.open(tmp_path / "data")
    try:
        yield service
        assert service.check() == []
    finally:
        service.close()
