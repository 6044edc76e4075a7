"""`convmem app`: the tray app that owns a data dir and serves its hosts over the local pipe.

Startup: a second app for the same data dir first asks the running one (a control message on
the pipe) to raise its window, then exits 0. Otherwise the store is opened off the GUI thread
(which takes the data-dir lock), the MCP server is built, and only then the pipe listens: a
stale socket left by a crash is removed while we hold the lock, never a live app's.

A BUSY lock is first taken for "an app is starting up": for `busy_wait` seconds the app keeps
trying to hand over and to open; then the BUSY error shows. Every startup problem appears as a
tray notification and in a window with what to do next (`startup_error`).

Quit (tray, control message, SIGTERM/SIGINT, closing the window when there is no tray) is
graceful: the pipe stops accepting, requests already received finish and are answered, the
sessions end, background work ends, the service closes (releasing the lock).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import (
    QEvent,
    QObject,
    QSettings,
    QSocketNotifier,
    Qt,
    QTimer,
    Signal,
    SignalInstance,
)
from PySide6.QtGui import QGuiApplication
from PySide6.QtNetwork import QLocalSocket
from PySide6.QtWidgets import QApplication

from convmem_app.hosts.configure import shim_command
from convmem_app.shell import autostart, claude_desktop
from convmem_app.shell.pipe_bridge import ListenError, PipeBridge, control_line
from convmem_app.shell.startup_error import StartupErrorWindow, describe
from convmem_app.shell.tray import Tray, app_icon
from convmem_app.shim.paths import endpoint, resolve_data_dir
from convmem_engine.runtime.engine_thread import EngineThread

if TYPE_CHECKING:
    from convmem_app.browser import MemoryBrowser
from convmem_engine.domain.errors import BusyError

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_STARTUP_FAILED = 3
BUSY_WAIT_DEFAULT = 10.0
QUIT_GRACE = 10.0
HEALTH_INTERVAL_MS = 10_000


# ---- talking to a running app -----------------------------------------------------------------


def send_control(name: str, command: str, timeout_ms: int = 2000) -> dict[str, Any] | None:
    """Send one control message to the app listening on `name`; its answer, or None when no
    app answers there."""
    sock = QLocalSocket()
    try:
        sock.connectToServer(name)
        if not sock.waitForConnected(timeout_ms):
            return None
        sock.write(control_line(command))
        sock.waitForBytesWritten(timeout_ms)
        deadline = time.monotonic() + timeout_ms / 1000
        while not sock.canReadLine():
            remaining = int((deadline - time.monotonic()) * 1000)
            if remaining <= 0 or not sock.waitForReadyRead(remaining):
                break
        line = bytes(sock.readLine().data())
        answer = json.loads(line) if line else None
        if isinstance(answer, dict) and answer.get("convmem_control") == "ok":
            return answer
        return None
    except ValueError:
        return None
    finally:
        sock.abort()


def handover_command(minimized: bool) -> str:
    """The control message a starting app sends an app already running for its data dir. A
    minimised start (the shim, start at login) only checks the running app is there; a start by
    the user brings its window to the front."""
    return "status" if minimized else "raise"


# ---- host configuration (the shim command: convmem_app.hosts) ------------------------------


def host_configuration(data_dir: Path) -> str:
    """The JSON snippet for a host's MCP server list (Claude Desktop's `mcpServers` shape)."""
    command = shim_command(data_dir)
    config = {"mcpServers": {"convmem": {"command": command[0], "args": command[1:]}}}
    return json.dumps(config, indent=2)


# ---- windows --------------------------------------------------------------------------------


class _CloseWatcher(QObject):
    """Without a tray, closing the main window is the way to quit."""

    def __init__(self, on_close: Callable[[], None], parent: QObject) -> None:
        super().__init__(parent)
        self._on_close = on_close

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Close:
            QTimer.singleShot(0, self._on_close)
        return False


# ---- the app --------------------------------------------------------------------------------


def _log_worker_failure(future: concurrent.futures.Future[None]) -> None:
    """A worker function reports its own errors through a signal; anything escaping that (a
    bug) would otherwise sit unseen in a Future nobody reads."""
    if not future.cancelled() and (exc := future.exception()) is not None:
        # The frames, not the message: an exception's text may quote stored content.
        frames = "".join(traceback.format_tb(exc.__traceback__))
        log.error("background work failed: %s\n%s", type(exc).__name__, frames)


def default_settings() -> QSettings:
    return QSettings(QSettings.Format.IniFormat, QSettings.Scope.UserScope, "ConvMem", "ConvMem")


class ConvMemApp(QObject):
    """Owns the tray, the engine thread, the service, the pipe bridge and the windows."""

    finished = Signal(int)  # exit status, once the app has fully stopped
    stateChanged = Signal(str)
    hostsChanged = Signal(int)
    healthChanged = Signal(str)
    rebuildFinished = Signal(object)
    messageShown = Signal(str, str)

    _opened = Signal(object)
    _openFailed = Signal(object)
    _healthReady = Signal(object)
    _rebuildDone = Signal(object)
    _storeChanged = Signal()

    def __init__(
        self,
        data_dir: Path,
        *,
        minimized: bool = False,
        busy_wait: float = BUSY_WAIT_DEFAULT,
        settings: QSettings | None = None,
        quit_grace: float = QUIT_GRACE,
    ) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.minimized = minimized
        self.busy_wait = busy_wait
        self.quit_grace = quit_grace
        self.settings = settings if settings is not None else default_settings()
        self.state = "new"
        self.exit_code = EXIT_OK
        self.service: Any = None
        self.bridge: PipeBridge | None = None
        self.engine: EngineThread | None = None
        self.window: MemoryBrowser | None = None
        self.error_window: StartupErrorWindow | None = None
        self.last_problem_code = ""
        self._unsubscribe: Callable[[], None] | None = None
        self._busy_deadline: float | None = None
        self._quitting = False
        self._rebuilding = False
        self._health_pending = False
        self._workers = concurrent.futures.ThreadPoolExecutor(2, "convmem-gui-work")

        self.tray = Tray(self)
        self.has_tray = Tray.available()
        self.tray.openBrowserRequested.connect(self.show_window)
        self.tray.copyConfigRequested.connect(self.copy_host_configuration)
        self.tray.rebuildRequested.connect(self.rebuild_index)
        self.tray.quitRequested.connect(self.quit)
        self.tray.login_action.setChecked(self.start_at_login)
        self.tray.startAtLoginToggled.connect(self.set_start_at_login)

        # Emitted on worker and writer threads: queued, so the slots run on the GUI thread.
        queued = Qt.ConnectionType.QueuedConnection
        self._opened.connect(self._on_opened, queued)
        self._openFailed.connect(self._on_open_failed, queued)
        self._healthReady.connect(self._on_health, queued)
        self._rebuildDone.connect(self._on_rebuild_done, queued)
        self._health_timer = QTimer(self)
        self._health_timer.setInterval(HEALTH_INTERVAL_MS)
        self._health_timer.timeout.connect(self.refresh_health)
        self._change_timer = QTimer(self)
        self._change_timer.setSingleShot(True)
        self._change_timer.setInterval(500)
        self._change_timer.timeout.connect(self.refresh_health)
        self._storeChanged.connect(self._change_timer.start, queued)

    # ---- startup ----

    def _set_state(self, state: str) -> None:
        self.state = state
        self.stateChanged.emit(state)

    def start(self) -> None:
        """Open the store (off the GUI thread), then listen. Also what Retry does."""
        if self._quitting or self.state in ("starting", "running"):
            return
        self._set_state("starting")
        self.tray.set_text("Starting…")
        if self.has_tray:
            self.tray.show()
        if self.engine is None:
            self.engine = EngineThread()
            self.engine.start()
        self._workers.submit(self._open_worker).add_done_callback(_log_worker_failure)

    def _open_worker(self) -> None:
        try:
            from convmem_engine.mcp import build_server, serve_lines
            from convmem_engine.service import MemoryService

            service = MemoryService.open(self.data_dir)
            try:
                server = build_server(service)
            except BaseException:
                service.close()
                raise
        except Exception as exc:
            self._openFailed.emit(exc)
            return
        self._opened.emit((service, server, serve_lines))

    def _on_opened(self, payload: tuple[Any, Any, Any]) -> None:
        service, server, serve = payload
        if self._quitting:
            service.close()
            self._finish()
            return
        assert self.engine is not None
        bridge = PipeBridge(self.engine, server, serve, self)
        try:
            bridge.listen(endpoint(self.data_dir))
        except (ListenError, OSError) as exc:
            bridge.deleteLater()
            service.close()
            self._show_problem(exc)
            return
        self.service, self.bridge = service, bridge
        self._busy_deadline = None
        bridge.hostsChanged.connect(self._on_hosts)
        bridge.raiseRequested.connect(self.show_window)
        bridge.quitRequested.connect(self.quit)
        bridge.set_status_provider(self._control_status)
        self._unsubscribe = service.subscribe(lambda _event: self._storeChanged.emit())
        if self.error_window is not None:
            self.error_window.hide()
        self.tray.set_engine_ready(True)
        self.tray.set_hosts(0)
        self.tray.set_health("OK")
        self._set_state("running")
        self.refresh_health()
        self._health_timer.start()
        if not self.has_tray or not self.minimized:
            self.show_window()

    def _control_status(self) -> dict[str, object]:
        visible = self.window is not None and self.window.isVisible()
        return {"state": self.state, "pid": os.getpid(), "window_visible": visible}

    def _on_open_failed(self, exc: BaseException) -> None:
        if self._quitting:
            self._finish()
            return
        if isinstance(exc, BusyError):
            now = time.monotonic()
            if self._busy_deadline is None:
                self._busy_deadline = now + self.busy_wait
            # Maybe another app is starting up and will answer shortly: hand over to it.
            command = handover_command(self.minimized)
            with contextlib.suppress(OSError):
                if send_control(endpoint(self.data_dir), command, 500) is not None:
                    self._set_state("handed-over")
                    self._finish()
                    return
            if now < self._busy_deadline:
                self._set_state("waiting")
                QTimer.singleShot(250, self._retry_open)
                return
        self._show_problem(exc)

    def _retry_open(self) -> None:
        if self._quitting:
            self._finish()
            return
        self._set_state("starting")
        self._workers.submit(self._open_worker).add_done_callback(_log_worker_failure)

    def _show_problem(self, exc: BaseException) -> None:
        self._busy_deadline = None
        problem = describe(exc, self.data_dir)
        self.last_problem_code = problem.code
        log.error("startup failed: %s", problem.code)
        if self.error_window is None:
            self.error_window = StartupErrorWindow(self.data_dir)
            self.error_window.setWindowIcon(app_icon())
            self.error_window.retryRequested.connect(self.start)
            self.error_window.quitRequested.connect(self.quit)
        self.error_window.show_problem(problem)
        self.error_window.show()
        self.error_window.raise_()
        self.tray.set_text(f"Cannot start: {problem.code}")
        self.tray.set_engine_ready(False)
        self._notify(problem.title, f"{problem.detail} {problem.next_steps}", critical=True)
        self._set_state("error")

    def _notify(self, title: str, text: str, critical: bool = False) -> None:
        self.tray.notify(title, text, critical)
        self.messageShown.emit(title, text)

    # ---- running ----

    @property
    def host_count(self) -> int:
        return self.bridge.host_count if self.bridge is not None else 0

    def _on_hosts(self, count: int) -> None:
        self.tray.set_hosts(count)
        self.hostsChanged.emit(count)

    def show_window(self) -> None:
        if self.state == "error" and self.error_window is not None:
            self.error_window.show()
            self.error_window.raise_()
            self.error_window.activateWindow()
            return
        if self.service is None or self._quitting:
            return
        if self.window is None:
            from convmem_app.browser import MemoryBrowser  # Qt models and views: load on demand

            self.window = MemoryBrowser(self.service, settings=self.settings)
            self.window.setWindowIcon(app_icon())
            if not self.has_tray:
                self.window.menuBar().addMenu(self.tray.menu)
                self.window.installEventFilter(_CloseWatcher(self.quit, self.window))
        if self.window.isMinimized():
            self.window.showNormal()
        self.window.show()
        self.window.raise_()
        self.window.activateWindow()

    def copy_host_configuration(self) -> str:
        text = host_configuration(self.data_dir)
        QGuiApplication.clipboard().setText(text)
        self._notify("Host configuration copied", claude_desktop.paste_hint())
        return text

    def refresh_health(self) -> None:
        if self.service is None or self._health_pending or self._quitting:
            return
        self._health_pending = True
        self._call_in_worker(self.service.get_system_health, self._healthReady)

    def _call_in_worker(self, call: Callable[[], object], done: SignalInstance) -> None:
        """Run `call` on a worker thread; `done` carries its result, or the exception it raised,
        back to the GUI thread."""

        def work() -> None:
            try:
                result: object = call()
            except Exception as exc:
                result = exc
            done.emit(result)

        self._workers.submit(work).add_done_callback(_log_worker_failure)

    def _on_health(self, result: object) -> None:
        self._health_pending = False
        if self._quitting or self.service is None:
            return
        if isinstance(result, BaseException):  # shown as DEGRADED; say why where it can be read
            log.error("health check failed: %s", describe(result, self.data_dir).code)
        status = str(result.get("status", "OK")) if isinstance(result, dict) else "DEGRADED"
        self.tray.set_health(status)
        self.healthChanged.emit(status)

    def rebuild_index(self) -> None:
        if self.service is None or self._rebuilding or self._quitting:
            return
        self._rebuilding = True
        self.tray.rebuild_action.setEnabled(False)
        self._call_in_worker(self.service.rebuild_index, self._rebuildDone)

    def _on_rebuild_done(self, result: object) -> None:
        self._rebuilding = False
        if not self._quitting:
            self.tray.rebuild_action.setEnabled(True)
            if isinstance(result, dict):
                self._notify(
                    "Index rebuilt",
                    f"{result.get('messages_indexed', 0)} messages indexed, "
                    f"{result.get('records_removed', 0)} records removed.",
                )
            else:
                problem = (
                    describe(result, self.data_dir) if isinstance(result, BaseException) else None
                )
                detail = problem.detail if problem else "unknown failure"
                self._notify("Rebuild failed", detail, critical=True)
            self.refresh_health()
        self.rebuildFinished.emit(result)

    @property
    def start_at_login(self) -> bool:
        return bool(self.settings.value("startAtLogin", False, type=bool))

    def set_start_at_login(self, enabled: bool) -> None:
        try:
            if enabled:
                autostart.enable(self.data_dir)
            else:
                autostart.disable()
        except OSError as exc:
            self._notify("Start at login", f"Could not change the setting: {exc.strerror}", True)
            self.tray.login_action.blockSignals(True)
            self.tray.login_action.setChecked(not enabled)
            self.tray.login_action.blockSignals(False)
            return
        self.settings.setValue("startAtLogin", enabled)
        self.settings.sync()

    # ---- quitting ----

    def quit(self) -> None:
        """Graceful quit; `finished` is emitted when everything is closed."""
        if self._quitting or self.state == "stopped":
            return
        self._quitting = True
        self.exit_code = EXIT_STARTUP_FAILED if self.state == "error" else EXIT_OK
        opening = self.state in ("starting", "waiting")
        self._set_state("quitting")
        self.tray.set_text("Quitting…")
        self.tray.set_engine_ready(False)
        self._health_timer.stop()
        self._change_timer.stop()
        if self.window is not None:
            self.window.hide()
        if self.error_window is not None:
            self.error_window.hide()
        if self.bridge is not None:
            self.bridge.drained.connect(self._finish)
            self.bridge.shutdown(self.quit_grace)
        elif not opening:
            self._finish()
        # else: the open in progress reports back and `_on_opened` / `_on_open_failed` finish.

    def _finish(self) -> None:
        if self.state == "stopped":
            return
        self._workers.shutdown(wait=True)  # a running rebuild or health check ends first
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self.window is not None:
            if not self.window.shutdown():  # background reads end before the service closes
                log.warning("the browser's background work outlasted the quit; closing anyway")
            self.window.close()
            self.window.deleteLater()
            self.window = None
        if self.service is not None:
            try:
                self.service.close()
            except Exception as exc:  # the lock is released by process exit anyway
                log.error("closing the store failed: %s", type(exc).__name__)
            self.service = None
        if self.engine is not None:
            self.engine.stop()
        self.tray.hide()
        self._set_state("stopped")
        self.finished.emit(self.exit_code)


# ---- process entry ----------------------------------------------------------------------------


def _install_signal_handlers(app: ConvMemApp) -> list[object]:
    """SIGTERM / SIGINT quit gracefully. Python runs signal handlers only when it gets control,
    so a wakeup fd with a QSocketNotifier hands the signal to the Qt loop at once."""
    import socket

    keep: list[object] = []

    def handler(_signum: int, _frame: object) -> None:
        QTimer.singleShot(0, app.quit)

    if sys.platform == "win32":
        timer = QTimer()
        timer.timeout.connect(lambda: None)
        timer.start(200)
        keep.append(timer)
    else:
        rsock, wsock = socket.socketpair()
        rsock.setblocking(False)
        wsock.setblocking(False)
        signal.set_wakeup_fd(wsock.fileno())
        notifier = QSocketNotifier(rsock.fileno(), QSocketNotifier.Type.Read)

        def drain() -> None:
            with contextlib.suppress(OSError):
                rsock.recv(64)

        notifier.activated.connect(drain)
        keep += [rsock, wsock, notifier]
        signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return keep


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="convmem app", description="The ConvMem tray app.")
    parser.add_argument("--data-dir", help="data directory (default: CONVMEM_DATA_DIR or ...)")
    parser.add_argument("--minimized", action="store_true", help="start in the tray only")
    parser.add_argument("--log-level", default="WARNING", help="logging level (stderr)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level.upper(), format="convmem app: %(message)s")
    data_dir = resolve_data_dir(args.data_dir)
    QApplication.setApplicationName("ConvMem")
    QApplication.setOrganizationName("ConvMem")
    existing = QApplication.instance()
    qapp = existing if isinstance(existing, QApplication) else QApplication([sys.argv[0]])
    qapp.setWindowIcon(app_icon())
    qapp.setQuitOnLastWindowClosed(False)  # the app lives in the tray; quitting is explicit
    try:
        name: str | None = endpoint(data_dir)
    except OSError:
        name = None
    if sys.platform == "win32":
        # We were just started by the user, so we may pass the foreground on: lets the running
        # app bring its window to the front instead of only flashing its taskbar button.
        import ctypes

        with contextlib.suppress(Exception):
            ctypes.windll.user32.AllowSetForegroundWindow(-1)  # type: ignore[attr-defined,unused-ignore]
    if name is not None and send_control(name, handover_command(args.minimized)) is not None:
        print("convmem app: already running for this data dir", file=sys.stderr)
        return EXIT_OK
    app = ConvMemApp(data_dir, minimized=args.minimized)
    app.finished.connect(qapp.exit)
    keep = _install_signal_handlers(app)
    app.start()
    status = qapp.exec()
    del keep
    return int(status)


__all__ = ["ConvMemApp", "host_configuration", "main", "send_control", "shim_command"]
