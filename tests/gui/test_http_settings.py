"""Settings → HTTP with pytest-qt (offscreen): the choice, the endpoint, the token's show / copy /
regenerate, the host configuration on the clipboard, the status the app reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QLineEdit
from pytestqt.qtbot import QtBot

from convmem_app.shell.http_settings import (
    HttpChoice,
    HttpSettingsDialog,
    HttpStatus,
    load_choice,
    save_choice,
)
from convmem_engine.mcp.http_config import DEFAULT_PORT
from convmem_engine.mcp.http_token import ENV_VAR, TOKEN_FILE_NAME, HttpToken

pytestmark = pytest.mark.gui


def make(qtbot: QtBot, tmp_path: Path, choice: HttpChoice, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    dialog = HttpSettingsDialog(HttpToken(tmp_path, env or {}), choice)
    qtbot.addWidget(dialog)
    dialog.show()
    return dialog


def test_choice_round_trips_through_settings(tmp_path: Path) -> None:
    settings = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    assert load_choice(settings) == HttpChoice(False, DEFAULT_PORT)
    save_choice(settings, HttpChoice(True, 9123))
    again = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    assert load_choice(again) == HttpChoice(True, 9123)
    again.setValue("http/port", 80)  # out of range: back to the default
    assert load_choice(again).port == DEFAULT_PORT
    assert "token" not in (tmp_path / "s.ini").read_text().lower()


def test_apply_emits_the_choice_and_status_is_shown(qtbot: QtBot, tmp_path: Path) -> None:
    dialog = make(qtbot, tmp_path, HttpChoice(False, 9200))
    assert "Off" in dialog.status_label.text()
    assert not (tmp_path / TOKEN_FILE_NAME).exists()  # generated at first enable
    assert dialog.token_field.text() == ""
    assert dialog.url_field.text() == "http://127.0.0.1:9200/mcp"
    dialog.enabled_box.setChecked(True)
    dialog.port_box.setValue(9201)
    assert dialog.url_field.text() == "http://127.0.0.1:9201/mcp"
    with qtbot.waitSignal(dialog.applyRequested) as blocker:
        dialog.apply_button.click()
    assert blocker.args == [True, 9201]
    assert dialog.token_field.text() == (tmp_path / TOKEN_FILE_NAME).read_text().strip()
    dialog.set_status(HttpStatus(serving=True, url="http://127.0.0.1:9201/mcp"))
    assert "Serving MCP at http://127.0.0.1:9201/mcp" in dialog.status_label.text()
    dialog.set_status(HttpStatus(serving=False, problem="port 9201 is already in use"))
    text = dialog.status_label.text()
    assert "port 9201 is already in use" in text and "pipe" in text


def test_token_is_hidden_shown_copied_and_regenerated(qtbot: QtBot, tmp_path: Path) -> None:
    dialog = make(qtbot, tmp_path, HttpChoice(True, 9300))
    token = dialog.token.value()
    assert (tmp_path / TOKEN_FILE_NAME).read_text().strip() == token
    assert dialog.token_field.echoMode() == QLineEdit.EchoMode.Password
    assert dialog.token_field.text() == token
    dialog.show_token_button.click()
    assert dialog.token_field.echoMode() == QLineEdit.EchoMode.Normal
    dialog.show_token_button.click()
    assert dialog.token_field.echoMode() == QLineEdit.EchoMode.Password

    clipboard = QGuiApplication.clipboard()
    dialog.copy_token_button.click()
    assert clipboard.text() == token
    dialog.copy_url_button.click()
    assert clipboard.text() == "http://127.0.0.1:9300/mcp"

    dialog.regenerate_button.click()
    fresh = dialog.token.value()
    assert fresh != token and dialog.token_field.text() == fresh
    assert (tmp_path / TOKEN_FILE_NAME).read_text().strip() == fresh
    assert "old one" in dialog.problem_label.text()


def test_host_configuration_offers_the_http_forms(qtbot: QtBot, tmp_path: Path) -> None:
    dialog = make(qtbot, tmp_path, HttpChoice(True, 9400))
    dialog.set_status(HttpStatus(serving=True, url="http://127.0.0.1:9400/mcp"))
    token = dialog.token.value()
    clipboard = QGuiApplication.clipboard()
    with qtbot.waitSignal(dialog.copied) as blocker:
        dialog.copy_claude_button.click()
    assert blocker.args == ["claude"]
    assert clipboard.text() == (
        "claude mcp add --transport http convmem http://127.0.0.1:9400/mcp "
        f'--header "Authorization: Bearer {token}"'
    )
    dialog.copy_json_button.click()
    entry = json.loads(clipboard.text())["mcpServers"]["convmem"]
    assert entry == {
        "type": "http",
        "url": "http://127.0.0.1:9400/mcp",
        "headers": {"Authorization": f"Bearer {token}"},
    }


def test_an_environment_token_cannot_be_regenerated(qtbot: QtBot, tmp_path: Path) -> None:
    dialog = make(qtbot, tmp_path, HttpChoice(True, 9500), {ENV_VAR: "z" * 40})
    assert dialog.token_field.text() == "z" * 40
    assert not dialog.regenerate_button.isEnabled()
    assert ENV_VAR in dialog.regenerate_button.toolTip()
    assert not (tmp_path / TOKEN_FILE_NAME).exists()
