"""The Agent panel: the memory agent's settings, a request box, the live queue, results and
the audit journal (issue 11).

Every call that can block (writing agent.yaml, queueing or cancelling a task, asking Ollama for
its models or version, reading the audit journal) runs on the panel's `JobRunner`, never on
the GUI thread. The queue's change notifications arrive on the agent's worker thread and are
re-emitted through a queued signal, so widgets are only touched on the GUI thread.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from convmem_app.browser.jobs import JobRunner
from convmem_engine.agent.config import AgentConfig, save_config
from convmem_engine.agent.ollama_side import OllamaProblem, OllamaSide
from convmem_engine.agent.texts import text
from convmem_engine.agent.validation import AgentInputError

if TYPE_CHECKING:
    from convmem_engine.agent.service import AgentService
    from convmem_engine.agent.store import AuditRecord, Task
    from convmem_engine.service import MemoryService

QUEUE_COLUMNS = ("Task", "State", "Progress", "Tokens", "Request")
AUDIT_COLUMNS = ("Time", "Task", "Tool", "Message", "Revision", "OK")
NO_TEMPERATURE = -0.1  # the spin box's special value: the model's own default


class AgentPanel(QWidget):
    """Settings, requests, queue, results and audit of one `AgentService`."""

    openMessage = Signal(str)  # a message id from the audit journal, to show in the browser
    openRequested = Signal(str, str)  # (message_id, session_id), when a service is given
    _taskChanged = Signal(object)  # from the agent's threads; delivered on the GUI thread

    def __init__(
        self,
        agent: AgentService,
        data_dir: str | os.PathLike[str],
        parent: QWidget | None = None,
        *,
        service: MemoryService | None = None,
    ) -> None:
        super().__init__(parent)
        self.agent = agent
        self.service = service
        self.data_dir = os.fspath(data_dir)
        self.jobs = JobRunner(self)
        self._rows: dict[str, int] = {}
        self._build()
        self._load_settings(agent.config)
        self._taskChanged.connect(self._on_task_changed, Qt.ConnectionType.QueuedConnection)
        self._unsubscribe = agent.subscribe(self._taskChanged.emit)
        unsubscribe = self._unsubscribe
        self.destroyed.connect(lambda *_args: unsubscribe())
        for task in agent.tasks():
            self._show_task(task)
        self.refresh_audit()

    # -- layout ----------------------------------------------------------------------------

    def _build(self) -> None:
        settings = QGroupBox("Settings")
        form = QFormLayout(settings)
        self.enabled_box = QCheckBox("Offer agent_run / agent_status to hosts")
        self.host_edit = QLineEdit()
        self.host_edit.setPlaceholderText("OLLAMA_HOST or http://127.0.0.1:11434")
        self.model_combo = QComboBox()
        self.model_combo.setEditable(True)
        self.refresh_models_button = QPushButton("Refresh models")
        self.test_button = QPushButton("Test connection")
        self.connection_label = QLabel("")
        self.connection_label.setWordWrap(True)
        self.temperature_spin = QDoubleSpinBox()
        self.temperature_spin.setRange(NO_TEMPERATURE, 2.0)
        self.temperature_spin.setSingleStep(0.1)
        self.temperature_spin.setDecimals(2)
        self.temperature_spin.setSpecialValueText("model default")
        self.steps_spin = QSpinBox()
        self.steps_spin.setRange(1, 10_000)
        self.tokens_spin = QSpinBox()
        self.tokens_spin.setRange(1, 1_000_000_000)
        self.tokens_spin.setSingleStep(1000)
        self.allow_delete_box = QCheckBox("Offer delete_message to the model")
        self.save_button = QPushButton("Save settings")
        self.settings_label = QLabel("")
        self.settings_label.setWordWrap(True)
        model_row = QHBoxLayout()
        model_row.addWidget(self.model_combo, 1)
        model_row.addWidget(self.refresh_models_button)
        test_row = QHBoxLayout()
        test_row.addWidget(self.test_button)
        test_row.addWidget(self.connection_label, 1)
        form.addRow(self.enabled_box)
        form.addRow("Ollama host", self.host_edit)
        form.addRow("Model", model_row)
        form.addRow(test_row)
        form.addRow("Temperature", self.temperature_spin)
        form.addRow("Step budget", self.steps_spin)
        form.addRow("Token budget", self.tokens_spin)
        form.addRow(self.allow_delete_box)
        form.addRow(self.save_button, self.settings_label)

        request = QGroupBox("Request")
        request_layout = QVBoxLayout(request)
        self.request_edit = QPlainTextEdit()
        self.request_edit.setPlaceholderText(
            "e.g. Tag everything about the database decision with db"
        )
        self.request_edit.setMaximumHeight(90)
        self.run_button = QPushButton("Run")
        self.request_label = QLabel("")
        self.request_label.setWordWrap(True)
        run_row = QHBoxLayout()
        run_row.addWidget(self.run_button)
        run_row.addWidget(self.request_label, 1)
        request_layout.addWidget(self.request_edit)
        request_layout.addLayout(run_row)

        queue = QGroupBox("Queue")
        queue_layout = QVBoxLayout(queue)
        self.queue_table = _table(QUEUE_COLUMNS)
        self.cancel_button = QPushButton("Cancel task")
        self.cancel_button.setEnabled(False)
        self.result_view = QPlainTextEdit()
        self.result_view.setReadOnly(True)
        queue_layout.addWidget(self.queue_table, 2)
        queue_layout.addWidget(self.cancel_button)
        queue_layout.addWidget(self.result_view, 1)

        audit = QGroupBox("Audit journal (click a message to open it)")
        audit_layout = QVBoxLayout(audit)
        self.audit_table = _table(AUDIT_COLUMNS)
        audit_layout.addWidget(self.audit_table)

        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(settings)
        left_layout.addWidget(request)
        left_layout.addStretch(1)
        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(queue)
        right.addWidget(audit)
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(left)
        splitter.addWidget(right)
        splitter.setStretchFactor(1, 2)
        layout = QVBoxLayout(self)
        layout.addWidget(splitter)

        self.refresh_models_button.clicked.connect(self.refresh_models)
        self.test_button.clicked.connect(self.test_connection)
        self.save_button.clicked.connect(self.save_settings)
        self.run_button.clicked.connect(self.run_request)
        self.cancel_button.clicked.connect(self.cancel_selected)
        self.queue_table.itemSelectionChanged.connect(self._on_selection)
        self.audit_table.cellClicked.connect(self._on_audit_clicked)

    # -- settings --------------------------------------------------------------------------

    def _load_settings(self, config: AgentConfig) -> None:
        self.enabled_box.setChecked(config.enabled)
        self.host_edit.setText(config.ollama_host)
        self.model_combo.setEditText(config.ollama_model)
        temperature = config.ollama_temperature
        self.temperature_spin.setValue(NO_TEMPERATURE if temperature is None else temperature)
        self.steps_spin.setValue(config.max_steps)
        self.tokens_spin.setValue(config.max_tokens)
        self.allow_delete_box.setChecked(config.allow_delete)

    def settings_config(self) -> AgentConfig:
        temperature: float | None = self.temperature_spin.value()
        if temperature is not None and temperature < 0:
            temperature = None
        return self.agent.config.with_changes(
            enabled=self.enabled_box.isChecked(),
            ollama_host=self.host_edit.text().strip(),
            ollama_model=self.model_combo.currentText().strip(),
            ollama_temperature=temperature,
            max_steps=self.steps_spin.value(),
            max_tokens=self.tokens_spin.value(),
            allow_delete=self.allow_delete_box.isChecked(),
        )

    def _host(self) -> str:
        return self.settings_config().effective_host()

    @Slot()
    def save_settings(self) -> None:
        try:
            config = self.settings_config()
            config.effective_host()
        except ValueError as exc:
            self.settings_label.setText(f"Ollama host: {exc}")
            return

        def work(_job: Any) -> AgentConfig:
            save_config(self.data_dir, config)
            return config

        def saved(result: AgentConfig) -> None:
            self.agent.set_config(result)
            self.settings_label.setText("Saved to agent.yaml.")

        self.save_button.setEnabled(False)
        job = self.jobs.run(work, saved, self._settings_failed)
        job.finished.connect(lambda: self.save_button.setEnabled(True))

    def _settings_failed(self, exc: BaseException) -> None:
        self.settings_label.setText(f"Could not save agent.yaml: {exc}")

    @Slot()
    def refresh_models(self) -> None:
        try:
            host = self._host()
        except ValueError as exc:
            self.connection_label.setText(f"Ollama host: {exc}")
            return

        def work(_job: Any) -> list[str]:
            side = OllamaSide(host, 10.0)
            try:
                return side.models()
            finally:
                side.close()

        def listed(models: list[str]) -> None:
            current = self.model_combo.currentText()
            self.model_combo.clear()
            self.model_combo.addItems(models)
            self.model_combo.setEditText(current or (models[0] if models else ""))
            self.connection_label.setText(f"{len(models)} models at {host}")

        self.jobs.run(work, listed, self._connection_failed)

    @Slot()
    def test_connection(self) -> None:
        try:
            host = self._host()
        except ValueError as exc:
            self.connection_label.setText(f"Ollama host: {exc}")
            return
        model = self.model_combo.currentText().strip()

        def work(_job: Any) -> str:
            side = OllamaSide(host, 10.0)
            try:
                version = side.version()
                if not model:
                    return f"Ollama {version} at {host}; choose a model"
                capabilities = side.capabilities(model)
            finally:
                side.close()
            tools = "tools" if "tools" in capabilities else "NO tool support"
            vision = ", vision" if "vision" in capabilities else ""
            return f"Ollama {version} at {host}: {model} ({tools}{vision})"

        self.connection_label.setText("Testing…")
        self.jobs.run(work, self.connection_label.setText, self._connection_failed)

    def _connection_failed(self, exc: BaseException) -> None:
        if isinstance(exc, OllamaProblem):
            self.connection_label.setText(text(exc.key, "en", **exc.values))
        else:
            self.connection_label.setText(f"Failed: {type(exc).__name__}")

    # -- requests and the queue ------------------------------------------------------------

    @Slot()
    def run_request(self) -> None:
        request = self.request_edit.toPlainText()
        arguments: dict[str, Any] = {"request": request}

        def work(_job: Any) -> Any:
            return self.agent.submit(arguments)

        def queued(result: Any) -> None:
            self.request_edit.clear()
            self.request_label.setText(f"Queued task {result.task_id}.")

        def failed(exc: BaseException) -> None:
            if isinstance(exc, AgentInputError):
                self.request_label.setText(exc.message)
            else:
                self.request_label.setText(f"Could not queue the task: {type(exc).__name__}")

        self.jobs.run(work, queued, failed)

    def selected_task_id(self) -> str | None:
        rows = self.queue_table.selectionModel().selectedRows()
        if not rows:
            return None
        item = self.queue_table.item(rows[0].row(), 0)
        return None if item is None else str(item.data(Qt.ItemDataRole.UserRole))

    @Slot()
    def cancel_selected(self) -> None:
        task_id = self.selected_task_id()
        if task_id is None:
            return
        self.cancel_button.setEnabled(False)
        self.jobs.run(lambda _job: self.agent.cancel(task_id))

    @Slot()
    def _on_selection(self) -> None:
        task_id = self.selected_task_id()
        task = None if task_id is None else self.agent.get(task_id)
        self.cancel_button.setEnabled(task is not None and not task.terminal)
        self.result_view.setPlainText("" if task is None else self.agent.render(task))

    @Slot(object)
    def _on_task_changed(self, task: Task) -> None:
        self._show_task(task)
        if task.task_id == self.selected_task_id():
            self.cancel_button.setEnabled(not task.terminal)
            self.result_view.setPlainText(self.agent.render(task))
        if task.state in ("running", "completed", "failed", "cancelled"):
            self.refresh_audit()

    def _show_task(self, task: Task) -> None:
        row = self._rows.get(task.task_id)
        if row is None:
            row = self.queue_table.rowCount()
            self.queue_table.insertRow(row)
            self._rows[task.task_id] = row
        total = task.input_tokens + task.output_tokens
        values = (
            task.task_id[:8],
            task.state,
            f"{task.completed_steps}/{task.total_steps}"
            + (f" · {task.current_task}" if task.current_task else ""),
            f"{total:,}",
            task.request.replace("\n", " ")[:200],
        )
        for column, value in enumerate(values):
            item = QTableWidgetItem(value)
            item.setData(Qt.ItemDataRole.UserRole, task.task_id)
            self.queue_table.setItem(row, column, item)

    def row_state(self, task_id: str) -> str:
        row = self._rows.get(task_id)
        item = None if row is None else self.queue_table.item(row, 1)
        return "" if item is None else item.text()

    # -- the audit journal -----------------------------------------------------------------

    @Slot()
    def refresh_audit(self) -> None:
        self.jobs.run(lambda _job: self.agent.audit(), self._show_audit)

    def _show_audit(self, records: list[AuditRecord]) -> None:
        self.audit_table.setRowCount(0)
        for record in reversed(records):  # newest first
            row = self.audit_table.rowCount()
            self.audit_table.insertRow(row)
            before = "–" if record.before_revision is None else str(record.before_revision)
            after = "–" if record.after_revision is None else str(record.after_revision)
            values = (
                record.at,
                record.task_id[:8],
                record.tool,
                ", ".join(record.message_ids),
                f"{before} → {after}",
                "yes" if record.ok else "no",
            )
            for column, value in enumerate(values):
                item = QTableWidgetItem(value)
                item.setData(Qt.ItemDataRole.UserRole, list(record.message_ids))
                if column == 3 and record.message_ids:
                    item.setForeground(self.palette().link())
                    item.setToolTip("Open this message in the browser")
                self.audit_table.setItem(row, column, item)

    @Slot(int, int)
    def _on_audit_clicked(self, row: int, _column: int) -> None:
        item = self.audit_table.item(row, 3)
        ids = [] if item is None else item.data(Qt.ItemDataRole.UserRole)
        if not ids:
            return
        message_id = str(ids[0])
        self.openMessage.emit(message_id)
        service = self.service
        if service is None:
            return

        def session_of(_job: Any) -> str:
            found = service.read_messages(
                view="context", message_id=message_id, before=0, after=0, relation_depth=0
            )
            return str(found["message"]["session_id"])

        def gone(_exc: BaseException) -> None:
            self.request_label.setText("That message no longer exists (deleted).")

        self.jobs.run(session_of, lambda sid: self.openRequested.emit(message_id, str(sid)), gone)

    # -- closing ---------------------------------------------------------------------------

    def shutdown(self, msecs: int = 10_000) -> bool:
        """Stop following the queue and wait for background calls."""
        self._unsubscribe()
        return self.jobs.shutdown(msecs)


def _table(columns: tuple[str, ...]) -> QTableWidget:
    table = QTableWidget(0, len(columns))
    table.setHorizontalHeaderLabels(list(columns))
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.verticalHeader().setVisible(False)
    table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    table.horizontalHeader().setStretchLastSection(True)
    return table
