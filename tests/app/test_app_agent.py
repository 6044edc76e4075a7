"""The tray app runs the memory agent's queue: a host connected through the shim and the pipe
gets `agent_run`/`agent_status` (the fake Ollama answers), and a broken agent.yaml is a startup
error that names the key."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from app_helpers import initialize_request, lines, raw_shim, request
from PySide6.QtCore import QSettings
from pytestqt.qtbot import QtBot

from convmem_app.shell.app import ConvMemApp
from convmem_engine.agent import AgentConfig, save_config
from tests.agent.fake_ollama import FakeOllama, Reply

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("This plugin does not support")]

INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


@pytest.fixture
def fake() -> Iterator[FakeOllama]:
    server = FakeOllama().start()
    yield server
    server.close()


@pytest.fixture
def app(qtbot: QtBot, tmp_path: Path) -> Iterator[ConvMemApp]:
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    made = ConvMemApp(tmp_path / "data", settings=settings, busy_wait=0.3)
    yield made
    if made.state != "stopped":
        with qtbot.waitSignal(made.finished, timeout=30_000):
            made.quit()


def test_a_pipe_host_runs_an_agent_task(
    qtbot: QtBot, app: ConvMemApp, fake: FakeOllama, tmp_path: Path
) -> None:
    fake.replies = [Reply(content="1. Answer"), Reply(content="Nothing to do.")]
    config = AgentConfig(enabled=True, ollama_host=fake.host, ollama_model="memo")
    (tmp_path / "data").mkdir()
    save_config(tmp_path / "data", config)
    app.start()
    qtbot.waitUntil(lambda: app.state == "running", timeout=30_000)
    shim = raw_shim(app.data_dir, "--start-timeout", "0")
    call = request(2, "tools/call", {"name": "agent_run", "arguments": {"request": "hello"}})
    answers: list[dict[str, Any]] = []

    def talk() -> None:
        out, _err = shim.communicate(
            lines(initialize_request("agent-test"), INITIALIZED, call), timeout=60
        )
        answers.extend(json.loads(line) for line in out.splitlines())

    talker = threading.Thread(target=talk)
    talker.start()
    qtbot.waitUntil(lambda: not talker.is_alive(), timeout=60_000)
    talker.join()
    result = next(a for a in answers if a.get("id") == 2)["result"]
    text = result["content"][0]["text"]
    assert result.get("isError") is False
    assert text.splitlines()[2] == "status: queued"
    task_id = text.splitlines()[0].split(": ")[1]
    qtbot.waitUntil(lambda: len(fake.chats) == 2, timeout=30_000)
    status = request(3, "tools/call", {"name": "agent_status", "arguments": {"task_id": task_id}})
    answers.clear()
    shim = raw_shim(app.data_dir, "--start-timeout", "0")

    def poll() -> None:
        out, _err = shim.communicate(
            lines(initialize_request("agent-test"), INITIALIZED, status), timeout=60
        )
        answers.extend(json.loads(line) for line in out.splitlines())

    poller = threading.Thread(target=poll)
    poller.start()
    qtbot.waitUntil(lambda: not poller.is_alive(), timeout=60_000)
    poller.join()
    text = next(a for a in answers if a.get("id") == 3)["result"]["content"][0]["text"]
    assert f"task_id: {task_id}" in text


def test_a_broken_agent_yaml_is_a_startup_error_naming_the_key(
    qtbot: QtBot, app: ConvMemApp, tmp_path: Path
) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "agent.yaml").write_text("budgets:\n  max_steps: lots\n")
    app.start()
    qtbot.waitUntil(lambda: app.state == "error", timeout=30_000)
    window = app.error_window
    assert window is not None
    assert "budgets.max_steps: must be an integer" in window.detail_label.text()


def test_the_window_has_an_agent_tab_on_the_runtimes_queue(
    qtbot: QtBot, app: ConvMemApp, fake: FakeOllama, tmp_path: Path
) -> None:
    from convmem_app.browser.agent_panel import AgentPanel
    from convmem_engine.agent.part import AgentPart

    config = AgentConfig(enabled=True, ollama_host=fake.host, ollama_model="memo")
    (tmp_path / "data").mkdir()
    save_config(tmp_path / "data", config)
    fake.replies = [
        Reply(content="1. Write"),
        Reply(tool_calls=[("write_message", {"session_id": "s", "role": "user", "content": "x"})]),
        Reply(content="Written."),
    ]
    app.start()
    qtbot.waitUntil(lambda: app.state == "running", timeout=30_000)
    app.show_window()
    window = app.window
    assert window is not None
    panel = app.agent_panel
    assert isinstance(panel, AgentPanel)
    tabs = [window.tabs.tabText(i) for i in range(window.tabs.count())]
    assert tabs[-1] == "A&gent"
    part = app.runtime.part("agent") if app.runtime is not None else None
    assert isinstance(part, AgentPart) and panel.agent is part.agent
    panel.request_edit.setPlainText("remember x")
    panel.run_button.click()
    qtbot.waitUntil(lambda: panel.audit_table.rowCount() == 1, timeout=30_000)
    message_id = panel.agent.audit()[0].message_ids[0]
    with qtbot.waitSignal(panel.openRequested, timeout=10_000) as opened:
        panel.audit_table.cellClicked.emit(0, 3)
    assert opened.args == [message_id, "s"]
