"""Connect LLM hosts with one click: the host list of the welcome page and of the Hosts tab.

One row a known host (Claude Desktop, Claude Code, Cursor, Codex, VS Code, Windsurf): found on
this computer or not, its config file, ConvMem's state there (configured, not configured, a
stale path, a file that does not parse) and a button: **Add to host**, **Update** (stale) or
**Remove**. The edits are convmem_app.hosts' (parsed, backed up, atomic, refused when the file
does not parse) and run on a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QGridLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from convmem_app.browser.jobs import JobRunner
from convmem_app.hosts import (
    HOSTS,
    EditResult,
    Env,
    HostConfigError,
    HostStatus,
    add,
    remove,
    shim_command,
    statuses,
)

STATE_TEXT = {
    "configured": "✓ Configured",
    "not-configured": "Not configured",
    "stale": "⚠ Configured with a stale path",
    "unreadable": "⚠ Config file does not parse",
}


class HostSetup(QWidget):
    """The host rows; `refresh()` re-reads every host's file."""

    changed = Signal(str, str)  # host key, message shown
    failed = Signal(str, str)  # host key, error message
    refreshed = Signal()

    def __init__(
        self,
        data_dir: Path,
        runner: JobRunner,
        parent: QWidget | None = None,
        *,
        env_factory: Callable[[], Env] = Env.current,
    ) -> None:
        super().__init__(parent)
        self._data_dir = data_dir
        self._runner = runner
        self._env_factory = env_factory
        self.command = shim_command(data_dir)
        self.statuses: dict[str, HostStatus] = {}
        self.buttons: dict[str, QPushButton] = {}
        self.remove_buttons: dict[str, QPushButton] = {}
        self.state_labels: dict[str, QLabel] = {}
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        grid = QGridLayout()
        grid.setColumnStretch(1, 1)
        for row, host in enumerate(HOSTS):
            name = QLabel(f"<b>{host.title}</b>")
            state = QLabel("…")
            state.setObjectName(f"state-{host.key}")
            state.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
            button = QPushButton("Add to host")
            button.setObjectName(f"add-{host.key}")
            button.clicked.connect(lambda _c=False, k=host.key: self.add(k))
            rm = QPushButton("Remove")
            rm.setObjectName(f"remove-{host.key}")
            rm.clicked.connect(lambda _c=False, k=host.key: self.remove(k))
            grid.addWidget(name, row, 0)
            grid.addWidget(state, row, 1)
            grid.addWidget(button, row, 2)
            grid.addWidget(rm, row, 3)
            self.buttons[host.key] = button
            self.remove_buttons[host.key] = rm
            self.state_labels[host.key] = state
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(grid)
        layout.addWidget(self.message)
        self.changed.connect(lambda _k, text: self.message.setText(text))
        self.failed.connect(lambda _k, text: self.message.setText(text))

    # -- reading ------------------------------------------------------------------------------

    def refresh(self) -> None:
        command, env_factory = self.command, self._env_factory
        self._runner.run(lambda _job: statuses(command, env_factory()), self._show)

    def _show(self, result: object) -> None:
        assert isinstance(result, list)
        for st in result:
            assert isinstance(st, HostStatus)
            self.statuses[st.key] = st
            label = self.state_labels[st.key]
            found = "" if st.installed else "Not found on this computer. "
            label.setText(found + STATE_TEXT[st.state])
            tip = str(st.path) + (f"\n{st.detail}" if st.detail else "")
            label.setToolTip(tip)
            button = self.buttons[st.key]
            button.setText("Update" if st.state == "stale" else "Add to host")
            button.setEnabled(
                st.state in ("not-configured", "stale") and (st.installed or st.path.is_file())
            )
            self.remove_buttons[st.key].setVisible(st.state in ("configured", "stale"))
        self.refreshed.emit()

    # -- editing ------------------------------------------------------------------------------

    def add(self, key: str) -> None:
        self._edit(key, lambda env: add(key, self.command, env), "added")

    def remove(self, key: str) -> None:
        self._edit(key, lambda env: remove(key, env), "removed")

    def _edit(self, key: str, edit: Callable[[Env], EditResult], verb: str) -> None:
        self.buttons[key].setEnabled(False)
        self.remove_buttons[key].setEnabled(False)
        env_factory = self._env_factory

        def done(result: object) -> None:
            assert isinstance(result, EditResult)
            self.remove_buttons[key].setEnabled(True)
            title = next(h.title for h in HOSTS if h.key == key)
            text = f"ConvMem {verb}: {result.path}."
            if result.backup is not None:
                text += f" The previous version is kept as {result.backup.name}."
            if verb == "added":
                text += f" Restart {title}, then ask it to remember something."
            self.changed.emit(key, text)
            self.refresh()

        def fail(error: BaseException) -> None:
            self.remove_buttons[key].setEnabled(True)
            text = str(error) if isinstance(error, HostConfigError) else type(error).__name__
            self.failed.emit(key, text)
            self.refresh()

        self._runner.run(lambda _job: edit(env_factory()), done, fail)


class WelcomePage(QWidget):
    """Shown instead of the empty browser: what ConvMem does, and the hosts to connect."""

    def __init__(self, host_setup: HostSetup, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("welcomePage")
        title = QLabel("<h2>Welcome to ConvMem</h2>")
        intro = QLabel(
            "ConvMem keeps what your AI assistants remember on this computer, durable and "
            "searchable, shared by every assistant you connect.<br>"
            "Connect a host below, restart it, and ask it to remember something: it appears "
            "here at once."
        )
        intro.setWordWrap(True)
        self.host_setup = host_setup
        box = QWidget()
        box.setMaximumWidth(900)
        inner = QVBoxLayout(box)
        inner.addWidget(title)
        inner.addWidget(intro)
        inner.addSpacing(12)
        inner.addWidget(QLabel("<b>Assistants found on this computer</b>"))
        inner.addWidget(host_setup)
        inner.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(box, 0, Qt.AlignmentFlag.AlignHCenter)
