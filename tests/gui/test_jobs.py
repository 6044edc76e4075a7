"""JobRunner: where and whether a finished job is deleted."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from PySide6.QtCore import Qt

from convmem_app.browser.jobs import Job, JobRunner

pytestmark = pytest.mark.gui


def _returns(value: int) -> Callable[[Job], int]:
    def work(job: Job) -> int:
        if value % 2:
            raise ValueError(value)  # its traceback holds the job: it goes too
        return value

    return work


def test_a_finished_job_is_freed_and_on_the_gui_thread(qtbot: Any) -> None:
    """Nobody outside keeps the jobs: each is freed once delivered, on the GUI thread (Qt must
    not delete an object from another thread than its own; the worker drops its reference
    before it reports). Before, a finished job was never freed at all: the runner's own
    connection to its `finished` signal held it through Qt, so every background read of the
    window stayed in memory."""
    runner = JobRunner(max_threads=4)
    deleted_on: list[threading.Thread] = []
    delivered: list[object] = []
    for i in range(40):
        job = Job(_returns(i))
        job.succeeded.connect(delivered.append)
        job.failed.connect(lambda exc: delivered.append(exc.args[0]))
        job.destroyed.connect(
            lambda *_: deleted_on.append(threading.current_thread()),
            Qt.ConnectionType.DirectConnection,
        )
        runner.start(job)
    del job
    qtbot.waitUntil(lambda: len(deleted_on) == 40)
    assert sorted(delivered) == list(range(40))  # type: ignore[type-var]
    assert set(deleted_on) == {threading.main_thread()}
    assert not runner.busy
    assert runner.wait(5000)


def test_a_kept_job_stays_usable_after_it_finished(qtbot: Any) -> None:
    runner = JobRunner()
    results: list[object] = []
    failures: list[BaseException] = []
    job = runner.run(lambda _job: 42, results.append)
    broken = runner.run(lambda _job: 1 / 0, on_error=failures.append)
    qtbot.waitUntil(lambda: results == [42] and len(failures) == 1)
    qtbot.wait(20)
    assert isinstance(failures[0], ZeroDivisionError)
    assert job.done and broken.done and not job.cancelled
    job.cancel()  # what a model does when it moves on: harmless once finished
    assert job.cancelled
    assert job.parent() is None  # its owner now is whoever keeps it
    assert runner.wait(5000)
