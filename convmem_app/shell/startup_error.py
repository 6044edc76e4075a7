"""What the user sees when the app cannot start: a title, what happened, what to do next."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QCloseEvent, QDesktopServices
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from convmem_app.shim.paths import SocketDirError
from convmem_engine.domain.errors import (
    BusyError,
    ConvMemError,
    CorruptStoreError,
    NewerFormatError,
    StoreIOError,
    UnsafeDataDirError,
)
from convmem_engine.runtime import ListenerError


@dataclass(frozen=True)
class StartupProblem:
    code: str
    title: str
    detail: str
    next_steps: str
    repairable: bool = False  # a power cut's damage to the log: the window offers Repair


def describe(error: BaseException, data_dir: Path) -> StartupProblem:
    """Turn a startup failure into words. Messages of engine errors never contain user data."""
    detail = error.message if isinstance(error, ConvMemError) else str(error)
    if isinstance(error, BusyError):
        return StartupProblem(
            "BUSY",
            "The data folder is in use",
            f"Another process holds the lock on {data_dir} and does not answer as a ConvMem "
            f"app. ({detail})",
            "Usually this is `convmem serve` started by an LLM host that is configured without "
            "the shim. Close that host (or point it at convmem-shim instead) and click Retry.",
        )
    if isinstance(error, NewerFormatError):
        return StartupProblem(
            "CORRUPT_STORE",
            "The memory store was written by a newer ConvMem",
            f"{detail}.",
            "Install the ConvMem version that wrote it (or a newer one). This version cannot "
            "read it and changed nothing.",
        )
    if isinstance(error, CorruptStoreError):
        from convmem_engine.transfer.repair import damaged_log_offset, looks_like_a_power_cut

        offset = damaged_log_offset(error)
        if offset is not None and looks_like_a_power_cut(data_dir, offset):
            return StartupProblem(
                "CORRUPT_STORE",
                "The memory store is damaged",
                f"An integrity check failed: {detail}. Nothing was changed. The log holds zeros "
                "followed by data: a power cut's mark, when the disk kept later writes without "
                "earlier ones.",
                "Click Repair: it keeps every record before the damage (after a power cut, every "
                f"write ConvMem confirmed), puts the damaged files aside in "
                f"{data_dir}.before-repair-<time> and starts again (or run `convmem repair`). "
                "Or restore a backup, or use another data folder (`convmem app --data-dir NEW`).",
                repairable=True,
            )
        return StartupProblem(
            "CORRUPT_STORE",
            "The memory store is damaged",
            f"An integrity check failed: {detail}. Nothing was changed or repaired.",
            f"Copy the folder {data_dir} somewhere safe first. Then restore it from a backup, "
            "or start ConvMem with another data folder (`convmem app --data-dir NEW`) and keep "
            "the damaged copy for inspection. (`convmem repair` cuts the log at a damaged "
            "record, keeping the damaged files aside: what follows it is then only in that "
            "copy.)",
        )
    if isinstance(error, UnsafeDataDirError):
        return StartupProblem(
            "IO_ERROR",
            "The data folder is not private",
            f"{detail}.",
            "ConvMem opens only a data folder that belongs to you and that no other user can "
            "change. Fix its owner or permissions as described above, or start ConvMem with "
            "another data folder (`convmem app --data-dir NEW`), then click Retry.",
        )
    if isinstance(error, StoreIOError):
        return StartupProblem(
            "IO_ERROR",
            "The data folder cannot be read or written",
            detail,
            f"Check free disk space and the permissions of {data_dir}, then click Retry.",
        )
    if isinstance(error, ListenerError):
        return StartupProblem(
            "PIPE",
            "Hosts cannot reach ConvMem",
            f"The local pipe for hosts could not be opened: {detail}.",
            "On Linux and macOS the socket path may be too long (about 100 characters at "
            "most): set XDG_RUNTIME_DIR to a short private folder. Then click Retry.",
        )
    if isinstance(error, SocketDirError):
        return StartupProblem(
            "PIPE",
            "Hosts cannot reach ConvMem",
            f"The local pipe for hosts could not be opened: the socket directory {error.path} "
            f"{error.reason}.",
            f"The folder {error.path} must be a directory of yours that only you can use (it "
            "holds the socket hosts connect to). Remove it, or set XDG_RUNTIME_DIR to a private "
            "folder of yours, then click Retry.",
        )
    if isinstance(error, OSError):
        return StartupProblem(
            "IO_ERROR",
            "The data folder cannot be read or written",
            (error.strerror or str(error) or type(error).__name__)
            + (f": {error.filename}" if error.filename else ""),
            f"Check free disk space and the permissions of {data_dir}, then click Retry.",
        )
    code = error.code if isinstance(error, ConvMemError) else "INTERNAL_ERROR"
    return StartupProblem(
        code,
        "ConvMem could not start",
        detail or type(error).__name__,
        "Click Retry. If it happens again, run `convmem app` from a terminal and report what "
        "it prints.",
    )


class StartupErrorWindow(QWidget):
    retryRequested = Signal()
    quitRequested = Signal()

    def __init__(self, data_dir: Path) -> None:
        super().__init__()
        self.setWindowTitle("ConvMem — cannot start")
        self._data_dir = data_dir
        self.title_label = QLabel()
        font = self.title_label.font()
        font.setPointSizeF(font.pointSizeF() * 1.3)
        font.setBold(True)
        self.title_label.setFont(font)
        self.detail_label = QLabel()
        self.next_label = QLabel()
        self.code_label = QLabel()
        for label in (self.detail_label, self.next_label):
            label.setWordWrap(True)
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.retry_button = QPushButton("Retry")
        self.repair_button = QPushButton("Repair")
        self.repair_button.hide()
        self.folder_button = QPushButton("Open data folder")
        self.quit_button = QPushButton("Quit")
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        for button in (self.folder_button, self.repair_button, self.retry_button, self.quit_button):
            buttons.addWidget(button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.title_label)
        layout.addWidget(self.detail_label)
        layout.addWidget(QLabel("What to do next:"))
        layout.addWidget(self.next_label)
        layout.addWidget(self.code_label)
        layout.addStretch(1)
        layout.addLayout(buttons)
        self.retry_button.clicked.connect(self.retryRequested)
        self.repair_button.clicked.connect(self.repair)
        self.quit_button.clicked.connect(self.quitRequested)
        self.folder_button.clicked.connect(self._open_folder)
        self.resize(520, 240)
        self.problem: StartupProblem | None = None

    def show_problem(self, problem: StartupProblem) -> None:
        self.problem = problem
        self.title_label.setText(problem.title)
        self.detail_label.setText(problem.detail)
        self.next_label.setText(problem.next_steps)
        self.code_label.setText(f"Error code: {problem.code}")
        self.retry_button.setEnabled(True)
        self.repair_button.setVisible(problem.repairable)
        self.repair_button.setEnabled(problem.repairable)
        self._fit()

    def _fit(self) -> None:
        """Tall enough for the wrapped texts (a word-wrapped label does not grow its window):
        the size hint's height is the texts' at a narrower width, so it is enough."""
        self.resize(self.width(), max(self.height(), self.sizeHint().height()))

    def repair(self) -> None:
        """`convmem repair` on the data folder (convmem_engine/transfer/repair.py), then start
        again; a refusal is shown and nothing is changed. Runs here, on the GUI thread, under
        a wait cursor: it opens the store twice and copies its files twice (2.1 s for a
        million messages, measured)."""
        from convmem_engine.transfer.repair import repair_store

        self.repair_button.setEnabled(False)
        QApplication.setOverrideCursor(Qt.CursorShape.WaitCursor)
        try:
            report = repair_store(self._data_dir)
        except ConvMemError as e:
            self.next_label.setText(f"Repair did not help: {e.message}")
            return
        except OSError as e:
            self.next_label.setText(f"Repair did not help: {e.strerror or e}")
            return
        finally:
            QApplication.restoreOverrideCursor()
        self.repair_button.hide()
        if report.offset is not None:
            self.next_label.setText(
                f"Repaired: active.log cut at offset {report.offset}, {report.messages} messages "
                f"kept; the damaged files are in {report.aside}. Starting ConvMem again…"
            )
            self._fit()
        self.retryRequested.emit()

    def closeEvent(self, event: QCloseEvent) -> None:
        # Closing the window is the user's answer "give up": the app quits.
        super().closeEvent(event)
        self.quitRequested.emit()

    def _open_folder(self) -> None:
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(self._data_dir)))
