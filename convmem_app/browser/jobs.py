"""Run slow MemoryService calls on a thread pool and deliver results on the GUI thread.

A `Job` is a QObject living in the GUI thread. Its work function runs in a QThreadPool worker;
the worker emits private signals, which Qt queues to the Job's own slots because the Job lives
in the GUI thread. Only those slots emit the public signals, so every receiver (lambdas
included) runs on the GUI thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal, Slot

JobFn = Callable[["Job"], Any]


class Job(QObject):
    """One unit of background work; connect to the signals before `JobRunner.start`."""

    succeeded = Signal(object)
    failed = Signal(object)  # the exception raised by the work function
    progress = Signal(int, int)  # done, total
    finished = Signal()

    _result = Signal(object, object)  # (result, exception) from the worker thread
    _progress = Signal(int, int)

    def __init__(self, fn: JobFn, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._fn = fn
        self._cancel = threading.Event()
        self.done = False
        self._result.connect(self._deliver)
        self._progress.connect(self._forward_progress)

    def cancel(self) -> None:
        """Ask the work function to stop at its next check; it decides where that is."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def cancel_event(self) -> threading.Event:
        """For work functions that take a `threading.Event` to stop at (imports, exports)."""
        return self._cancel

    def report(self, done: int, total: int) -> None:
        """Called from the work function (worker thread)."""
        self._progress.emit(done, total)

    def run_in_worker(self) -> None:
        try:
            result = self._fn(self)
        except Exception as exc:  # delivered to the GUI thread, never swallowed
            self._result.emit(None, exc)
        else:
            self._result.emit(result, None)

    @Slot(int, int)
    def _forward_progress(self, done: int, total: int) -> None:
        if not self.done:
            self.progress.emit(done, total)

    @Slot(object, object)
    def _deliver(self, result: object, error: object) -> None:
        self.done = True
        if error is not None:
            self.failed.emit(error)
        else:
            self.succeeded.emit(result)
        self.finished.emit()


class _Runnable(QRunnable):
    def __init__(self, job: Job) -> None:
        super().__init__()
        self._job = job
        self.setAutoDelete(True)

    def run(self) -> None:
        self._job.run_in_worker()


class JobRunner(QObject):
    """Owns a private thread pool and keeps running jobs alive until they report back."""

    busyChanged = Signal(bool)

    def __init__(self, parent: QObject | None = None, max_threads: int = 2) -> None:
        super().__init__(parent)
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(max_threads)
        self._jobs: set[Job] = set()

    def start(self, job: Job) -> Job:
        """Run `job` on the pool. The job becomes a child of the runner: if the window goes away
        first, Qt drops the job's pending deliveries instead of calling into deleted views."""
        was_idle = not self._jobs
        job.setParent(self)
        self._jobs.add(job)
        job.finished.connect(lambda j=job: self._forget(j))
        self._pool.start(_Runnable(job))
        if was_idle:
            self.busyChanged.emit(True)
        return job

    def run(
        self,
        fn: JobFn,
        on_success: Callable[[Any], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> Job:
        job = Job(fn)
        if on_success is not None:
            job.succeeded.connect(on_success)
        if on_error is not None:
            job.failed.connect(on_error)
        return self.start(job)

    def _forget(self, job: Job) -> None:
        self._jobs.discard(job)
        job.setParent(None)  # back to Python ownership: freed once the worker drops it too
        if not self._jobs:
            self.busyChanged.emit(False)

    @property
    def busy(self) -> bool:
        return bool(self._jobs)

    def cancel_all(self) -> None:
        for job in list(self._jobs):
            job.cancel()

    def wait(self, msecs: int = -1) -> bool:
        """Block until the workers are idle."""
        return self._pool.waitForDone(msecs)

    def shutdown(self, msecs: int = -1) -> bool:
        """Before the service closes: drop the jobs still queued (they never run and never
        report), ask the running ones to stop, and wait for them; False if they outlast
        `msecs`. Without the drop, every queued read would still run against the store."""
        self._pool.clear()
        self.cancel_all()
        return self._pool.waitForDone(msecs)
