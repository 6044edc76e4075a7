"""Settings → HTTP: turn the `POST /mcp` listener on or off, choose its port, see the endpoint,
show / copy / regenerate the bearer token, and copy the configuration an HTTP host needs.

The dialog only edits and shows: `applyRequested(enabled, port)` asks the app to (re)start or
stop the listener, and the app answers with `set_status`. The choice is kept in QSettings
(`http/enabled`, `http/port`); the token lives in the data dir (`HttpToken`), never in QSettings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from PySide6.QtCore import QSettings, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from convmem_engine.mcp.http_config import (
    DEFAULT_PORT,
    ENDPOINT_PATH,
    claude_code_command,
    http_host_json,
)
from convmem_engine.mcp.http_token import ENV_VAR, HttpToken, TokenError

KEY_ENABLED: Final = "http/enabled"
KEY_PORT: Final = "http/port"
MIN_PORT: Final = 1024


@dataclass(frozen=True)
class HttpChoice:
    enabled: bool = False
    port: int = DEFAULT_PORT


def load_choice(settings: QSettings) -> HttpChoice:
    enabled = settings.value(KEY_ENABLED, False, type=bool)
    port = settings.value(KEY_PORT, DEFAULT_PORT, type=int)
    if not isinstance(port, int) or not MIN_PORT <= port <= 65535:
        port = DEFAULT_PORT
    return HttpChoice(bool(enabled), port)


def save_choice(settings: QSettings, choice: HttpChoice) -> None:
    settings.setValue(KEY_ENABLED, choice.enabled)
    settings.setValue(KEY_PORT, choice.port)
    settings.sync()


def endpoint_url(port: int) -> str:
    return f"http://127.0.0.1:{port}{ENDPOINT_PATH}"


@dataclass(frozen=True)
class HttpStatus:
    """What the app reports about its listener."""

    serving: bool
    url: str = ""
    problem: str = ""  # why it is not serving although enabled (e.g. the port is in use)

    def text(self) -> str:
        if self.serving:
            return f"Serving MCP at {self.url}"
        if self.problem:
            return f"Not serving: {self.problem}. The local pipe still serves every shim host."
        return "Off. Hosts reach ConvMem through the shim (local pipe) only."


class HttpSettingsDialog(QDialog):
    """Settings → HTTP. Non-modal; the app keeps one and shows it on demand."""

    applyRequested = Signal(bool, int)  # enabled, port
    copied = Signal(str)  # what was put on the clipboard ("url", "token", "claude", "json")

    def __init__(self, token: HttpToken, choice: HttpChoice, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("ConvMem — HTTP endpoint")
        self.token = token
        self.status = HttpStatus(serving=False)

        self.enabled_box = QCheckBox("Serve MCP over HTTP on this computer (loopback only)")
        self.enabled_box.setChecked(choice.enabled)
        self.port_box = QSpinBox()
        self.port_box.setRange(MIN_PORT, 65535)
        self.port_box.setValue(choice.port)
        self.status_label = QLabel()
        self.status_label.setWordWrap(True)

        self.url_field = QLineEdit()
        self.url_field.setReadOnly(True)
        self.copy_url_button = QPushButton("Copy")
        self.token_field = QLineEdit()
        self.token_field.setReadOnly(True)
        self.token_field.setEchoMode(QLineEdit.EchoMode.Password)
        self.show_token_button = QPushButton("Show")
        self.show_token_button.setCheckable(True)
        self.copy_token_button = QPushButton("Copy")
        self.regenerate_button = QPushButton("Regenerate")
        self.regenerate_button.setToolTip("A new token; the old one stops working at once.")
        if token.from_environment:
            self.regenerate_button.setEnabled(False)
            self.regenerate_button.setToolTip(f"The token comes from {ENV_VAR}.")
        self.copy_claude_button = QPushButton("Copy Claude Code command")
        self.copy_json_button = QPushButton("Copy JSON (url + header)")
        self.problem_label = QLabel()
        self.problem_label.setWordWrap(True)

        form = QFormLayout()
        form.addRow(self.enabled_box)
        form.addRow("Port", self.port_box)
        form.addRow("Endpoint", _row(self.url_field, self.copy_url_button))
        form.addRow(
            "Token",
            _row(
                self.token_field,
                self.show_token_button,
                self.copy_token_button,
                self.regenerate_button,
            ),
        )
        form.addRow("Host configuration", _row(self.copy_claude_button, self.copy_json_button))
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Apply | QDialogButtonBox.StandardButton.Close
        )
        self.apply_button = buttons.button(QDialogButtonBox.StandardButton.Apply)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.status_label)
        layout.addWidget(self.problem_label)
        layout.addWidget(buttons)

        self.apply_button.clicked.connect(self.apply)
        buttons.rejected.connect(self.close)
        self.port_box.valueChanged.connect(self._refresh)
        self.show_token_button.toggled.connect(self._show_token)
        self.copy_url_button.clicked.connect(lambda: self._copy("url", self.url()))
        self.copy_token_button.clicked.connect(self._copy_token)
        self.copy_claude_button.clicked.connect(
            lambda: self._copy("claude", claude_code_command(self.url(), self.token.value()))
        )
        self.copy_json_button.clicked.connect(
            lambda: self._copy("json", http_host_json(self.url(), self.token.value()))
        )
        self.regenerate_button.clicked.connect(self.regenerate)
        if choice.enabled or token.from_environment or token.path.exists():
            self._load_token()  # else generated at first enable (apply)
        else:
            self.token_field.setPlaceholderText("generated when HTTP is first turned on")
        self._refresh()

    # ---- what it shows ----

    def url(self) -> str:
        return self.status.url if self.status.serving else endpoint_url(self.port_box.value())

    def set_status(self, status: HttpStatus) -> None:
        self.status = status
        self._refresh()

    def _refresh(self) -> None:
        self.url_field.setText(self.url())
        self.status_label.setText(self.status.text())

    def _load_token(self) -> None:
        try:
            self.token_field.setText(self.token.value())
            self.problem_label.clear()
        except TokenError as error:
            self.token_field.clear()
            self.problem_label.setText(str(error))

    def _show_token(self, shown: bool) -> None:
        mode = QLineEdit.EchoMode.Normal if shown else QLineEdit.EchoMode.Password
        self.token_field.setEchoMode(mode)
        self.show_token_button.setText("Hide" if shown else "Show")

    # ---- what it does ----

    def apply(self) -> None:
        if self.enabled_box.isChecked() and not self.token_field.text():
            self._load_token()
        self.applyRequested.emit(self.enabled_box.isChecked(), self.port_box.value())

    def regenerate(self) -> None:
        try:
            self.token.regenerate()
        except TokenError as error:
            self.problem_label.setText(str(error))
            return
        self._load_token()
        self.problem_label.setText("New token: hosts using the old one must be updated.")

    def _copy_token(self) -> None:
        self._load_token()
        self._copy("token", self.token.value())

    def _copy(self, what: str, text: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.copied.emit(what)


def _row(*widgets: QWidget) -> QWidget:
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    for widget in widgets:
        layout.addWidget(widget)
    return row
