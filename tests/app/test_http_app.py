"""The app with its HTTP endpoint on (pytest-qt, offscreen): HTTP clients, shim hosts on the pipe
and the GUI writing at once lose nothing; a busy port leaves the pipe serving; the tray copies
the HTTP host configuration next to the shim's."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from app_helpers import shim_client
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from PySide6.QtCore import QSettings
from PySide6.QtGui import QGuiApplication
from pytestqt.qtbot import QtBot
from tool_results import call

from convmem_app.shell.app import ConvMemApp
from convmem_app.shell.http_settings import HttpChoice, save_choice
from tests.served_http import free_port

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("This plugin does not support")]

HOSTS = 3
WRITES = 15


@pytest.fixture
def app_with_http(qtbot: QtBot, tmp_path: Path) -> Iterator[tuple[ConvMemApp, int]]:
    port = free_port()
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    save_choice(settings, HttpChoice(True, port))
    app = ConvMemApp(tmp_path / "data", settings=settings, minimized=True, busy_wait=0.3)
    app.start()
    qtbot.waitUntil(lambda: app.state == "running", timeout=30_000)
    qtbot.waitUntil(lambda: app.http.status.serving, timeout=30_000)
    yield app, port
    if app.state != "stopped":
        with qtbot.waitSignal(app.finished, timeout=30_000):
            app.quit()


def test_http_pipe_and_gui_writing_at_once_lose_nothing(
    qtbot: QtBot, tmp_path: Path, app_with_http: tuple[ConvMemApp, int]
) -> None:
    app, port = app_with_http
    url = f"http://127.0.0.1:{port}/mcp"
    token = app.http.token().value()
    errlog = (tmp_path / "shims.log").open("w")
    failures: list[BaseException] = []

    async def over_pipe(n: int) -> None:
        async with shim_client(app.data_dir, errlog, "--start-timeout", "0") as client:
            for i in range(WRITES):
                await call(
                    client, "write_message", session_id=f"pipe{n}", role="user", content=f"{i}"
                )

    async def over_http(n: int) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            create_mcp_http_client(headers=headers) as http,
            Client(
                streamable_http_client(url, http_client=http), mode="legacy" if n % 2 else "auto"
            ) as client,
        ):
            for i in range(WRITES):
                await call(
                    client, "write_message", session_id=f"http{n}", role="user", content=f"{i}"
                )

    async def hosts() -> None:
        async with anyio.create_task_group() as group:
            for n in range(HOSTS):
                group.start_soon(over_pipe, n)
                group.start_soon(over_http, n)

    def run_hosts() -> None:
        try:
            anyio.run(hosts)
        except BaseException as exc:  # reported on the test thread
            failures.append(exc)

    thread = threading.Thread(target=run_hosts)
    thread.start()
    service: Any = app.service
    written = 0
    while thread.is_alive() or written < WRITES:
        if written < WRITES:  # the GUI thread writes too, between its events
            service.write_message(session_id="gui", role="user", content=f"{written}")
            written += 1
        qtbot.wait(20)
    thread.join()
    errlog.close()
    assert not failures, failures
    sessions = ["gui"] + [f"{kind}{n}" for kind in ("pipe", "http") for n in range(HOSTS)]
    for session in sessions:
        history = service.read_messages(session_id=session, limit=100)["history"]
        assert [m["content"] for m in history] == [str(i) for i in range(WRITES)], session
    assert service.check() == []


def test_a_busy_port_leaves_the_pipe_serving(qtbot: QtBot, tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
        save_choice(settings, HttpChoice(True, port))
        app = ConvMemApp(tmp_path / "data", settings=settings, minimized=True, busy_wait=0.3)
        with qtbot.waitSignal(app.http.problem, timeout=30_000) as blocker:
            app.start()
        assert str(port) in blocker.args[0]
        qtbot.waitUntil(lambda: app.state == "running", timeout=30_000)
        errlog = (tmp_path / "shim.log").open("w")

        async def over_pipe() -> None:
            async with shim_client(app.data_dir, errlog, "--start-timeout", "0") as client:
                await call(client, "write_message", session_id="p", role="user", content="ok")

        done: list[bool] = []
        thread = threading.Thread(target=lambda: done.append(anyio.run(over_pipe) is None))
        thread.start()
        qtbot.waitUntil(lambda: not thread.is_alive(), timeout=60_000)
        errlog.close()
        assert done == [True]
        assert not app.tray.copy_http_action.isEnabled()
    with qtbot.waitSignal(app.finished, timeout=30_000):
        app.quit()


def test_tray_copies_the_http_host_configuration(
    qtbot: QtBot, app_with_http: tuple[ConvMemApp, int]
) -> None:
    app, port = app_with_http
    assert app.tray.copy_http_action.isEnabled()
    app.tray.copy_http_action.trigger()
    text = QGuiApplication.clipboard().text()
    token = app.http.token().value()
    assert text == (
        f"claude mcp add --transport http convmem http://127.0.0.1:{port}/mcp "
        f'--header "Authorization: Bearer {token}"'
    )
    app.tray.copy_action.trigger()  # the shim form is still there, next to it
    assert '"mcpServers"' in QGuiApplication.clipboard().text()
    app.tray.http_action.trigger()
    assert app.http.dialog is not None and app.http.dialog.isVisible()
    assert "Serving MCP at" in app.http.dialog.status_label.text()
    app.http.dialog.close()
