"""The base of every browser panel that talks to the store."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtWidgets import QWidget

from convmem_app.browser.jobs import Job, JobFn, JobRunner
from convmem_engine.tools import ToolRegistry

if TYPE_CHECKING:
    from convmem_engine.service import MemoryService


class ServicePanel(QWidget):
    """A widget over one MemoryService. It never calls the service on the GUI thread: every
    call goes through the window's shared `JobRunner`, and the results come back as signals.
    What the user types reaches the store through `_tools` (the memory tools, checked as a
    host's calls are); the panel's own calls can use the service directly."""

    def __init__(
        self, service: MemoryService, runner: JobRunner, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self._service = service
        self._tools = ToolRegistry.for_service(service)
        self._runner = runner
        self._job: Job | None = None  # the latest job of `_run_latest`, until it reports

    def _cancel_job(self) -> None:
        if self._job is not None:
            self._job.cancel()
            self._job = None

    def _run_latest(
        self,
        work: JobFn,
        done: Callable[[Any], None],
        failed: Callable[[BaseException], None],
        progress: Callable[[int, int], None] | None = None,
    ) -> Job:
        """Run `work` in place of the panel's current job (which is cancelled): only the latest
        job reports (`done`, `failed`, `progress`); what an earlier one returns is dropped."""
        self._cancel_job()
        job = Job(work)
        self._job = job

        def on_done(result: Any) -> None:
            if self._job is job:
                self._job = None
                done(result)

        def on_failed(exc: BaseException) -> None:
            if self._job is job:
                self._job = None
                failed(exc)

        def on_progress(count: int, total: int) -> None:
            if self._job is job and progress is not None:
                progress(count, total)

        job.succeeded.connect(on_done)
        job.failed.connect(on_failed)
        job.progress.connect(on_progress)
        self._runner.start(job)
        return job
