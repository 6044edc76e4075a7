"""Helpers shared by the agent tests."""

from __future__ import annotations

import threading
import time

from convmem_engine.agent import AgentService
from convmem_engine.agent.store import Task


def wait_for(agent: AgentService, task_id: str, *states: str, timeout: float = 20.0) -> Task:
    """Wait (event-driven, with a generous cap) until the task reaches one of `states`."""
    changed = threading.Event()
    unsubscribe = agent.subscribe(lambda task: changed.set() if task.task_id == task_id else None)
    try:
        deadline = time.monotonic() + timeout
        while True:
            task = agent.get(task_id)
            assert task is not None
            if task.state in states:
                return task
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"task stayed {task.state}, wanted {states}"
            changed.wait(min(remaining, 0.5))
            changed.clear()
    finally:
        unsubscribe()


def status_lines(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        out.setdefault(key, value.strip())
    return out
