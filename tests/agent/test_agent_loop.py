"""The plan/run loop against the fake Ollama: tool calls, tokens, history, images, budgets."""

from __future__ import annotations

import json

from convmem_engine.service import MemoryService
from tests.agent.agent_helpers import status_lines, wait_for
from tests.agent.conftest import AgentFactory
from tests.agent.fake_ollama import FakeOllama, Reply

PNG = (  # a real 1x1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9"
    + "awAAAABJRU5ErkJggg=="
)


def test_one_step_task_writes_memory_and_reports_like_the_seed(
    make_agent: AgentFactory, fake_ollama: FakeOllama, memory: MemoryService
) -> None:
    fake_ollama.replies = [
        Reply(content="1. Store the fact", prompt_eval_count=100, eval_count=10),
        Reply(
            tool_calls=[
                (
                    "write_message",
                    {"session_id": "proj", "role": "user", "content": "db is postgres"},
                )
            ],
            prompt_eval_count=200,
            eval_count=20,
        ),
        Reply(content="Stored the fact.", prompt_eval_count=300, eval_count=30),
    ]
    agent = make_agent()
    submitted = agent.submit({"request": "Remember that the db is postgres", "temperature": 0.3})
    task = wait_for(agent, submitted.task_id, "completed", "failed", "cancelled")
    assert task.state == "completed", task.result
    lines = agent.status({"task_id": submitted.task_id}).splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "task_id",
        "session_id",
        "status",
        "completed_tasks",
        "current_task",
        "token_usage",
        "critical_path_tokens",
        "message",
        "result",
    ]
    fields = status_lines("\n".join(lines))
    assert fields["status"] == "completed"
    assert fields["completed_tasks"] == "1/1"
    assert lines[4] == "current_task:"
    assert fields["token_usage"] == "input=600 output=60 total=660"
    assert fields["critical_path_tokens"] == "0"
    assert fields["message"] == "The task completed."
    assert fields["result"] == "Stored the fact."
    # the request reached the model unchanged, temperature as options.temperature
    first = fake_ollama.chats[0]
    assert first["messages"][-1] == {"role": "user", "content": "Remember that the db is postgres"}
    assert all(chat["options"]["temperature"] == 0.3 for chat in fake_ollama.chats)
    assert "tools" not in first or not first["tools"]
    offered = {t["function"]["name"] for t in fake_ollama.chats[1]["tools"]}
    assert offered == {
        "write_message",
        "update_message",
        "read_messages",
        "search_messages",
        "get_system_health",
    }
    # the tool result went back to the model, and the write is in memory
    tool_msg = fake_ollama.chats[2]["messages"][-1]
    assert tool_msg["role"] == "tool"
    written = json.loads(tool_msg["content"])["message"]
    history = memory.read_messages(view="history", session_id="proj")
    assert [m["message_id"] for m in history["history"]] == [written["message_id"]]
    audit = agent.audit(submitted.task_id)
    assert [(a.tool, a.message_ids, a.before_revision, a.after_revision) for a in audit] == [
        ("write_message", (written["message_id"],), None, 1)
    ]


def test_multi_step_plan_counts_steps_critical_path_and_continued_session_history(
    make_agent: AgentFactory, fake_ollama: FakeOllama
) -> None:
    fake_ollama.replies = [
        Reply(content="1. Search\n2. Report", prompt_eval_count=10, eval_count=1),
        Reply(
            tool_calls=[("search_messages", {"query": "db"})], prompt_eval_count=20, eval_count=2
        ),
        Reply(content="searched", prompt_eval_count=30, eval_count=3),
        Reply(content="Nothing found.", prompt_eval_count=40, eval_count=4),
    ]
    agent = make_agent()
    first = agent.submit({"request": "find db facts"})
    task = wait_for(agent, first.task_id, "completed", "failed")
    assert task.state == "completed", task.result
    assert (task.completed_steps, task.total_steps) == (2, 2)
    assert task.plan == ["Search", "Report"]
    assert (task.input_tokens, task.output_tokens) == (100, 10)
    assert task.critical_path_tokens == 44  # step 2 only
    assert agent.audit(first.task_id) == []  # a search changes nothing
    # a continued session sends the earlier request and answer as history
    fake_ollama.replies = [Reply(content="1. Answer"), Reply(content="ok")]
    second = agent.submit({"request": "and now?", "session_id": first.session_id})
    assert second.session_id == first.session_id
    wait_for(agent, second.task_id, "completed")
    messages = fake_ollama.chats[4]["messages"]
    assert messages[1:4] == [
        {"role": "user", "content": "find db facts"},
        {"role": "assistant", "content": "Nothing found."},
        {"role": "user", "content": "and now?"},
    ]


