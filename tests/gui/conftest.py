"""Fixtures for the memory browser tests: a real MemoryService on a temp dir, temp QSettings."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QSettings

from convmem_app.browser import MemoryBrowser
from convmem_engine.service import MemoryService


@pytest.fixture
def settings(tmp_path: Path) -> QSettings:
    """Ini settings inside the test's temp dir (never the user's real settings)."""
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "cfg"))
    return QSettings(str(tmp_path / "cfg" / "browser.ini"), QSettings.Format.IniFormat)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[MemoryService]:
    svc = MemoryService.open(tmp_path / "data")
    yield svc
    svc.close()


@pytest.fixture
def make_browser(
    qtbot: Any, service: MemoryService, settings: QSettings
) -> Iterator[Callable[[], MemoryBrowser]]:
    made: list[MemoryBrowser] = []

    def make() -> MemoryBrowser:
        b = MemoryBrowser(service, settings=settings)
        qtbot.addWidget(b)
        b.show()
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()  # saves state, stops following the service
        assert b.shutdown()  # background calls end before the service closes
