"""JobRunner: where and whether a finished job is deleted, and tearing a runner down with jobs
still running."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from PySide6.QtCore import QObject, Qt

from convmem_app.browser.jobs import Job, JobRunner
from convmem_engine.service import MemoryService

pytestmark = pytest.mark.gui


def _returns(value: int) -> Callable[[Job], int]:
    def work(job: Job) -> int:
        job.report(1, 2)
        if value % 2:
            raise ValueError(value)  # its traceback holds the job: it goes too
        return value

    return work


def _track_deletion(job: Job, deleted_on: list[threading.Thread]) -> None:
    job.destroyed.connect(
        lambda *_: deleted_on.append(threading.current_thread()),
        Qt.ConnectionType.DirectConnection,
    )


def _job(
    i: int, delivered: list[object], progress: list[int], deleted_on: list[threading.Thread]
) -> Job:
    job = Job(_returns(i))
    if i % 4 < 2:
        job.succeeded.connect(delivered.append)
        job.failed.connect(lambda exc: delivered.append(exc.args[0]))
    else:  # receivers that hold the job itself

        def succeeded(result: object) -> None:
            assert job.done
            delivered.append(result)

        def failed(exc: BaseException) -> None:
            assert job.done
            delivered.append(exc.args[0])

        job.succeeded.connect(succeeded)
        job.failed.connect(failed)
        job.finished.connect(lambda: job.cancel())
    job.progress.connect(lambda done, _total: progress.append(done + 0 * job.done))
    _track_deletion(job, deleted_on)
    return job


def test_a_finished_job_is_freed_and_on_the_gui_thread(qtbot: Any) -> None:
    """Nobody outside keeps the jobs: each is freed once delivered, on the GUI thread (Qt must
    not delete an object from another thread than its own; the worker drops its reference
    before it reports). Half the jobs are held by their own receivers, as the paged models'
    are (a closure checking `job is self._job`): the runner lets go of the receivers once the
    job is delivered. Before, a finished job was never freed at all: the runner's own
    connection to its `finished` signal held it through Qt, so every background read of the
    window stayed in memory."""
    runner = JobRunner(max_threads=4)
    deleted_on: list[threading.Thread] = []
    delivered: list[object] = []
    progress: list[int] = []
    for i in range(40):
        runner.start(_job(i, delivered, progress, deleted_on))
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


def _tear_down_a_busy_runner(qtbot: Any, service: MemoryService, shutdown: bool, tag: int) -> None:
    owner = QObject()
    runner = JobRunner(owner, max_threads=4)
    deleted_on: list[threading.Thread] = []
    delivered: list[object] = []
    started = threading.Event()

    def work(job: Job) -> int:
        started.set()
        for n in range(5):
            if job.cancelled:
                break
            service.list_sessions()
            job.report(n, 5)
            time.sleep(0.001)
        return tag

    for _ in range(30):
        job = runner.run(work, delivered.append)
        job.progress.connect(lambda *_args, job=job: job.done)
        _track_deletion(job, deleted_on)
    del job
    assert started.wait(10)
    if shutdown:
        assert runner.shutdown(10_000)
    del runner
    owner.deleteLater()  # the pool waits for the running jobs before the rest goes
    del owner
    qtbot.waitUntil(lambda: len(deleted_on) == 30)
    assert set(deleted_on) == {threading.main_thread()}
    assert set(delivered) <= {tag}


@pytest.mark.parametrize("shutdown", [True, False], ids=["shutdown-first", "deleted-running"])
def test_a_runner_torn_down_while_many_jobs_run(
    qtbot: Any, service: MemoryService, shutdown: bool
) -> None:
    """What closing the window does to its runner, many times over: store reads on every
    worker, progress reports on their way, results queued for the GUI thread, when the
    runner's owner goes (after `shutdown`, as the app does before closing the service, or
    deleted with jobs still running). Nothing reaches a deleted receiver, every job is
    destroyed on the GUI thread, and the process survives."""
    for tag in range(8):
        _tear_down_a_busy_runner(qtbot, service, shutdown, tag)
