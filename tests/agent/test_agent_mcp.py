"""`agent_run`/`agent_status` and the Tasks extension through the official SDK client.

A real `convmem serve` subprocess (stdio) pointed at the fake Ollama, with and without the
extension declared, in both protocol eras; several in-memory clients on one server for the
one-active rule.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import anyio
import mcp_types as types
import pytest
from mcp.client import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from pydantic import Field, TypeAdapter

from convmem_engine.agent import AgentConfig, AgentService, save_config
from convmem_engine.agent.config import ImageLimits
from convmem_engine.agent.validation import AGENT_RUN_SCHEMA, AGENT_STATUS_SCHEMA
from convmem_engine.mcp.agent_tools import TASKS_EXTENSION, build_agent_server
from convmem_engine.service import MemoryService
from tests.agent.agent_helpers import status_lines
from tests.agent.fake_ollama import FakeOllama, Reply
from tests.mcp.mcp_helpers import serve_params

pytestmark = pytest.mark.anyio

ANY = TypeAdapter(dict[str, Any])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class TaskIdParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class GetTask(types.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"


class CancelTask(types.Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"


class UpdateTaskParams(TaskIdParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses")


class UpdateTask(types.Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    name_param = "taskId"


class CreateTaskResult(types.Result):
    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str
    status_message: str | None = Field(alias="statusMessage", default=None)
    created_at: str = Field(alias="createdAt")
    last_updated_at: str = Field(alias="lastUpdatedAt")
    ttl_seconds: int | None = Field(alias="ttlSeconds")
    poll_interval_milliseconds: int | None = Field(alias="pollIntervalMilliseconds", default=None)


async def get_task(client: Client, task_id: str) -> dict[str, Any]:
    return await client.session.send_request(GetTask(params=TaskIdParams(taskId=task_id)), ANY)


async def poll_terminal(client: Client, task_id: str) -> dict[str, Any]:
    with anyio.fail_after(30):
        while True:
            task = await get_task(client, task_id)
            if task["status"] != "working":
                return task
            await anyio.sleep(0.05)


class TasksClient(ClientExtension):
    """A client side of SEP-2663: declares the extension and resolves a task by polling."""

    identifier: ClassVar[str] = TASKS_EXTENSION  # type: ignore[misc]
    created: ClassVar[list[CreateTaskResult]] = []

    def claims(self) -> Sequence[ResultClaim[Any]]:
        async def resolve(result: CreateTaskResult, ctx: ClaimContext) -> types.CallToolResult:
            TasksClient.created.append(result)
            with anyio.fail_after(30):
                while True:
                    task = await ctx.session.send_request(
                        GetTask(params=TaskIdParams(taskId=result.task_id)), ANY
                    )
                    if task["status"] != "working":
                        break
                    await anyio.sleep(0.05)
            return types.CallToolResult.model_validate(task["result"])

        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=resolve)]


def write_config(data_dir: Path, fake: FakeOllama, **changes: Any) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    config = AgentConfig(enabled=True, ollama_host=fake.host, ollama_model="memo")
    save_config(data_dir, config.with_changes(**changes))


def text_of(result: types.CallToolResult) -> str:
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    assert result.structured_content is None
    return block.text


async def wait_status(client: Client, task_id: str, *states: str) -> dict[str, str]:
    with anyio.fail_after(30):
        while True:
            result = await client.call_tool("agent_status", {"task_id": task_id})
            fields = status_lines(text_of(result))
            if fields["status"] in states:
                return fields
            await anyio.sleep(0.05)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_tools_without_the_extension_answer_the_seeds_texts(
    tmp_path: Path, fake_ollama: FakeOllama, mode: str
) -> None:
    fake_ollama.replies = [Reply(content="1. Answer"), Reply(content="All done.")]
    data = tmp_path / "data"
    write_config(data, fake_ollama)
    async with Client(stdio_client(serve_params(data)), mode=mode) as client:  # type: ignore[arg-type]
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        run, status = tools["agent_run"], tools["agent_status"]
        assert run.input_schema == AGENT_RUN_SCHEMA  # the seed's schemas, exactly
        assert status.input_schema == AGENT_STATUS_SCHEMA
        assert run.input_schema["properties"]["images"]["items"]["required"] == [
            "mime_type",
            "data_base64",
        ]
        assert run.input_schema["additionalProperties"] is False
        assert status.input_schema["required"] == ["task_id"]
        assert run.annotations is not None and status.annotations is not None
        assert (run.annotations.read_only_hint, run.annotations.destructive_hint) == (False, True)
        assert run.annotations.open_world_hint is False
        assert (status.annotations.read_only_hint, status.annotations.destructive_hint) == (
            True,
            False,
        )
        result = await client.call_tool("agent_run", {"request": "summarise"})
        assert result.is_error is False
        lines = text_of(result).splitlines()
        assert [line.split(":")[0] for line in lines] == [
            "task_id",
            "session_id",
            "status",
            "message",
        ]
        fields = status_lines("\n".join(lines))
        assert fields["status"] == "queued"
        done = await wait_status(client, fields["task_id"], "completed", "failed")
        assert done["status"] == "completed"
        assert done["result"] == "All done."
        assert done["session_id"] == fields["session_id"]
        # input errors are tool errors; nothing queued
        bad = await client.call_tool("agent_run", {"request": "   "})
        assert bad.is_error is True
        assert text_of(bad) == (
            "error: VALIDATION_ERROR\nmessage: request: must not be empty or only whitespace"
        )
        bad = await client.call_tool("agent_run", {"request": "x", "colour": "red"})
        assert bad.is_error is True
        assert text_of(bad).startswith("error: VALIDATION_ERROR\nmessage: unknown argument colour")
        zero = "00000000-0000-0000-0000-000000000000"
        missing = await client.call_tool("agent_status", {"task_id": zero})
        assert missing.is_error is False
        assert text_of(missing) == (
            f"task_id: {zero}\nstatus: failed\nmessage: Task {zero} was not found."
        )
    assert len(fake_ollama.chats) == 2


async def test_disabled_agent_lists_no_agent_tools(tmp_path: Path, fake_ollama: FakeOllama) -> None:
    data = tmp_path / "data"
    write_config(data, fake_ollama, enabled=False)
    async with Client(stdio_client(serve_params(data)), mode="auto") as client:  # type: ignore[arg-type]
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert "agent_run" not in names and "agent_status" not in names
        assert "write_message" in names


async def test_broken_agent_yaml_is_a_clear_startup_message(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.mcp.mcp_helpers import ROOT, child_env, serve_args

    data = tmp_path / "data"
    data.mkdir()
    (data / "agent.yaml").write_text("ollama:\n  temperature: 9\n")
    done = subprocess.run(
        [sys.executable, *serve_args(data)],
        input=b"",
        capture_output=True,
        env=child_env(),
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 1
    assert b"ollama.temperature: must be a number from 0.0 to 2.0" in done.stderr
    assert b"Traceback" not in done.stderr


async def test_tasks_extension_create_get_and_final_result(
    tmp_path: Path, fake_ollama: FakeOllama
) -> None:
    fake_ollama.replies = [
        Reply(content="1. Store", prompt_eval_count=7, eval_count=3),
        Reply(content="Stored.", prompt_eval_count=11, eval_count=5),
    ]
    data = tmp_path / "data"
    write_config(data, fake_ollama)
    TasksClient.created.clear()
    transport = stdio_client(serve_params(data))
    async with Client(transport, mode="auto", extensions=[TasksClient()]) as client:  # type: ignore[arg-type]
        assert TASKS_EXTENSION in (client.server_capabilities.extensions or {})
        # the SDK client resolves the task transparently by polling tasks/get
        final = await client.call_tool("agent_run", {"request": "store it"})
        assert final.is_error is False
        fields = status_lines(text_of(final))
        assert fields["status"] == "completed"
        assert fields["token_usage"] == "input=18 output=8 total=26"
        created = TasksClient.created[0]
        assert created.result_type == "task"
        assert created.task_id == fields["task_id"]
        assert created.status == "working"
        assert created.status_message is not None
        assert created.status_message.split(":")[0] in ("queued", "planning", "running")
        assert created.ttl_seconds is None
        # tasks/get on a terminal task: resultType complete, the final CallToolResult inline
        task = await get_task(client, created.task_id)
        assert task["resultType"] == "complete"
        assert task["status"] == "completed"
        assert task["statusMessage"].startswith("completed")
        assert task["result"]["content"][0]["text"] == text_of(final)
        assert task["result"].get("isError") is False
        # agent_status agrees
        status = await client.call_tool("agent_status", {"task_id": created.task_id})
        assert text_of(status) == text_of(final)
        # unknown task: -32602; update/cancel acknowledge any id
        zero = "00000000-0000-0000-0000-000000000000"
        with pytest.raises(MCPError) as info:
            await get_task(client, zero)
        assert info.value.error.code == types.INVALID_PARAMS
        ack = await client.session.send_request(
            UpdateTask(params=UpdateTaskParams(taskId=zero, inputResponses={})), ANY
        )
        assert ack.get("resultType") == "complete"
        ack = await client.session.send_request(CancelTask(params=TaskIdParams(taskId=zero)), ANY)
        assert ack.get("resultType") == "complete"


async def test_a_failed_agent_task_is_completed_with_is_error_under_the_extension(
    tmp_path: Path, fake_ollama: FakeOllama
) -> None:
    fake_ollama.models["memo:latest"] = ["completion"]  # no tools
    data = tmp_path / "data"
    write_config(data, fake_ollama)
    transport = stdio_client(serve_params(data))
    async with Client(transport, mode="auto", extensions=[TasksClient()]) as client:  # type: ignore[arg-type]
        created = await client.session.call_tool("agent_run", {"request": "x"}, allow_claimed=True)
        assert isinstance(created, CreateTaskResult)
        task = await poll_terminal(client, created.task_id)
        assert task["status"] == "completed"
        assert task["statusMessage"].startswith("failed")
        assert task["result"]["isError"] is True
        assert "status: failed" in task["result"]["content"][0]["text"]
        # input errors stay tool errors, never a task
        bad = await client.call_tool("agent_run", {"request": "x", "temperature": 2.5})
        assert bad.is_error is True
        assert text_of(bad) == (
            "error: VALIDATION_ERROR\nmessage: temperature: must be between 0.0 and 2.0"
        )
    assert fake_ollama.chats == []


@pytest.mark.parametrize("which", ["queued", "running"])
async def test_cancel_through_the_extension_over_stdio(
    tmp_path: Path, fake_ollama: FakeOllama, which: str
) -> None:
    hold = threading.Event()
    fake_ollama.replies = [Reply(content="1. wait for it", hold=hold)]
    data = tmp_path / "data"
    write_config(data, fake_ollama)
    transport = stdio_client(serve_params(data))
    try:
        async with Client(transport, mode="auto", extensions=[TasksClient()]) as client:  # type: ignore[arg-type]
            first = await client.session.call_tool(
                "agent_run", {"request": "slow"}, allow_claimed=True
            )
            second = await client.session.call_tool(
                "agent_run", {"request": "next"}, allow_claimed=True
            )
            assert isinstance(first, CreateTaskResult) and isinstance(second, CreateTaskResult)
            with anyio.fail_after(30):
                while "planning" not in (await get_task(client, first.task_id))["statusMessage"]:
                    await anyio.sleep(0.05)
            target = first if which == "running" else second
            await client.session.send_request(
                CancelTask(params=TaskIdParams(taskId=target.task_id)), ANY
            )
            hold.set()
            task = await poll_terminal(client, target.task_id)
            assert task["status"] == "cancelled"
            assert task["statusMessage"].startswith("cancelled")
            assert "result" not in task
            other = second if which == "running" else first
            assert (await poll_terminal(client, other.task_id))["status"] == "completed"
    finally:
        hold.set()


async def test_without_the_extension_declared_a_modern_client_gets_text(
    tmp_path: Path, fake_ollama: FakeOllama
) -> None:
    data = tmp_path / "data"
    write_config(data, fake_ollama)
    async with Client(stdio_client(serve_params(data)), mode="auto") as client:  # type: ignore[arg-type]
        result = await client.session.call_tool("agent_run", {"request": "x"}, allow_claimed=True)
        assert isinstance(result, types.CallToolResult)
        assert status_lines(text_of(result))["status"] == "queued"


async def test_several_clients_share_one_queue_with_one_active_task(
    tmp_path: Path, fake_ollama: FakeOllama
) -> None:
    memory = MemoryService.open(tmp_path / "data")
    config = AgentConfig(enabled=True, ollama_host=fake_ollama.host, ollama_model="memo")
    agent = AgentService(tmp_path / "data", memory, config.with_changes(images=ImageLimits()))
    active: list[int] = []
    agent.subscribe(
        lambda _t: active.append(
            sum(1 for t in agent.tasks() if t.state in ("planning", "running"))
        )
    )
    agent.start()
    server = build_agent_server(memory, agent)
    ids: list[str] = []
    try:

        async def one_client(n: int) -> None:
            async with Client(server, mode="legacy" if n % 2 else "auto") as client:
                for i in range(3):
                    result = await client.call_tool("agent_run", {"request": f"c{n} r{i}"})
                    ids.append(status_lines(text_of(result))["task_id"])

        async with anyio.create_task_group() as tg:
            for n in range(4):
                tg.start_soon(one_client, n)
        async with Client(server, mode="auto") as client:
            for tid in ids:
                await wait_status(client, tid, "completed", "failed")
    finally:
        agent.stop()
        memory.close()
    assert len(set(ids)) == 12
    assert max(active) == 1
    order = [t.task_id for t in sorted(agent.tasks(), key=lambda t: t.seq)]
    planned = [c["messages"][-1]["content"] for c in fake_ollama.chats if not c.get("tools")]
    assert planned == [agent.get(tid).request for tid in order]  # type: ignore[union-attr]


async def test_the_line_limit_admits_the_configured_maximum_images(
    tmp_path: Path, fake_ollama: FakeOllama
) -> None:
    """Two 6 MiB images are 16 MiB of base64: over the memory tools' 13 MiB line limit, within
    the limit derived from agent.yaml (20 MiB of images)."""
    import base64

    from convmem_engine.mcp.line_transport import MAX_LINE_BYTES

    image = base64.b64encode(b"\x89PNG" + b"\0" * (6 * 1024 * 1024 - 4)).decode()
    images = [{"mime_type": "image/png", "data_base64": image}] * 2
    assert 2 * len(image) > MAX_LINE_BYTES
    fake_ollama.models["memo:latest"] = ["completion", "tools", "vision"]
    data = tmp_path / "data"
    write_config(data, fake_ollama)
    async with Client(stdio_client(serve_params(data)), mode="legacy") as client:  # type: ignore[arg-type]
        result = await client.call_tool("agent_run", {"request": "look", "images": images})
        assert result.is_error is False, text_of(result)
        fields = status_lines(text_of(result))
        done = await wait_status(client, fields["task_id"], "completed", "failed")
        assert done["status"] == "completed", done
    sent = [m for m in fake_ollama.chats[0]["messages"] if m["role"] == "user"][-1]
    assert sent["images"] == [image, image]
