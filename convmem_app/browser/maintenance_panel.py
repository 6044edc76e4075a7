"""Maintenance: rebuild the index (compaction) and the health panel."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from convmem_app.browser import format as fmt
from convmem_app.browser import theme
from convmem_app.browser.jobs import Job
from convmem_app.browser.memory_chart import PARTS, MemoryChart
from convmem_app.browser.page import BrowserPage, PageContext

if TYPE_CHECKING:
    from convmem_engine.service import ChangeEvent

STORE_FIELDS = (
    ("format_version", "Format version", "int"),
    ("log_size", "Log size", "bytes"),
    ("snapshot_size", "Snapshot size", "bytes"),
    ("active_messages", "Active messages", "int"),
    ("session_count", "Sessions", "int"),
    ("deleted_messages", "Deleted (tombstones)", "int"),
    ("last_sequence", "Last sequence", "int"),
    ("update_records", "Update records", "int"),
    ("dead_bytes", "Dead bytes", "bytes"),
    ("recovered_tail", "Recovered torn tail", "bool"),
    ("snapshot_valid", "Snapshot valid", "bool"),
    ("last_error", "Last error", "text"),
)
IO_FIELDS = (
    ("write_bytes", "Bytes written", "bytes"),
    ("write_calls", "Write calls", "int"),
    ("flush_calls", "Flush (fsync) calls", "int"),
    ("truncate_calls", "Truncate calls", "int"),
    ("replace_calls", "Replace calls", "int"),
)
KNOWN = {k for k, _l, _t in STORE_FIELDS} | {"status", "memory_estimate", "io"}


def value_text(value: Any, kind: str) -> str:
    if kind == "bytes":
        n = int(value)
        return f"{fmt.bytes_text(n)} ({n:,} B)" if n >= 1024 else f"{n} B"
    if kind == "int":
        return f"{int(value):,}"
    if kind == "bool":
        return "yes" if value else "no"
    return str(value) if value not in ("", None) else "—"


def _form_label() -> QLabel:
    label = QLabel()
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return label


class MaintenancePanel(BrowserPage):
    """The Maintenance page: rebuild with its result, and every health field (the memory
    estimate as a chart, the I/O counters). Health is read when the page is shown and, while
    it is shown, at most once a second as the store changes."""

    name = "maintenance"
    title = "&Maintenance"

    rebuildFinished = Signal(dict)
    rebuildFailed = Signal(str)
    healthLoaded = Signal(dict)

    def __init__(self, context: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(context, parent)
        self._health_stale = True
        self._health_timer = QTimer(self)
        self._health_timer.setSingleShot(True)
        self._health_timer.setInterval(1000)
        self._health_timer.timeout.connect(self._refresh_health_if_current)
        self._rebuild_job: Job | None = None
        self._health_job: Job | None = None
        self._health_again = False
        self.health: dict[str, Any] | None = None
        self.last_rebuild: dict[str, Any] | None = None
        self._started = 0.0

        # rebuild
        self.rebuild_button = QPushButton("Rebuild index…")
        self.rebuild_button.setToolTip(
            "Compact the log to live messages and rebuild snapshot and indexes. Deleted content "
            "is physically removed. It runs to completion once started (it is atomic)."
        )
        self.rebuild_progress = QProgressBar()
        self.rebuild_progress.setRange(0, 1)
        self.rebuild_progress.setValue(0)
        self.rebuild_progress.setTextVisible(False)
        self.rebuild_result = QLabel("Not run in this session.")
        self.rebuild_result.setWordWrap(True)
        self.rebuild_result.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._elapsed = QTimer(self)
        self._elapsed.setInterval(100)
        self._elapsed.timeout.connect(self._tick)
        rebuild_box = QGroupBox("Rebuild index")
        rb = QVBoxLayout(rebuild_box)
        row = QHBoxLayout()
        row.addWidget(self.rebuild_button)
        row.addWidget(self.rebuild_progress, 1)
        rb.addLayout(row)
        rb.addWidget(self.rebuild_result)

        # health
        self.status_badge = QLabel()
        self.status_badge.setObjectName("healthStatus")
        self.refresh_button = QPushButton("Refresh")
        self.updated = QLabel()
        head = QHBoxLayout()
        head.addWidget(QLabel("Status:"))
        head.addWidget(self.status_badge)
        head.addStretch(1)
        head.addWidget(self.updated)
        head.addWidget(self.refresh_button)

        self.labels: dict[str, QLabel] = {}
        store_box = QGroupBox("Store")
        store_form = QFormLayout(store_box)
        for key, label, _kind in STORE_FIELDS:
            self.labels[key] = _form_label()
            store_form.addRow(label + ":", self.labels[key])
        self.extra_form = store_form
        self.extra_labels: dict[str, QLabel] = {}

        io_box = QGroupBox("I/O counters (logical)")
        io_form = QFormLayout(io_box)
        for key, label, _kind in IO_FIELDS:
            self.labels["io." + key] = _form_label()
            io_form.addRow(label + ":", self.labels["io." + key])

        mem_box = QGroupBox("Memory estimate")
        mem_layout = QVBoxLayout(mem_box)
        self.memory_total = QLabel()
        self.chart = MemoryChart()
        mem_layout.addWidget(self.memory_total)
        mem_layout.addWidget(self.chart)
        for key, _label in PARTS:
            self.labels["memory_estimate." + key] = QLabel()  # exact numbers, for tooltips/tests

        health_box = QGroupBox("Health")
        hb = QVBoxLayout(health_box)
        hb.addLayout(head)
        columns = QHBoxLayout()
        left = QVBoxLayout()
        left.addWidget(store_box)
        left.addStretch(1)
        right = QVBoxLayout()
        right.addWidget(mem_box)
        right.addWidget(io_box)
        right.addStretch(1)
        columns.addLayout(left, 1)
        columns.addLayout(right, 1)
        hb.addLayout(columns)

        inner = QWidget()
        layout = QVBoxLayout(inner)
        layout.addWidget(rebuild_box)
        layout.addWidget(health_box)
        layout.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(inner)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)

        self.rebuild_button.clicked.connect(self.rebuild)
        self.refresh_button.clicked.connect(self.refresh_health)

    # --- the page's hooks ---

    def page_shown(self) -> None:
        if self._health_stale:
            self._refresh_health_if_current()

    def refresh(self, current: bool) -> None:
        self._health_stale = True
        self._refresh_health_if_current()

    def on_changes(self, changes: Sequence[ChangeEvent]) -> None:
        # throttled, not debounced: a steady stream of writes still refreshes every second
        self._health_stale = True
        if not self._health_timer.isActive():
            self._health_timer.start()

    def _refresh_health_if_current(self) -> None:
        if self.is_current():
            self._health_stale = False
            self.refresh_health()
        else:
            self._health_stale = True

    # --- rebuild ---

    @property
    def rebuilding(self) -> bool:
        return self._rebuild_job is not None

    def rebuild(self) -> None:
        if self._rebuild_job is not None:
            return
        service = self._service
        job = Job(lambda _j: service.rebuild_index())
        self._rebuild_job = job
        self.rebuild_button.setEnabled(False)
        self.rebuild_progress.setRange(0, 0)  # busy: the service reports no steps
        self.rebuild_result.setText("Rebuilding… (reads and writes wait until it finishes)")
        self._started = time.monotonic()
        self._elapsed.start()
        job.succeeded.connect(self._rebuilt)
        job.failed.connect(self._rebuild_failed)
        self._runner.start(job)

    def _tick(self) -> None:
        self.rebuild_result.setText(f"Rebuilding… {time.monotonic() - self._started:.1f} s")

    def _rebuild_over(self) -> None:
        self._rebuild_job = None
        self._elapsed.stop()
        self.rebuild_button.setEnabled(True)
        self.rebuild_progress.setRange(0, 1)

    def _rebuilt(self, result: dict[str, Any]) -> None:
        self._rebuild_over()
        self.rebuild_progress.setValue(1)
        self.last_rebuild = result
        before, after = int(result.get("bytes_before", 0)), int(result.get("bytes_after", 0))
        saved = before - after
        self.rebuild_result.setText(
            f"Done in {time.monotonic() - self._started:.1f} s: "
            f"{int(result.get('messages_indexed', 0)):,} messages indexed, "
            f"{int(result.get('records_removed', 0)):,} records removed; "
            f"log {fmt.bytes_text(before)} → {fmt.bytes_text(after)}"
            + (f" ({fmt.bytes_text(saved)} freed)" if saved > 0 else "")
            + "."
        )
        self.rebuildFinished.emit(result)
        self.refresh_health()

    def _rebuild_failed(self, exc: BaseException) -> None:
        self._rebuild_over()
        self.rebuild_progress.setValue(0)
        code = getattr(exc, "code", type(exc).__name__)
        color = theme.error_color(self.palette()).name()
        self.rebuild_result.setText(f'<span style="color:{color}">Failed ({code}): {exc}</span>')
        self.rebuildFailed.emit(str(exc))

    # --- health ---

    def refresh_health(self) -> None:
        if self._health_job is not None:
            self._health_again = True
            return
        service = self._service
        job = Job(lambda _j: service.get_system_health())
        self._health_job = job

        def done(result: dict[str, Any]) -> None:
            self.show_health(result)

        def failed(exc: BaseException) -> None:
            self.status_badge.setText(f"unavailable: {exc}")

        def finished() -> None:
            self._health_job = None
            if self._health_again:
                self._health_again = False
                self.refresh_health()

        job.succeeded.connect(done)
        job.failed.connect(failed)
        job.finished.connect(finished)
        self._runner.start(job)

    def show_health(self, h: dict[str, Any]) -> None:
        self.health = h
        status = str(h.get("status", ""))
        ok = status == "OK"
        color = (theme.ok_color if ok else theme.error_color)(self.palette()).name()
        self.status_badge.setText(f'<b style="color:{color}">{status}</b>')
        for key, _label, kind in STORE_FIELDS:
            if key in h:
                self.labels[key].setText(value_text(h[key], kind))
        for key, _label, kind in IO_FIELDS:
            self.labels["io." + key].setText(value_text(h.get("io", {}).get(key, 0), kind))
        estimate = dict(h.get("memory_estimate", {}))
        for key, _label in PARTS:
            self.labels["memory_estimate." + key].setText(str(estimate.get(key, 0)))
        total = int(estimate.get("total_bytes", 0))
        self.memory_total.setText(f"Total: <b>{fmt.bytes_text(total)}</b> ({total:,} B)")
        self.chart.set_estimate(estimate)
        for key, value in h.items():  # fields added after this panel was written
            if key in KNOWN:
                continue
            if key not in self.extra_labels:
                self.extra_labels[key] = _form_label()
                self.extra_form.addRow(key + ":", self.extra_labels[key])
            self.extra_labels[key].setText(str(value))
        self.updated.setText("updated " + time.strftime("%H:%M:%S"))
        self.healthLoaded.emit(h)
