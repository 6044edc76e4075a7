"""The Agent panel with pytest-qt: a real AgentService on a real MemoryService, the fake
Ollama server, real widgets (offscreen)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from convmem_app.browser.agent_panel import AgentPanel
from convmem_engine.agent import AgentConfig, AgentService, load_config
from convmem_engine.service import MemoryService
from tests.agent.fake_ollama import FakeOllama, Reply

pytestmark = pytest.mark.gui


@pytest.fixture
def fake() -> Iterator[FakeOllama]:
    server = FakeOllama().start()
    yield server
    server.close()


@pytest.fixture
def make_panel(
    qtbot: Any, tmp_path: Path, service: MemoryService, fake: FakeOllama
) -> Iterator[Callable[..., AgentPanel]]:
    made: list[tuple[AgentPanel, AgentService]] = []

    def make(**changes: Any) -> AgentPanel:
        config = AgentConfig(enabled=True, ollama_host=fake.host, ollama_model="memo")
        agent = AgentService(tmp_path / "data", service, config.with_changes(**changes))
        agent.start()
        panel = AgentPanel(agent, tmp_path / "data")
        qtbot.addWidget(panel)
        panel.show()
        made.append((panel, agent))
        return panel

    yield make
    for panel, agent in made:
        assert panel.shutdown()
        agent.stop()


def test_models_come_from_ollama_and_test_connection_reports(
    qtbot: Any, make_panel: Callable[..., AgentPanel], fake: FakeOllama
) -> None:
    fake.models["vision-model:latest"] = ["completion", "tools", "vision"]
    panel = make_panel()
    panel.refresh_models_button.click()
    qtbot.waitUntil(lambda: panel.model_combo.count() == 2)
    assert [panel.model_combo.itemText(i) for i in range(2)] == [
        "memo:latest",
        "vision-model:latest",
    ]
    panel.model_combo.setEditText("vision-model:latest")
    panel.test_button.click()
    qtbot.waitUntil(lambda: "0.13.0" in panel.connection_label.text())
    assert "tools, vision" in panel.connection_label.text()


def test_test_connection_names_the_unreachable_host(
    qtbot: Any, make_panel: Callable[..., AgentPanel]
) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    panel = make_panel()
    panel.host_edit.setText(f"127.0.0.1:{port}")
    panel.test_button.click()
    qtbot.waitUntil(lambda: "unreachable" in panel.connection_label.text())
    assert f"http://127.0.0.1:{port}" in panel.connection_label.text()


def test_save_settings_writes_agent_yaml_and_applies(
    qtbot: Any, tmp_path: Path, make_panel: Callable[..., AgentPanel]
) -> None:
    panel = make_panel()
    panel.temperature_spin.setValue(0.4)
    panel.steps_spin.setValue(7)
    panel.tokens_spin.setValue(5000)
    panel.allow_delete_box.setChecked(True)
    panel.save_button.click()
    qtbot.waitUntil(lambda: panel.settings_label.text() == "Saved to agent.yaml.")
    stored = load_config(tmp_path / "data")
    assert (stored.ollama_temperature, stored.max_steps, stored.max_tokens) == (0.4, 7, 5000)
    assert stored.allow_delete is True and stored.enabled is True
    assert panel.agent.config == stored


def test_run_shows_live_state_result_and_audit_with_one_click_to_the_message(
    qtbot: Any, make_panel: Callable[..., AgentPanel], fake: FakeOllama
) -> None:
    fake.replies = [
        Reply(content="1. Write"),
        Reply(tool_calls=[("write_message", {"session_id": "s", "role": "user", "content": "x"})]),
        Reply(content="Written.", prompt_eval_count=40, eval_count=2),
    ]
    panel = make_panel()
    panel.request_edit.setPlainText("remember x")
    panel.run_button.click()
    qtbot.waitUntil(lambda: len(panel.agent.tasks()) == 1)
    task_id = panel.agent.tasks()[0].task_id
    qtbot.waitUntil(lambda: panel.row_state(task_id) == "completed", timeout=20_000)
    panel.queue_table.selectRow(0)
    assert "result: Written." in panel.result_view.toPlainText()
    assert panel.cancel_button.isEnabled() is False
    qtbot.waitUntil(lambda: panel.audit_table.rowCount() == 1)
    assert panel.audit_table.item(0, 2).text() == "write_message"
    message_id = panel.agent.audit()[0].message_ids[0]
    with qtbot.waitSignal(panel.openMessage) as opened:
        panel.audit_table.cellClicked.emit(0, 3)
    assert opened.args == [message_id]


def test_cancel_a_running_task_from_the_panel(
    qtbot: Any, make_panel: Callable[..., AgentPanel], fake: FakeOllama
) -> None:
    hold = threading.Event()
    fake.replies = [Reply(content="1. slow step", hold=hold)]
    panel = make_panel()
    panel.request_edit.setPlainText("slow")
    panel.run_button.click()
    qtbot.waitUntil(lambda: len(panel.agent.tasks()) == 1)
    task_id = panel.agent.tasks()[0].task_id
    qtbot.waitUntil(lambda: panel.row_state(task_id) == "planning")
    panel.queue_table.selectRow(0)
    assert panel.cancel_button.isEnabled()
    panel.cancel_button.click()
    qtbot.waitUntil(lambda: panel.agent.get(task_id).cancel_requested)  # type: ignore[union-attr]
    hold.set()
    qtbot.waitUntil(lambda: panel.row_state(task_id) == "cancelled", timeout=20_000)


def test_a_rejected_request_says_why_and_queues_nothing(
    qtbot: Any, make_panel: Callable[..., AgentPanel]
) -> None:
    panel = make_panel()
    panel.request_edit.setPlainText("   ")
    panel.run_button.click()
    qtbot.waitUntil(lambda: panel.request_label.text() != "")
    assert panel.request_label.text() == "request: must not be empty or only whitespace"
    assert panel.agent.tasks() == []