def test_images_go_as_base64_to_a_vision_model(
    make_agent: AgentFactory, fake_ollama: FakeOllama
) -> None:
    fake_ollama.models["memo:latest"] = ["completion", "tools", "vision"]
    fake_ollama.replies = [Reply(content="1. Look"), Reply(content="A red pixel.")]
    agent = make_agent()
    sub = agent.submit(
        {"request": "what is this?", "images": [{"mime_type": "image/png", "data_base64": PNG}]}
    )
    task = wait_for(agent, sub.task_id, "completed", "failed")
    assert task.state == "completed", task.result
    user = [m for m in fake_ollama.chats[0]["messages"] if m["role"] == "user"][-1]
    assert user["images"] == [PNG]
    assert not (agent.store.dir and __import__("os").listdir(agent.store.dir + "/images"))


def test_model_without_vision_given_images_fails_without_a_chat_call(
    make_agent: AgentFactory, fake_ollama: FakeOllama
) -> None:
    agent = make_agent()
    sub = agent.submit(
        {"request": "look", "images": [{"mime_type": "image/png", "data_base64": PNG}]}
    )
    task = wait_for(agent, sub.task_id, "failed", "completed")
    assert task.state == "failed"
    assert "vision" in task.result and "memo" in task.result
    assert fake_ollama.shows == ["memo"]
    assert fake_ollama.chats == []


def test_model_without_tools_fails_without_a_chat_call(
    make_agent: AgentFactory, fake_ollama: FakeOllama
) -> None:
    fake_ollama.models["memo:latest"] = ["completion"]
    agent = make_agent()
    task = wait_for(agent, agent.submit({"request": "x"}).task_id, "failed", "completed")
    assert task.state == "failed"
    assert "tool" in task.result and "`tools`" in task.result
    assert fake_ollama.chats == []


def test_missing_model_says_ollama_pull(make_agent: AgentFactory, fake_ollama: FakeOllama) -> None:
    agent = make_agent(ollama_model="nosuch:7b")
    task = wait_for(agent, agent.submit({"request": "x"}).task_id, "failed", "completed")
    assert "`ollama pull nosuch:7b`" in task.result
    assert fake_ollama.chats == []
    assert "ollama pull" in agent.health()["last_problem"]


def test_unreachable_ollama_says_start_it_at_host(make_agent: AgentFactory) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agent = make_agent(ollama_host=f"127.0.0.1:{port}")
    task = wait_for(agent, agent.submit({"request": "x"}).task_id, "failed", "completed")
    assert task.result.startswith(f"Ollama is unreachable at http://127.0.0.1:{port}")
    assert "start Ollama" in task.result
    assert agent.health()["last_problem"] == task.result


def test_ollama_error_reply_fails_the_task_with_the_status(
    make_agent: AgentFactory, fake_ollama: FakeOllama
) -> None:
    fake_ollama.replies = [Reply(status=500, error="out of memory")]
    agent = make_agent()
    task = wait_for(agent, agent.submit({"request": "x"}).task_id, "failed", "completed")
    assert "HTTP 500" in task.result and "out of memory" in task.result


