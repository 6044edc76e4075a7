"""The queue: submission order, one active task, every state transition, cancel, restart."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from convmem_engine.agent import AgentConfig, AgentService
from convmem_engine.agent.store import AgentStore, AgentStoreError, Task
from convmem_engine.service import MemoryService
from tests.agent.agent_helpers import status_lines, wait_for
from tests.agent.conftest import AgentFactory
from tests.agent.fake_ollama import FakeOllama, Reply


def test_concurrent_submissions_run_one_at_a_time_in_submission_order(
    make_agent: AgentFactory, fake_ollama: FakeOllama
) -> None:
    agent = make_agent()
    states: list[tuple[str, str]] = []
    active_seen: list[int] = []

    def observe(task: Task) -> None:
        states.append((task.task_id, task.state))
        active_seen.append(sum(1 for t in agent.tasks() if t.state in ("planning", "running")))

    agent.subscribe(observe)
    submitted: list[tuple[int, str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def client(n: int) -> None:
        barrier.wait()
        for i in range(3):
            sub = agent.submit({"request": f"client {n} request {i}"})
            with lock:
                submitted.append((n, sub.task_id))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [tid for _, tid in submitted]
    for tid in ids:
        wait_for(agent, tid, "completed", "failed")
    agent.stop()
    assert max(active_seen) == 1
    by_seq = [t.task_id for t in sorted(agent.tasks(), key=lambda t: t.seq)]
    started = list(dict.fromkeys(tid for tid, state in states if state == "planning"))
    assert started == by_seq  # planned in submission (sequence) order
    assert len(set(ids)) == 12
    # each task's request reached its own planning call, in that order
    plan_requests = [c["messages"][-1]["content"] for c in fake_ollama.chats if not c.get("tools")]
    assert plan_requests == [agent.get(tid).request for tid in by_seq]  # type: ignore[union-attr]


def test_every_transition_of_a_completed_task(make_agent: AgentFactory) -> None:
    agent = make_agent(start=False)
    seen: list[str] = []
    agent.subscribe(lambda task: seen.append(task.state))
    sub = agent.submit({"request": "x"})
    assert agent.get(sub.task_id).state == "queued"  # type: ignore[union-attr]
    agent.start()
    wait_for(agent, sub.task_id, "completed")
    agent.stop()  # joins the worker: every notification has been delivered
    compact = [s for i, s in enumerate(seen) if i == 0 or seen[i - 1] != s]
    assert compact == ["queued", "planning", "running", "completed"]


def test_cancel_a_queued_task(make_agent: AgentFactory, fake_ollama: FakeOllama) -> None:
    agent = make_agent(start=False)
    sub = agent.submit({"request": "x"})
    assert agent.cancel(sub.task_id) is True
    agent.start()
    task = wait_for(agent, sub.task_id, "cancelled")
    assert task.result == "Cancelled at the caller's request."
    assert fake_ollama.chats == [] and fake_ollama.shows == []
    assert agent.cancel(sub.task_id) is False  # already terminal
    fields = status_lines(agent.status({"task_id": sub.task_id}))
    assert fields["status"] == "cancelled"
    assert fields["completed_tasks"] == "0/1"


@pytest.mark.parametrize("phase", ["planning", "running"])
def test_cancel_a_running_task_stops_at_the_next_safe_point(
    make_agent: AgentFactory, fake_ollama: FakeOllama, memory: MemoryService, phase: str
) -> None:
    hold = threading.Event()
    if phase == "planning":
        fake_ollama.replies = [Reply(content="1. write it down please", hold=hold)]
    else:
        fake_ollama.replies = [
            Reply(content="1. Write"),
            Reply(
                content="writing now",
                tool_calls=[("write_message", {"session_id": "s", "role": "user", "content": "x"})],
                hold=hold,
            ),
        ]
    agent = make_agent()
    follower = None
    sub = agent.submit({"request": "x"})
    follower = agent.submit({"request": "y"})
    wait_for(agent, sub.task_id, phase)
    while len(fake_ollama.chats) < (1 if phase == "planning" else 2):
        fake_ollama.chat_started.wait(1)
        fake_ollama.chat_started.clear()
    assert agent.cancel(sub.task_id) is True
    hold.set()
    task = wait_for(agent, sub.task_id, "cancelled", "completed", "failed")
    assert task.state == "cancelled"
    # the half-streamed reply was never applied: no write happened
    assert memory.read_messages(view="sessions")["sessions"] == []
    assert agent.audit(sub.task_id) == []
    # the queue goes on with the next task
    assert wait_for(agent, follower.task_id, "completed", "failed").state == "completed"


def test_restart_with_tasks_in_every_state(
    tmp_path: Path, memory: MemoryService, fake_ollama: FakeOllama
) -> None:
    data = tmp_path / "data"
    config = AgentConfig(enabled=True, ollama_host=fake_ollama.host, ollama_model="memo")
    agent = AgentService(data, memory, config)
    ids = {}
    for state in ("queued", "planning", "running", "completed", "failed", "cancelled"):
        ids[state] = agent.submit({"request": f"in {state}"}).task_id
    # put them in every state on disk, as a process that died would have left them
    for state, tid in ids.items():
        agent.store.tasks[tid].state = state
    agent.store.tasks[ids["completed"]].result = "done before"
    agent.store.save()
    agent.store.close()  # the process "dies": no stop()

    again = AgentService(data, memory, config.with_changes(language="ja"))
    again.start()
    try:
        assert again.get(ids["planning"]).state == "failed"  # type: ignore[union-attr]
        assert again.get(ids["running"]).state == "failed"  # type: ignore[union-attr]
        assert "シャットダウン" in again.get(ids["running"]).result  # type: ignore[union-attr]
        assert again.get(ids["completed"]).result == "done before"  # type: ignore[union-attr]
        # the queued one survives and runs now
        assert wait_for(again, ids["queued"], "completed").state == "completed"
        for state in ("failed", "cancelled", "completed"):
            assert again.get(ids[state]).state == state  # type: ignore[union-attr]
    finally:
        again.stop()


def test_stop_fails_the_running_task_as_interrupted_and_keeps_queued_ones(
    tmp_path: Path, memory: MemoryService, fake_ollama: FakeOllama
) -> None:
    hold = threading.Event()
    fake_ollama.replies = [Reply(content="1. wait", hold=hold)]
    config = AgentConfig(enabled=True, ollama_host=fake_ollama.host, ollama_model="memo")
    agent = AgentService(tmp_path / "data", memory, config)
    agent.start()
    running = agent.submit({"request": "slow"})
    queued = agent.submit({"request": "later"})
    wait_for(agent, running.task_id, "planning")
    fake_ollama.chat_started.wait(10)
    stopper = threading.Thread(target=agent.stop)
    stopper.start()
    hold.set()
    stopper.join()
    again = AgentService(tmp_path / "data", memory, config)
    try:
        task = again.get(running.task_id)
        assert task is not None and task.state == "failed"
        assert task.result.startswith("Interrupted by shutdown")
        assert again.get(queued.task_id).state == "queued"  # type: ignore[union-attr]
        again.start()
        assert wait_for(again, queued.task_id, "completed").state == "completed"
    finally:
        again.stop()


def test_agent_files_are_user_only_versioned_and_refused_when_damaged_or_newer(
    tmp_path: Path, make_agent: AgentFactory
) -> None:
    agent = make_agent(start=False)
    agent.submit({"request": "x"})
    state = Path(agent.store.state_path)
    data = json.loads(state.read_text())
    assert (data["format"], data["version"]) == ("convmem-agent-state", 1)
    if os.name != "nt":
        assert stat.S_IMODE(state.stat().st_mode) == 0o600
        assert stat.S_IMODE(Path(agent.store.dir).stat().st_mode) == 0o700
    agent.store.close()
    data["version"] = 2
    state.write_text(json.dumps(data))
    with pytest.raises(AgentStoreError, match="newer"):
        AgentStore(tmp_path / "data")
    state.write_text("{not json")
    with pytest.raises(AgentStoreError, match="damaged"):
        AgentStore(tmp_path / "data")
    assert state.read_text() == "{not json"  # never overwritten


@pytest.mark.posix  # symlinks need privileges on Windows
def test_a_planted_symlink_is_not_written_through(tmp_path: Path, make_agent: AgentFactory) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    agent = make_agent(start=False)
    state = Path(agent.store.state_path)
    if state.exists():
        state.unlink()
    state.symlink_to(victim)
    agent.submit({"request": "x"})
    assert victim.read_text() == "precious"
    assert not state.is_symlink()
