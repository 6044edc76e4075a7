"""The app's HTTP endpoint control over a real Runtime (pytest-qt, offscreen): start as the
settings say, move to another port, turn off, a busy port is a status and a notification while
the runtime runs on."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings
from pytestqt.qtbot import QtBot

from convmem_app.shell.http_control import HttpControl
from convmem_app.shell.http_settings import HttpChoice, save_choice
from convmem_engine.runtime import Runtime, RuntimeState
from tests.served_http import free_port

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("This plugin does not support")]

HEALTH = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "get_system_health", "arguments": {}},
    }
).encode()


def post(port: int, token: str) -> int:
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Length: {len(HEALTH)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + HEALTH)
        return int(sock.recv(4096).split()[1])


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    rt = Runtime(tmp_path / "data")
    rt.open()
    yield rt
    rt.stop(1)


def make(tmp_path: Path, runtime: Runtime, choice: HttpChoice) -> HttpControl:
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    save_choice(settings, choice)
    return HttpControl(settings, runtime.data_dir)


def test_start_move_and_stop_as_the_settings_say(
    qtbot: QtBot, tmp_path: Path, runtime: Runtime
) -> None:
    first, second = free_port(), free_port()
    control = make(tmp_path, runtime, HttpChoice(True, first))
    with qtbot.waitSignal(control.statusChanged, timeout=30_000):
        control.attach(runtime)
    assert control.status.serving and control.status.url == f"http://127.0.0.1:{first}/mcp"
    token = control.token().value()
    assert post(first, token) == 200
    assert runtime.health().listeners == ("http",)

    dialog = control.show_dialog()
    dialog.port_box.setValue(second)
    with qtbot.waitSignal(control.statusChanged, timeout=30_000):
        dialog.apply_button.click()
    assert control.status.url == f"http://127.0.0.1:{second}/mcp"
    assert "Serving MCP at" in dialog.status_label.text()
    assert post(second, token) == 200
    assert port_is_free(first)
    assert runtime.health().listeners == ("http",)

    with qtbot.waitSignal(control.statusChanged, timeout=30_000):
        control.apply(False, second)
    assert not control.status.serving and port_is_free(second)
    assert runtime.health().listeners == ()
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    assert settings.value("http/enabled", type=bool) is False
    control.detach()
    control.shutdown()
    dialog.close()


def test_a_busy_port_is_a_status_and_the_runtime_runs_on(
    qtbot: QtBot, tmp_path: Path, runtime: Runtime
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        control = make(tmp_path, runtime, HttpChoice(True, port))
        with qtbot.waitSignal(control.problem, timeout=30_000) as blocker:
            control.attach(runtime)
        assert str(port) in blocker.args[0] and "in use" in blocker.args[0]
        assert not control.status.serving and str(port) in control.status.problem
        assert runtime.state is RuntimeState.RUNNING and runtime.health().listeners == ()
        assert runtime.service.get_system_health()["status"] == "OK"
    control.detach()
    control.shutdown()


def test_off_by_default(qtbot: QtBot, tmp_path: Path, runtime: Runtime) -> None:
    settings = QSettings(str(tmp_path / "fresh.ini"), QSettings.Format.IniFormat)
    control = HttpControl(settings, runtime.data_dir)
    control.attach(runtime)
    qtbot.wait(200)
    assert not control.status.serving and runtime.health().listeners == ()
    assert not (runtime.data_dir / "http-token").exists()
    control.detach()
    control.shutdown()


def test_the_body_limit_follows_the_runtime_message_limit(tmp_path: Path, runtime: Runtime) -> None:
    """The agent part raises the runtime's message limit for its configured images (base64
    4/3); the HTTP listener admits the same."""
    from convmem_engine.mcp.http_config import HttpConfig, max_body_bytes
    from convmem_engine.mcp.http_token import HttpToken
    from convmem_engine.runtime.http_listener import HttpRuntimeListener

    raised = max_body_bytes(20 * 1024 * 1024)
    runtime.max_line_bytes = raised  # type: ignore[attr-defined]
    listener = HttpRuntimeListener(HttpToken(runtime.data_dir, {}), HttpConfig(port=0))
    runtime.add_listener(listener)
    assert listener.http.config.body_limit == raised
    runtime.loop.submit(listener.stop(1)).result(30)
    runtime.remove_listener(listener)
