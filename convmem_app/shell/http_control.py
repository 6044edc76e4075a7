"""The app's HTTP endpoint: starts, restarts and stops the runtime's HTTP listener as the
settings say, and tells the tray, the dialog and the user what happened.

Binding happens on a worker thread (the GUI never waits on a socket); results come back through
a queued signal. A busy port or a refused bind is a status and a notification, never a failure
of the app: the runtime and its pipe listener go on as before.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QSettings, Qt, Signal

from convmem_app.shell.http_settings import (
    HttpChoice,
    HttpSettingsDialog,
    HttpStatus,
    load_choice,
    save_choice,
)
from convmem_engine.mcp.http_config import HttpConfig
from convmem_engine.mcp.http_token import HttpToken, TokenError
from convmem_engine.runtime import ListenerError

if TYPE_CHECKING:
    from convmem_engine.runtime import Runtime
    from convmem_engine.runtime.http_listener import HttpRuntimeListener

log = logging.getLogger(__name__)

STOP_GRACE = 5.0


class HttpControl(QObject):
    """One per app. `attach(runtime)` once the runtime runs, `detach()` before it stops."""

    statusChanged = Signal(object)  # HttpStatus
    problem = Signal(str)  # a message for a notification (the port is busy, ...)

    _done = Signal(object, object)  # listener or None, problem text or None

    def __init__(self, settings: QSettings, data_dir: Path, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self.data_dir = data_dir
        self.choice = load_choice(settings)
        self.status = HttpStatus(serving=False)
        self.runtime: Runtime | None = None
        self.listener: HttpRuntimeListener | None = None
        self.dialog: HttpSettingsDialog | None = None
        self._token: HttpToken | None = None
        self._worker = concurrent.futures.ThreadPoolExecutor(1, "convmem-http")
        self._pending: concurrent.futures.Future[None] | None = None
        self._done.connect(self._on_done, Qt.ConnectionType.QueuedConnection)

    # ---- the token ----

    def token(self) -> HttpToken:
        if self._token is None:
            self._token = HttpToken(self.data_dir)
        return self._token

    # ---- life cycle (GUI thread) ----

    def attach(self, runtime: Runtime) -> None:
        """The runtime runs: serve HTTP if the settings say so."""
        self.runtime = runtime
        if self.choice.enabled:
            self._schedule(self.choice)

    def detach(self) -> concurrent.futures.Future[None] | None:
        """The runtime is about to stop (it stops the listener itself): forget both."""
        self.runtime = None
        self.listener = None
        self._set_status(HttpStatus(serving=False))
        return self._pending

    def apply(self, enabled: bool, port: int) -> None:
        """The user's choice: save it, then stop / (re)start the listener to match."""
        self.choice = HttpChoice(enabled, port)
        save_choice(self.settings, self.choice)
        if self.runtime is not None:
            self._schedule(self.choice)
        elif not enabled:
            self._set_status(HttpStatus(serving=False))

    def shutdown(self) -> None:
        self._worker.shutdown(wait=True)

    def show_dialog(self) -> HttpSettingsDialog:
        if self.dialog is None:
            try:
                token = self.token()
            except TokenError as error:  # a bad CONVMEM_HTTP_TOKEN
                self.problem.emit(str(error))
                raise
            self.dialog = HttpSettingsDialog(token, self.choice)
            self.dialog.applyRequested.connect(self.apply)
            self.statusChanged.connect(self.dialog.set_status)
            self.dialog.set_status(self.status)
        self.dialog.show()
        self.dialog.raise_()
        self.dialog.activateWindow()
        return self.dialog

    # ---- the work (a worker thread) ----

    def _schedule(self, choice: HttpChoice) -> None:
        runtime, old = self.runtime, self.listener
        self.listener = None
        assert runtime is not None
        self._pending = self._worker.submit(self._restart, runtime, old, choice)

    def _restart(
        self, runtime: Runtime, old: HttpRuntimeListener | None, choice: HttpChoice
    ) -> None:
        if old is not None:
            # If the runtime is stopping meanwhile, it stops the listener itself.
            with contextlib.suppress(RuntimeError, concurrent.futures.CancelledError):
                runtime.loop.submit(old.stop(STOP_GRACE)).result()
            runtime.remove_listener(old)
        if not choice.enabled:
            self._done.emit(None, None)
            return
        from convmem_engine.runtime.http_listener import HttpRuntimeListener

        try:
            listener = HttpRuntimeListener(self.token(), HttpConfig(port=choice.port))
            runtime.add_listener(listener)
        except (ListenerError, TokenError, ValueError) as error:
            self._done.emit(None, str(error))
            return
        except Exception as error:  # the runtime stopped meanwhile: say so, do not crash
            self._done.emit(None, f"HTTP could not start ({type(error).__name__})")
            return
        self._done.emit(listener, None)

    # ---- results (GUI thread) ----

    def _on_done(self, listener: HttpRuntimeListener | None, problem: str | None) -> None:
        if self.runtime is None:  # detached meanwhile: the runtime stops what we started
            return
        self.listener = listener
        if listener is not None:
            self._set_status(HttpStatus(serving=True, url=listener.url))
        elif problem is not None:
            log.warning("HTTP endpoint not started: %s", problem)
            self._set_status(HttpStatus(serving=False, problem=problem))
            self.problem.emit(problem)
        else:
            self._set_status(HttpStatus(serving=False))

    def _set_status(self, status: HttpStatus) -> None:
        self.status = status
        self.statusChanged.emit(status)
