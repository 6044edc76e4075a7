"""`convmem app`: the tray app that owns a data dir and serves its hosts over the local pipe.

The app runs the engine's `Runtime` (convmem_engine.runtime), the same object as `convmem
serve`: lock, store, service, engine loop, MCP server; its listener is the local pipe
(`PipeBridge`). The app's own states are `AppState` (a machine documented in docs/app.md).

Startup: a second app for the same data dir first asks the running one (a control message on
the pipe) to raise its window, then exits 0. Otherwise the runtime opens off the GUI thread
(which takes the data-dir lock and builds the MCP server), and only then the pipe listens: a
stale socket left by a crash is removed while we hold the lock, never a live app's.

A BUSY lock is first taken for "an app is starting up": for `busy_wait` seconds the app keeps
trying to hand over and to open; then the BUSY error shows. Every startup problem appears as a
tray notification and in a window with what to do next (`startup_error`).

Quit (tray, control message, SIGTERM/SIGINT, closing the window when there is no tray) is
graceful: the browser's background reads end, then the runtime stops: the pipe stops
accepting, requests already received finish and are answered, the sessions end, the service
closes (releasing the lock).

Restore in place (the browser's Backup dialog): the runtime stops as for a quit (the window
closes, hosts see the pipe go away), the engine's `restore_backup(in_place=True)` runs on a
worker thread (the current store is renamed aside, never overwritten), then the runtime opens
again (on the backup, or on the old store when the restore failed) and the result is shown.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import enum
import json
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
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
from PySide6.QtWidgets import QApplication, QWidget

from convmem_app.gui_gc import collect_on_gui_thread
from convmem_app.hosts.configure import shim_command
from convmem_app.inbox import Inbox
from convmem_app.shell import autostart, claude_desktop
from convmem_app.shell.http_control import HttpControl
from convmem_app.shell.http_settings import HttpStatus
from convmem_app.shell.pipe_bridge import PipeBridge, control_line
from convmem_app.shell.startup_error import StartupErrorWindow, describe
from convmem_app.shell.tray import Tray, app_icon
from convmem_app.shim.paths import endpoint, resolve_data_dir
from convmem_engine.domain.errors import BusyError
from convmem_engine.mcp.http_config import claude_code_command
from convmem_engine.mcp.http_token import TokenError
from convmem_engine.runtime import ListenerError, Runtime, RuntimeHealth, RuntimeState
from convmem_engine.runtime.serve_cli import agent_runtime

if TYPE_CHECKING:
    from convmem_app.backup_schedule import BackupScheduler
    from convmem_app.browser import MemoryBrowser
    from convmem_app.browser.portability import Portability
    from convmem_engine.runtime.activity import ActivityLog
    from convmem_engine.service import MemoryService

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


class AppState(enum.StrEnum):
    """The app's life cycle (docs/app.md, "The app's states"). Values are what `stateChanged`
    carries and what the `status` control message reports."""

    NEW = "new"  # constructed; start() not called yet
    STARTING = "starting"  # the runtime opens on a worker thread (lock, store, server)
    WAITING = "waiting"  # the lock is BUSY: retrying to open / to hand over, until busy_wait
    RUNNING = "running"  # the runtime runs and the pipe listens: hosts are served
    ERROR = "error"  # startup failed: the error window says why; Retry -> STARTING
    HANDED_OVER = "handed-over"  # another app for this data dir answered: we step aside
    RESTORING = "restoring"  # restore in place: runtime stopped, backup put in place, reopen
    QUITTING = "quitting"  # quit(): the browser's work ends, then the runtime stops
    STOPPED = "stopped"  # everything closed, `finished` emitted; final


@dataclass(frozen=True)
class RestoreOutcome:
    """What a restore in place did: `aside` is where the previous store now is (None when the
    restore failed and the previous store stayed in place); `error` says why it failed."""

    backup: str
    aside: str | None
    messages: int | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None

    def text(self) -> str:
        if self.error is not None:
            return f"The restore failed and the current store was opened again: {self.error}"
        count = f"{self.messages:,} messages" if self.messages is not None else "the backup"
        return f"Restored {count} from {self.backup}. The previous store is kept at {self.aside}."


class ConvMemApp(QObject):
    """Owns the tray, the windows and the engine's `Runtime` (with its pipe listener)."""

    finished = Signal(int)  # exit status, once the app has fully stopped
    stateChanged = Signal(str)  # an AppState value
    hostsChanged = Signal(int)
    healthChanged = Signal(str)
    rebuildFinished = Signal(object)  # rebuild_index's result dict, or the exception it raised
    messageShown = Signal(str, str)
    restoreFinished = Signal(object)  # RestoreOutcome, once the runtime runs again (or failed)

    # Emitted on worker, engine and writer threads: queued, so the slots run on the GUI thread.
    _opened = Signal(Runtime)
    _openFailed = Signal(Runtime, BaseException)
    _runtimeStopped = Signal()
    _healthReady = Signal(RuntimeHealth)
    _rebuildDone = Signal(object)
    _clientsChanged = Signal()
    _restoreDone = Signal(object)

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
        self.state = AppState.NEW
        self.exit_code = EXIT_OK
        self.runtime: Runtime | None = None
        self.bridge: PipeBridge | None = None
        self.window: MemoryBrowser | None = None
        # issue 16: the browser's import/export/backup/hosts additions, the automatic backups
        # and the activity feed (who changed what), made when the runtime runs
        self.portability: Portability | None = None
        self.agent_panel: QWidget | None = None  # the Agent tab, when the agent part runs
        self.backups: BackupScheduler | None = None
        self.activity: ActivityLog | None = None
        self.error_window: StartupErrorWindow | None = None
        self.last_problem_code = ""
        self._unsubscribe: list[Callable[[], None]] = []
        self._busy_deadline: float | None = None
        self._quitting = False
        self._rebuilding = False
        self._health_pending = False
        self._restore_outcome: RestoreOutcome | None = None
        self._workers = concurrent.futures.ThreadPoolExecutor(2, "convmem-gui-work")

        self.tray = Tray(self)
        self.has_tray = Tray.available()
        self.tray.openBrowserRequested.connect(self.show_window)
        self.tray.copyConfigRequested.connect(self.copy_host_configuration)
        self.http = HttpControl(self.settings, data_dir, self)
        self.http.statusChanged.connect(self._on_http_status)
        self.http.problem.connect(lambda text: self._notify("HTTP endpoint not started", text))
        self.tray.copyHttpConfigRequested.connect(self.copy_http_host_configuration)
        self.tray.httpSettingsRequested.connect(self.show_http_settings)
        self.tray.rebuildRequested.connect(self.rebuild_index)
        self.tray.quitRequested.connect(self.quit)
        self.tray.login_action.setChecked(self.start_at_login)
        self.tray.startAtLoginToggled.connect(self.set_start_at_login)

        queued = Qt.ConnectionType.QueuedConnection
        self._opened.connect(self._on_opened, queued)
        self._openFailed.connect(self._on_open_failed, queued)
        self._runtimeStopped.connect(self._finish, queued)
        self._healthReady.connect(self._on_health, queued)
        self._rebuildDone.connect(self._on_rebuild_done, queued)
        self._clientsChanged.connect(self._on_clients, queued)
        self._restoreDone.connect(self._on_restore_done, queued)
        self._health_timer = QTimer(self)
        self._health_timer.setInterval(HEALTH_INTERVAL_MS)
        self._health_timer.timeout.connect(self.refresh_health)
        self._change_timer = QTimer(self)
        self._change_timer.setSingleShot(True)
        self._change_timer.setInterval(500)
        self._change_timer.timeout.connect(self.refresh_health)
        # writer threads' change events reach the GUI thread in batches (one wake-up per
        # interval while writes keep coming, not one per write)
        self._store_changes: Inbox[object] = Inbox(self._on_store_changed, self)

    # ---- startup ----

    def _set_state(self, state: AppState) -> None:
        self.state = state
        self.stateChanged.emit(state.value)

    def _on_store_changed(self, _events: list[object]) -> None:
        self._change_timer.start()  # health is refreshed once writes pause for 500 ms

    @property
    def service(self) -> MemoryService | None:
        """The running runtime's service (None unless RUNNING)."""
        runtime = self.runtime
        if runtime is None or runtime.state is not RuntimeState.RUNNING:
            return None
        return runtime.service

    def start(self) -> None:
        """Open the runtime (off the GUI thread), then listen. Also what Retry does."""
        if self._quitting or self.state in (AppState.STARTING, AppState.RUNNING):
            return
        self._set_state(AppState.STARTING)
        self.tray.set_text("Starting…")
        if self.has_tray:
            self.tray.show()
        if self.runtime is None or self.runtime.state is RuntimeState.STOPPED:
            self.runtime = self._new_runtime()
        self._submit_open(self.runtime)

    def _new_runtime(self) -> Runtime:
        """The app's runtime: the store, its parts (the memory agent's queue, `agent.yaml`) and
        a server that carries the agent tools when the agent is enabled (docs/agent.md)."""
        runtime, _agent = agent_runtime(self.data_dir)
        return runtime

    def _submit_open(self, runtime: Runtime) -> None:
        self._workers.submit(self._open_worker, runtime).add_done_callback(_log_worker_failure)

    def _open_worker(self, runtime: Runtime) -> None:
        try:
            runtime.open()
        except Exception as exc:
            self._openFailed.emit(runtime, exc)
            return
        self._opened.emit(runtime)

    def _on_opened(self, runtime: Runtime) -> None:
        if self._quitting:
            self._stop_runtime()
            return
        bridge: PipeBridge | None = None
        try:
            bridge = PipeBridge(endpoint(self.data_dir), self)  # endpoint: SocketDirError
            runtime.add_listener(bridge)
        except (ListenerError, OSError) as exc:
            if bridge is not None:
                bridge.deleteLater()
            runtime.stop()  # no listener yet: closes the store and releases the lock at once
            self._show_problem(exc)
            return
        self.bridge = bridge
        self._busy_deadline = None
        bridge.raiseRequested.connect(self.show_window)
        bridge.quitRequested.connect(self.quit)
        bridge.set_status_provider(self._control_status)
        self._unsubscribe = [
            runtime.service.subscribe(self._store_changes.put),
            runtime.clients.subscribe(self._clientsChanged.emit),
        ]
        self._start_portability(runtime)
        if self.error_window is not None:
            self.error_window.hide()
        self.tray.set_engine_ready(True)
        self.tray.set_hosts(0)
        self.tray.set_health("OK")
        self._set_state(AppState.RUNNING)
        self.http.attach(runtime)  # the HTTP endpoint, when Settings → HTTP has it on
        self.refresh_health()
        self._health_timer.start()
        outcome, self._restore_outcome = self._restore_outcome, None
        if not self.has_tray or not self.minimized or outcome is not None:
            self.show_window()
        if outcome is not None:
            self._report_restore(outcome)

    def _control_status(self) -> dict[str, object]:
        visible = self.window is not None and self.window.isVisible()
        return {"state": self.state.value, "pid": os.getpid(), "window_visible": visible}

    def _on_open_failed(self, runtime: Runtime, exc: BaseException) -> None:
        if self._quitting:
            self._stop_runtime()
            return
        if isinstance(exc, BusyError):
            now = time.monotonic()
            if self._busy_deadline is None:
                self._busy_deadline = now + self.busy_wait
            # Maybe another app is starting up and will answer shortly: hand over to it.
            command = handover_command(self.minimized)
            with contextlib.suppress(OSError):
                if send_control(endpoint(self.data_dir), command, 500) is not None:
                    self._set_state(AppState.HANDED_OVER)
                    self._stop_runtime()
                    return
            if now < self._busy_deadline:
                self._set_state(AppState.WAITING)
                QTimer.singleShot(250, self._retry_open)
                return
        self._show_problem(exc)

    def _retry_open(self) -> None:
        if self._quitting:
            self._stop_runtime()
            return
        assert self.runtime is not None
        self._set_state(AppState.STARTING)
        self._submit_open(self.runtime)

    def _show_problem(self, exc: BaseException) -> None:
        self._busy_deadline = None
        outcome, self._restore_outcome = self._restore_outcome, None
        if outcome is not None:  # reopening after a restore in place failed: say both
            self._report_restore(outcome)
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
        self._set_state(AppState.ERROR)

    def _notify(self, title: str, text: str, critical: bool = False) -> None:
        self.tray.notify(title, text, critical)
        self.messageShown.emit(title, text)

    # ---- running ----

    @property
    def host_count(self) -> int:
        """Connected hosts, over every transport of the runtime."""
        runtime = self.runtime
        return runtime.clients.count() if runtime is not None else 0

    def _start_portability(self, runtime: Runtime) -> None:
        """The activity feed and the automatic backups (they only read the store)."""
        from convmem_app.backup_schedule import BackupScheduler
        from convmem_engine.runtime.activity import ActivityLog

        self.activity = ActivityLog(runtime.service, runtime.clients)
        self._unsubscribe.append(self.activity.close)
        if self.backups is None:
            self.backups = BackupScheduler(str(self.data_dir), self.settings, self)
        self.backups.start()

    def _on_clients(self) -> None:
        if self._quitting:
            return
        count = self.host_count
        from convmem_app.browser.hosts_page import client_names

        runtime = self.runtime
        names = client_names(runtime.clients.clients()) if runtime is not None else []
        self.tray.set_hosts(count, names)
        self.hostsChanged.emit(count)

    def _add_agent_tab(self, window: Any, service: Any, runtime: Runtime | None) -> None:
        """The Agent tab (docs/agent.md), on the runtime's agent queue."""
        from convmem_engine.agent.part import AgentPart

        part = runtime.part(AgentPart.name) if runtime is not None else None
        if not isinstance(part, AgentPart) or part.agent is None:
            return
        from convmem_app.browser.agent_panel import AgentPanel

        panel = AgentPanel(part.agent, self.data_dir, service=service)
        panel.openRequested.connect(window.open_message)
        window.tabs.addTab(panel, "A&gent")
        self.agent_panel = panel

    def show_window(self) -> None:
        if self.state is AppState.ERROR and self.error_window is not None:
            self.error_window.show()
            self.error_window.raise_()
            self.error_window.activateWindow()
            return
        service = self.service
        if service is None or self._quitting:
            return
        if self.window is None:
            from convmem_app.browser import MemoryBrowser  # Qt models and views: load on demand
            from convmem_app.browser.portability import Portability

            runtime = self.runtime
            self.window = MemoryBrowser(service, settings=self.settings, runtime=runtime)
            self.window.setWindowIcon(app_icon())
            self.portability = Portability(
                self.window,
                data_dir=self.data_dir,
                scheduler=self.backups,
                clients=runtime.clients.clients if runtime is not None else None,
                activity=self.activity,
                restore_in_place=self.restore_in_place,
            )
            self._add_agent_tab(self.window, service, runtime)
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

    def copy_http_host_configuration(self) -> str:
        """The Claude Code command for the HTTP endpoint (while it serves), with the token."""
        status = self.http.status
        if not status.serving:
            return ""
        text = claude_code_command(status.url, self.http.token().value())
        QGuiApplication.clipboard().setText(text)
        self._notify(
            "HTTP host configuration copied", "It holds the token: paste it only into your host."
        )
        return text

    def show_http_settings(self) -> None:
        with contextlib.suppress(TokenError):  # a bad CONVMEM_HTTP_TOKEN: notified already
            self.http.show_dialog()

    def _on_http_status(self, status: HttpStatus) -> None:
        self.tray.set_http_url(status.url if status.serving else "")

    def refresh_health(self) -> None:
        runtime = self.runtime
        if runtime is None or self.service is None or self._health_pending or self._quitting:
            return
        self._health_pending = True

        def work() -> None:
            self._healthReady.emit(runtime.health())

        self._workers.submit(work).add_done_callback(_log_worker_failure)

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

    def _on_health(self, health: RuntimeHealth) -> None:
        self._health_pending = False
        if self._quitting or self.service is None:
            return
        if health.error:  # shown as DEGRADED; say why where it can be read
            log.error("health check failed: %s", health.error)
        status = health.status or "DEGRADED"
        self.tray.set_health(status)
        self.healthChanged.emit(status)

    def rebuild_index(self) -> None:
        service = self.service
        if service is None or self._rebuilding or self._quitting:
            return
        self._rebuilding = True
        self.tray.rebuild_action.setEnabled(False)
        self._call_in_worker(service.rebuild_index, self._rebuildDone)

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
        if self._quitting or self.state is AppState.STOPPED:
            return
        self._quitting = True
        self.exit_code = EXIT_STARTUP_FAILED if self.state is AppState.ERROR else EXIT_OK
        opening = self.state in (AppState.STARTING, AppState.WAITING)
        restoring = self.state is AppState.RESTORING
        self._set_state(AppState.QUITTING)
        self.tray.set_text("Quitting…")
        self.tray.set_engine_ready(False)
        self._release_service()
        if self.error_window is not None:
            self.error_window.hide()
        if restoring:
            return  # the restore's worker reports back, then `_on_restore_done` finishes
        if not opening:
            self._stop_runtime()
        # else: the open in progress reports back and `_on_opened` / `_on_open_failed` stop.

    def _release_service(self) -> None:
        """Everything that uses the runtime's service lets go of it (before it closes)."""
        self._health_timer.stop()
        self._change_timer.stop()
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe = []
        if self.backups is not None:
            self.backups.stop()  # a running backup ends first (it only reads the store)
        if self.portability is not None:
            self.portability.stop()
        if self.window is not None:
            self.window.hide()
            if not self.window.shutdown():  # background reads end before the service closes
                log.warning("the browser's background work outlasted the stop; closing anyway")

    # ---- restore in place ----

    def restore_in_place(self, backup: str) -> bool:
        """Stop the runtime, put `backup` in place of the data dir (the current store renamed
        aside, never overwritten), open the runtime again and report (`restoreFinished`, a
        notification, the browser's status line). On any failure the current store is opened
        again. False (nothing done) unless the app is running."""
        runtime = self.runtime
        if self.state is not AppState.RUNNING or self._quitting or runtime is None:
            return False
        if self._rebuilding:  # the rebuild's result would arrive from a closed store
            self._notify("Restore not started", "A Rebuild index is running: try again after it.")
            return False
        self._set_state(AppState.RESTORING)
        self.tray.set_text("Restoring…")
        self.tray.set_engine_ready(False)
        self._release_service()
        window, self.window, self.portability = self.window, None, None
        if window is not None:  # it shows the old service: a new one opens with the new store
            for watcher in window.findChildren(_CloseWatcher):
                window.removeEventFilter(watcher)
            window.close()
            window.deleteLater()
        data_dir = self.data_dir

        def restore() -> None:  # a worker thread, once the runtime has stopped
            from convmem_engine.transfer.backup import restore_backup

            try:
                info, aside = restore_backup(backup, data_dir, in_place=True)
            except Exception as exc:
                error = getattr(exc, "message", None) or str(exc) or type(exc).__name__
                self._restoreDone.emit(RestoreOutcome(backup, None, None, error))
            else:
                self._restoreDone.emit(RestoreOutcome(backup, aside, info.messages, None))

        def stop(_pending: object = None) -> None:
            future = runtime.stop_async(self.quit_grace)
            future.add_done_callback(
                lambda _f: self._workers.submit(restore).add_done_callback(_log_worker_failure)
            )

        pending = self.http.detach()  # an HTTP (re)start in progress ends first
        if pending is not None and not pending.done():
            pending.add_done_callback(stop)
        else:
            stop()
        return True

    def _on_restore_done(self, outcome: RestoreOutcome) -> None:
        if outcome.ok:
            log.info("restored in place; the previous store is kept aside")
        else:
            log.error("restore in place failed; reopening the current store")
        if self._quitting:
            self._report_restore(outcome)
            self._finish()
            return
        if self.bridge is not None:
            self.bridge.deleteLater()
            self.bridge = None
        self._restore_outcome = outcome
        self._set_state(AppState.STARTING)
        self.tray.set_text("Starting…")
        self.runtime = self._new_runtime()
        self._submit_open(self.runtime)

    def _report_restore(self, outcome: RestoreOutcome) -> None:
        title = "Backup restored" if outcome.ok else "Restore failed"
        self._notify(title, outcome.text(), critical=not outcome.ok)
        if self.window is not None:
            self.window.status_text.setText(outcome.text())
        self.restoreFinished.emit(outcome)

    def _stop_runtime(self) -> None:
        """Stop the runtime without blocking the GUI loop (the pipe drains on it); `_finish`
        runs when it is stopped."""
        runtime = self.runtime
        if runtime is None or runtime.state is RuntimeState.STOPPED:
            self._finish()
            return

        def stop(_pending: object = None) -> None:
            future = runtime.stop_async(self.quit_grace)
            future.add_done_callback(lambda _future: self._runtimeStopped.emit())

        pending = self.http.detach()  # an HTTP (re)start in progress ends first
        if pending is not None and not pending.done():
            pending.add_done_callback(stop)
        else:
            stop()

    def _finish(self) -> None:
        if self.state is AppState.STOPPED:
            return
        self._workers.shutdown(wait=True)  # a running rebuild or health check ends first
        self.http.shutdown()
        if self.http.dialog is not None:
            self.http.dialog.close()
        if self.window is not None:
            self.window.close()
            self.window.deleteLater()
            self.window = None
            self.portability = None
        self.tray.hide()
        self._set_state(AppState.STOPPED)
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
    collect_on_gui_thread(qapp)  # before any thread starts: no Qt object freed off its thread
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


__all__ = ["AppState", "ConvMemApp", "host_configuration", "main", "send_control", "shim_command"]
