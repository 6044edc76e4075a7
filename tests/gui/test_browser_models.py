"""The paged table model on a real service: what a refresh and a batch removal tell the views."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gui_helpers import write
from PySide6.QtCore import QModelIndex

from convmem_app.browser.jobs import JobRunner
from convmem_app.browser.sessions_model import SessionsModel
from convmem_engine.service import MemoryService

pytestmark = pytest.mark.gui


@pytest.fixture
def sessions(qtbot: Any, service: MemoryService) -> Iterator[SessionsModel]:
    for i in range(30):
        write(service, f"s{i:02d}", "hello")
    runner = JobRunner()
    model = SessionsModel(service, runner)
    with qtbot.waitSignal(model.pageLoaded):
        model.reload()
    yield model
    assert runner.wait(30_000)


def test_refresh_reports_only_the_rows_that_changed(
    qtbot: Any, service: MemoryService, sessions: SessionsModel
) -> None:
    changed: list[tuple[int, int]] = []
    inserted: list[tuple[int, int]] = []
    sessions.dataChanged.connect(lambda a, b, _roles=(): changed.append((a.row(), b.row())))
    sessions.rowsInserted.connect(lambda _p, first, last: inserted.append((first, last)))
    write(service, "s07", "one more")
    write(service, "s99", "a new session")
    with qtbot.waitSignal(sessions.refreshed):
        sessions.refresh()
    row = sessions.row_of("s07")
    assert changed == [(row, row)]  # not every row: a sorting proxy re-reads what it is told
    assert sessions.row_data(row)["message_count"] == 2
    assert inserted == [(30, 30)] and sessions.row_of("s99") == 30
    with qtbot.waitSignal(sessions.refreshed):
        sessions.refresh()  # nothing changed since
    assert changed == [(row, row)]


def test_remove_keys_removes_runs_and_keeps_every_position(sessions: SessionsModel) -> None:
    keys = [str(r["session_id"]) for r in sessions.rows()]
    removed: list[tuple[int, int]] = []
    sessions.rowsAboutToBeRemoved.connect(lambda _p, first, last: removed.append((first, last)))
    gone = {keys[i] for i in (3, 4, 5, 10, 20, 21)} | {"not-loaded"}
    assert sessions.remove_keys(gone) == 6
    assert removed == [(20, 21), (10, 10), (3, 5)]  # bottom-up, one signal per run
    left = [k for k in keys if k not in gone]
    assert [str(r["session_id"]) for r in sessions.rows()] == left
    assert [sessions.row_of(k) for k in left] == list(range(len(left)))
    assert all(sessions.row_of(k) == -1 for k in gone)
    assert sessions.rowCount(QModelIndex()) == len(left)
