"""The tray icon and its menu. Knows nothing about the engine: it shows what it is told and
emits a signal per menu action; `convmem_app.shell.app` wires both ends."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QIcon
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

RESOURCES = Path(__file__).resolve().parent.parent / "resources"


def app_icon() -> QIcon:
    """The ConvMem icon at every size we ship (PNG per size, the SVG for the rest)."""
    icon = QIcon()
    for size in (16, 24, 32, 48, 64, 128, 256):
        png = RESOURCES / f"convmem-{size}.png"
        if png.exists():
            icon.addFile(str(png))
    svg = RESOURCES / "convmem.svg"
    if icon.isNull() and svg.exists():
        icon.addFile(str(svg))
    return icon


def host_count_text(count: int) -> str:
    return f"{count} host connected" if count == 1 else f"{count} hosts connected"


class Tray(QObject):
    """QSystemTrayIcon + context menu. `menu` is also usable as a window menu (no tray)."""

    openBrowserRequested = Signal()
    copyConfigRequested = Signal()
    copyHttpConfigRequested = Signal()
    httpSettingsRequested = Signal()
    rebuildRequested = Signal()
    startAtLoginToggled = Signal(bool)
    quitRequested = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.menu = QMenu("ConvMem")
        self.open_action = QAction("Open memory browser", self.menu)
        self.status_action = QAction("Starting…", self.menu)
        self.status_action.setEnabled(False)
        self.copy_action = QAction("Copy host configuration", self.menu)
        self.copy_http_action = QAction("Copy HTTP host configuration", self.menu)
        self.copy_http_action.setEnabled(False)  # while HTTP serves (set_http_url)
        self.http_action = QAction("HTTP endpoint…", self.menu)
        self.rebuild_action = QAction("Rebuild index", self.menu)
        self.login_action = QAction("Start at login", self.menu)
        self.login_action.setCheckable(True)
        self.quit_action = QAction("Quit ConvMem", self.menu)
        for action in (self.open_action, self.status_action):
            self.menu.addAction(action)
        self.menu.addSeparator()
        for action in (
            self.copy_action,
            self.copy_http_action,
            self.http_action,
            self.rebuild_action,
            self.login_action,
        ):
            self.menu.addAction(action)
        self.menu.addSeparator()
        self.menu.addAction(self.quit_action)
        self.open_action.triggered.connect(self.openBrowserRequested)
        self.copy_action.triggered.connect(self.copyConfigRequested)
        self.copy_http_action.triggered.connect(self.copyHttpConfigRequested)
        self.http_action.triggered.connect(self.httpSettingsRequested)
        self.rebuild_action.triggered.connect(self.rebuildRequested)
        self.login_action.toggled.connect(self.startAtLoginToggled)
        self.quit_action.triggered.connect(self.quitRequested)
        self.set_engine_ready(False)

        self.icon = QSystemTrayIcon(app_icon(), self)
        self.icon.setContextMenu(self.menu)
        self.icon.setToolTip("ConvMem")
        self.icon.activated.connect(self._on_activated)
        self._health = "Starting…"
        self._hosts = 0
        self._host_names: tuple[str, ...] = ()

    @staticmethod
    def available() -> bool:
        return QSystemTrayIcon.isSystemTrayAvailable()

    def show(self) -> None:
        self.icon.show()

    def hide(self) -> None:
        self.icon.hide()

    def set_engine_ready(self, ready: bool) -> None:
        """Actions that need an open store are enabled only while one is open."""
        for action in (self.copy_action, self.rebuild_action):
            action.setEnabled(ready)

    def set_http_url(self, url: str) -> None:
        """The HTTP endpoint serves at `url` ("": it does not): the HTTP host configuration
        can be copied only while it serves."""
        self.copy_http_action.setEnabled(bool(url))
        self.copy_http_action.setToolTip(url or "HTTP is off (HTTP endpoint…)")

    def set_health(self, status: str) -> None:
        self._health = status
        self._refresh()

    def set_hosts(self, count: int, names: Sequence[str] = ()) -> None:
        """How many hosts are connected, and who (named in the tooltip)."""
        self._hosts = count
        self._host_names = tuple(names)
        self._refresh()

    def set_text(self, text: str) -> None:
        """A status line of its own (starting, error, quitting), instead of health + hosts."""
        self._health = ""
        self.status_action.setText(text)
        self.icon.setToolTip(f"ConvMem — {text}")

    @property
    def status_text(self) -> str:
        return self.status_action.text()

    def _refresh(self) -> None:
        if not self._health:
            return
        text = f"{self._health} · {host_count_text(self._hosts)}"
        if self._hosts and self._host_names:
            text += f" ({', '.join(self._host_names)})"
        self.status_action.setText(text)
        self.icon.setToolTip(f"ConvMem — {text}")

    def notify(self, title: str, text: str, critical: bool = False) -> None:
        if self.available() and self.icon.isVisible():
            kind = QSystemTrayIcon.MessageIcon
            self.icon.showMessage(title, text, kind.Critical if critical else kind.Information)

    def _on_activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason in (
            QSystemTrayIcon.ActivationReason.Trigger,
            QSystemTrayIcon.ActivationReason.DoubleClick,
        ):
            self.openBrowserRequested.emit()
