"""Run slow MemoryService calls on a thread pool and deliver results on the GUI thread.

A `Job` is a QObject living in the GUI thread. Its work function runs in a QThreadPool worker;
the worker reports progress through the job's private signal (queued to its slot) and its
result through the runner's relay, a QObject of the GUI thread. Only slots on the GUI thread
emit the public signals, so every receiver (lambdas included) runs on the GUI thread.

Lifetime: a job lives while the runner holds it (from `start` until its result is delivered);
then the runner lets it go, on the GUI thread. Nothing the runner made holds a finished job:
- the worker drops its reference (and its traceback's frames) before it reports, so the last
  reference never goes on a pool thread (Qt must not delete an object from another thread
  than its own; PySide would delete a job there on the spot);
- no connection of the runner's holds the job, and once it is delivered the runner
  disconnects what others connected to its public signals (it emits nothing more): a
  receiver that holds the job (say a closure that checks `job is self._job`) would keep it
  alive through Qt, out of the garbage collector's sight, for the life of the app.
The cyclic garbage collector runs on the GUI thread only (`convmem_app.gui_gc`), so a job in
a cycle of Python references is freed there too.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import SIGNAL, QObject, QRunnable, QThreadPool, Signal, Slot

JobFn = Callable[["Job"], Any]


class Job(QObject):
    """One unit of background work; connect to the signals before `JobRunner.start`."""

    succeeded = Signal(object)
    failed = Signal(object)  # the exception raised by the work function
    progress = Signal(int, int)  # done, total
    finished = Signal()

    _progress = Signal(int, int)

    def __init__(self, fn: JobFn, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._fn = fn
        self._cancel = threading.Event()
        self.done = False
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

    def work(self) -> tuple[object, BaseException | None]:
        """Run the work function (on a worker): (its result, None) or (None, what it raised)."""
        try:
            return self._fn(self), None
        except Exception as exc:  # delivered to the GUI thread, never swallowed
            return None, exc

    @Slot(int, int)
    def _forward_progress(self, done: int, total: int) -> None:
        if not self.done:
            self.progress.emit(done, total)

    def _deliver(self, result: object, error: object) -> None:
        self.done = True
        if error is not None:
            self.failed.emit(error)
        else:
            self.succeeded.emit(result)
        self.finished.emit()

    def _disconnect_receivers(self) -> None:
        """Once delivered (nothing more is emitted): let go of every receiver of the public
        signals, and of whatever they hold (the job itself, often)."""
        for signal, signature in _PUBLIC_SIGNALS:
            if self.receivers(SIGNAL(signature)) > 0:  # disconnect() warns when none is left
                getattr(self, signal).disconnect()


_PUBLIC_SIGNALS = (
    ("succeeded", "succeeded(PyObject)"),
    ("failed", "failed(PyObject)"),
    ("progress", "progress(int,int)"),
    ("finished", "finished()"),
)


class _Relay(QObject):
    """Carries each job's result from the workers to the GUI thread (it lives there)."""

    result = Signal(int, object, object)  # (the job's key, result, exception)


class _Runnable(QRunnable):
    def __init__(self, job: Job, key: int, relay: _Relay) -> None:
        super().__init__()
        self._job: Job | None = job
        self._key = key
        self._relay = relay
        self.setAutoDelete(True)

    def run(self) -> None:
        job, self._job = self._job, None
        assert job is not None
        result, error = job.work()
        if error is not None:  # its frames' locals (the job among them) go here, not later
            traceback.clear_frames(error.__traceback__)
        del job  # before reporting: the runner lets the job go on the GUI thread
        self._relay.result.emit(self._key, result, error)


class JobRunner(QObject):
    """Owns a private thread pool and keeps running jobs alive until they report back."""

    busyChanged = Signal(bool)

    def __init__(self, parent: QObject | None = None, max_threads: int = 2) -> None:
        super().__init__(parent)
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(max_threads)
        self._jobs: dict[int, Job] = {}  # by key, from start until delivered
        self._next_key = 0
        self._relay = _Relay(self)
        self._relay.result.connect(self._delivered)

    def start(self, job: Job) -> Job:
        """Run `job` on the pool. The job becomes a child of the runner: if the window goes away
        first, Qt drops the job's pending deliveries instead of calling into deleted views."""
        was_idle = not self._jobs
        job.setParent(self)
        self._next_key += 1
        self._jobs[self._next_key] = job
        self._pool.start(_Runnable(job, self._next_key, self._relay))
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

    @Slot(int, object, object)
    def _delivered(self, key: int, result: object, error: object) -> None:
        job = self._jobs.pop(key, None)
        if job is None:
            return
        try:
            job._deliver(result, error)
        finally:
            # back to Python ownership: freed on this thread once nobody else holds it (the
            # local `job` keeps it alive until this returns, never inside its own disconnect)
            job.setParent(None)
            job._disconnect_receivers()
            if not self._jobs:
                self.busyChanged.emit(False)

    @property
    def busy(self) -> bool:
        return bool(self._jobs)

    def cancel_all(self) -> None:
        for job in list(self._jobs.values()):
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