def test_delete_and_rebuild_are_not_offered_and_refused_unless_allowed(
    make_agent: AgentFactory, fake_ollama: FakeOllama, memory: MemoryService
) -> None:
    mid = memory.write_message(session_id="s", role="user", content="keep me")["message"][
        "message_id"
    ]
    fake_ollama.replies = [
        Reply(content="1. Delete"),
        Reply(tool_calls=[("delete_message", {"message_id": mid})]),
        Reply(content="could not"),
    ]
    agent = make_agent()
    task = wait_for(agent, agent.submit({"request": "delete it"}).task_id, "completed", "failed")
    names = {t["function"]["name"] for t in fake_ollama.chats[1]["tools"]}
    assert "delete_message" not in names and "rebuild_index" not in names
    refused = json.loads(fake_ollama.chats[2]["messages"][-1]["content"])
    assert refused["error"]["code"] == "VALIDATION_ERROR"
    assert (
        memory.read_messages(view="content", message_id=mid)["content_range"]["content"]
        == "keep me"
    )
    assert task.state == "completed"
    # allowed: offered, run and audited with the revision it had
    fake_ollama.chats.clear()
    fake_ollama.replies = [
        Reply(content="1. Delete"),
        Reply(tool_calls=[("delete_message", {"message_id": mid})]),
        Reply(content="deleted"),
    ]
    agent.set_config(agent.config.with_changes(allow_delete=True))
    sub = agent.submit({"request": "delete it"})
    wait_for(agent, sub.task_id, "completed")
    names = {t["function"]["name"] for t in fake_ollama.chats[1]["tools"]}
    assert "delete_message" in names and "rebuild_index" not in names
    audit = agent.audit(sub.task_id)
    assert [(a.tool, a.message_ids, a.before_revision, a.after_revision, a.ok) for a in audit] == [
        ("delete_message", (mid,), 1, None, True)
    ]


def test_update_is_audited_with_before_and_after_revision(
    make_agent: AgentFactory, fake_ollama: FakeOllama, memory: MemoryService
) -> None:
    mid = memory.write_message(session_id="s", role="user", content="v1")["message"]["message_id"]
    fake_ollama.replies = [
        Reply(content="1. Update"),
        Reply(
            tool_calls=[
                ("update_message", {"message_id": mid, "metadata_json": '{"tags": ["db"]}'}),
                ("update_message", {"message_id": mid, "expected_revision": 7, "content": "x"}),
            ]
        ),
        Reply(content="tagged"),
    ]
    agent = make_agent()
    sub = agent.submit({"request": "tag it"})
    wait_for(agent, sub.task_id, "completed")
    audit = agent.audit(sub.task_id)
    assert [(a.tool, a.before_revision, a.after_revision, a.ok) for a in audit] == [
        ("update_message", 1, 2, True),
        ("update_message", 2, 2, False),  # the conflict changed nothing
    ]


def test_step_budget_stops_the_task(make_agent: AgentFactory, fake_ollama: FakeOllama) -> None:
    looping = Reply(tool_calls=[("get_system_health", {})])
    fake_ollama.script = lambda body: Reply(content="1. Loop") if not body.get("tools") else looping
    agent = make_agent(max_steps=3)
    task = wait_for(agent, agent.submit({"request": "x"}).task_id, "failed", "completed")
    assert task.state == "failed"
    assert "budgets.max_steps" in task.result
    assert task.tool_calls == 3


def test_token_budget_stops_the_task(make_agent: AgentFactory, fake_ollama: FakeOllama) -> None:
    fake_ollama.replies = [Reply(content="1. A", prompt_eval_count=900, eval_count=200)]
    agent = make_agent(max_tokens=1000)
    task = wait_for(agent, agent.submit({"request": "x"}).task_id, "failed", "completed")
    assert task.state == "failed"
    assert "1100 tokens" in task.result and "budgets.max_tokens" in task.result
    assert len(fake_ollama.chats) == 1


def test_no_model_configured(make_agent: AgentFactory, fake_ollama: FakeOllama) -> None:
    agent = make_agent(ollama_model="")
    task = wait_for(agent, agent.submit({"request": "x"}).task_id, "failed", "completed")
    assert "ollama.model" in task.result
    assert fake_ollama.shows == []
