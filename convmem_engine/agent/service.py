"""The agent queue: one per process, shared by every transport and the GUI.

- Six states: `queued` → `planning` → `running` → `completed` | `failed` | `cancelled`
  (`queued` → `cancelled` too; `planning` → `failed`/`cancelled`).
- At most one task is `planning` or `running` in the process; the others wait in submission
  order (a sequence number given under the queue's lock).
- `submit` validates everything first (nothing is queued on rejection), makes the task
  durable (state file, images), and returns at once: it never waits for the model.
- `stop`: a running task is signalled and ends `failed` ("interrupted by shutdown"); queued
  tasks stay `queued` in the state file and run, in their order, when the queue next starts.
  At start, a task found `planning`/`running` (the process died) ends `failed` the same way.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from convmem_engine.agent.config import AgentConfig
from convmem_engine.agent.loop import BudgetExceeded, TaskRun
from convmem_engine.agent.memory_tools import MemoryTools
from convmem_engine.agent.ollama_side import Cancelled, OllamaProblem, OllamaSide
from convmem_engine.agent.store import AgentSession, AgentStore, AuditRecord, Task, now_iso
from convmem_engine.agent.texts import not_found_text, status_text, text
from convmem_engine.agent.validation import (
    AgentInputError,
    parse_run_arguments,
    parse_status_arguments,
)
from convmem_engine.service import MemoryService

log = logging.getLogger(__name__)

Listener = Callable[[Task], None]


@dataclass(frozen=True, slots=True)
class Submitted:
    task_id: str
    session_id: str


class AgentService:
    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        memory: MemoryService,
        config: AgentConfig,
        *,
        ollama_factory: Callable[[str, float], OllamaSide] = OllamaSide,
    ) -> None:
        self._memory = memory
        self._config = config
        self._ollama_factory = ollama_factory
        self.store = AgentStore(data_dir)
        self._lock = threading.Condition(threading.RLock())
        self._listeners: list[Listener] = []
        self._active: str | None = None
        self._cancel_events: dict[str, threading.Event] = {}
        self._shutdown = False
        self._thread: threading.Thread | None = None
        self.last_problem = ""

    # -- life cycle ------------------------------------------------------------------------

    @property
    def config(self) -> AgentConfig:
        return self._config

    def set_config(self, config: AgentConfig) -> None:
        """New settings apply to the next task (a running task keeps its own)."""
        with self._lock:
            self._config = config

    def start(self) -> None:
        lang = self._config.language
        reason = text("reason.shutdown", lang, state="{state}")
        for task in self.store.recover_after_restart(reason):
            self._notify(task.copy())
        with self._lock:
            self._shutdown = False
            self._thread = threading.Thread(target=self._worker, name="convmem-agent", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Signal the running task (it ends `failed`, interrupted by shutdown) and wait for the
        worker; queued tasks stay queued on disk."""
        with self._lock:
            self._shutdown = True
            for event in self._cancel_events.values():
                event.set()
            self._lock.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        self.store.close()

    # -- listeners -------------------------------------------------------------------------

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """`listener(task copy)` after every change of a task (on the changing thread)."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def _notify(self, task: Task) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(task)
            except Exception:
                log.exception("agent listener failed")

    # -- queries ---------------------------------------------------------------------------

    def get(self, task_id: str) -> Task | None:
        with self._lock:
            task = self.store.tasks.get(task_id)
            return None if task is None else task.copy()

    def tasks(self) -> list[Task]:
        with self._lock:
            return sorted((t.copy() for t in self.store.tasks.values()), key=lambda t: t.seq)

    def audit(self, task_id: str | None = None) -> list[AuditRecord]:
        return self.store.audit_records(task_id)

    def render(self, task: Task) -> str:
        return status_text(
            task_id=task.task_id,
            session_id=task.session_id,
            status=task.state,
            completed=task.completed_steps,
            total=task.total_steps,
            current_task=task.current_task,
            input_tokens=task.input_tokens,
            output_tokens=task.output_tokens,
            critical_path_tokens=task.critical_path_tokens,
            result=task.result,
            language=self._config.language,
        )

    def status(self, arguments: Mapping[str, Any]) -> str:
        """`agent_status`: the status text, or the seed's not-found text."""
        lang = self._config.language
        parsed = parse_status_arguments(arguments, lang)
        task = self.get(parsed.task_id)
        if task is None or (parsed.session_id is not None and task.session_id != parsed.session_id):
            return not_found_text(parsed.task_id, lang)
        return self.render(task)

    # -- submitting and cancelling ---------------------------------------------------------

    def submit(self, arguments: Mapping[str, Any]) -> Submitted:
        """Validate and queue; `AgentInputError` (nothing queued) on any bad input."""
        config = self._config
        lang = config.language
        if not config.enabled:
            raise AgentInputError(text("err.disabled", lang))
        parsed = parse_run_arguments(arguments, config.images, lang)
        with self._lock:
            if parsed.session_id is not None and parsed.session_id not in self.store.sessions:
                raise AgentInputError(text("err.unknown_session", lang))
            task_id = str(uuid.uuid4())
            now = now_iso()
            session_id = parsed.session_id or str(uuid.uuid4())
            task = Task(
                task_id=task_id,
                session_id=session_id,
                seq=self.store.next_seq,
                request=parsed.request,
                temperature=parsed.temperature,
                image_count=len(parsed.images),
                created_at=now,
                updated_at=now,
            )
            if parsed.images:
                self.store.save_images(
                    task_id,
                    [
                        {"mime_type": i.mime_type, "data_base64": i.data_base64}
                        for i in parsed.images
                    ],
                )
            session = self.store.sessions.get(session_id)
            created = session is None
            if session is None:
                session = AgentSession(session_id=session_id, created_at=now)
                self.store.sessions[session_id] = session
            session.task_ids.append(task_id)
            self.store.tasks[task_id] = task
            self.store.next_seq += 1
            try:
                self.store.save()
            except BaseException:
                del self.store.tasks[task_id]
                session.task_ids.remove(task_id)
                if created:
                    del self.store.sessions[session_id]
                self.store.next_seq -= 1
                self.store.drop_images(task_id)
                raise
            copy = task.copy()
            self._lock.notify_all()
        self._notify(copy)
        return Submitted(task_id, session_id)

    def cancel(self, task_id: str) -> bool:
        """Cancel a queued task at once, or signal the running one (it stops at its next safe
        point). False when the task is unknown or already terminal."""
        with self._lock:
            task = self.store.tasks.get(task_id)
            if task is None or task.terminal:
                return False
            if task.state == "queued":
                self._finish(task, "cancelled", text("reason.cancelled", self._config.language))
                return True
            task.cancel_requested = True
            event = self._cancel_events.get(task_id)
            if event is not None:
                event.set()
            return True

    # -- the worker ------------------------------------------------------------------------

    def _finish(self, task: Task, state: str, result: str) -> None:
        with self._lock:
            task.state = state
            task.result = result
            task.current_task = ""
            task.updated_at = now_iso()
            self.store.save()
            self.store.drop_images(task.task_id)
            copy = task.copy()
        self._notify(copy)

    def _next(self) -> Task | None:
        with self._lock:
            while not self._shutdown:
                queued = [t for t in self.store.tasks.values() if t.state == "queued"]
                if queued:
                    task = min(queued, key=lambda t: t.seq)
                    task.state = "planning"
                    task.updated_at = now_iso()
                    self._active = task.task_id
                    self._cancel_events[task.task_id] = threading.Event()
                    self.store.save()
                    return task
                self._lock.wait()
            return None

    def _worker(self) -> None:
        while True:
            task = self._next()
            if task is None:
                return
            self._notify(task.copy())
            try:
                self._run(task)
            except Exception as exc:  # never lose the worker
                log.error("agent task failed with %s", type(exc).__name__)
                self._finish(
                    task,
                    "failed",
                    text("reason.internal", self._config.language, kind=type(exc).__name__),
                )
            finally:
                with self._lock:
                    self._active = None
                    self._cancel_events.pop(task.task_id, None)

    def _update(self, task: Task) -> Callable[[Callable[[Task], None]], None]:
        def update(change: Callable[[Task], None]) -> None:
            with self._lock:
                change(task)
                task.updated_at = now_iso()
                self.store.save()
                copy = task.copy()
            self._notify(copy)

        return update

    def _history(self, task: Task) -> list[dict[str, Any]]:
        """The session's earlier requests and answers, as chat history."""
        with self._lock:
            session = self.store.sessions.get(task.session_id)
            ids = [] if session is None else list(session.task_ids)
            history: list[dict[str, Any]] = []
            for tid in ids:
                if tid == task.task_id:
                    break
                earlier = self.store.tasks.get(tid)
                if earlier is None or not earlier.terminal:
                    continue
                history.append({"role": "user", "content": earlier.request})
                history.append({"role": "assistant", "content": earlier.result})
            return history

    def _run(self, task: Task) -> None:
        config = self._config
        lang = config.language
        with self._lock:
            cancelled = self._cancel_events[task.task_id]
            if task.cancel_requested:
                cancelled.set()
        if not config.ollama_model:
            self._finish(task, "failed", text("reason.no_model", lang))
            return
        ollama = self._ollama_factory(config.effective_host(), config.ollama_timeout_seconds)
        try:
            run = TaskRun(
                task,
                config=config,
                ollama=ollama,
                tools=MemoryTools(
                    self._memory,
                    self.store,
                    allow_delete=config.allow_delete,
                    allow_rebuild=config.allow_rebuild,
                ),
                history=self._history(task),
                images=self.store.load_images(task.task_id),
                cancelled=cancelled,
                update=self._update(task),
            )
            try:
                run.check_model()
                self.last_problem = ""
                plan = run.plan()

                def running(t: Task) -> None:
                    t.plan = plan
                    t.state = "running"

                run.update(running)
                answer = run.run_steps(plan)
            except Cancelled:
                if self._shutdown:
                    reason = text("reason.shutdown", lang, state=task.state)
                    self._finish(task, "failed", reason)
                else:
                    self._finish(task, "cancelled", text("reason.cancelled", lang))
                return
            except OllamaProblem as problem:
                reason = text(problem.key, lang, **problem.values)
                if problem.key in ("reason.unreachable", "reason.model_missing"):
                    self.last_problem = reason
                self._finish(task, "failed", reason)
                return
            except BudgetExceeded as exceeded:
                self._finish(task, "failed", text(exceeded.key, lang, **exceeded.values))
                return
            self._finish(task, "completed", answer)
        finally:
            ollama.close()

    # -- health ----------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        with self._lock:
            counts = {state: 0 for state in ("queued", "planning", "running")}
            for task in self.store.tasks.values():
                if task.state in counts:
                    counts[task.state] += 1
        return {
            "enabled": self._config.enabled,
            "ollama_host": self._config.effective_host(),
            "model": self._config.ollama_model,
            "tasks": counts,
            "last_problem": self.last_problem,
        }
