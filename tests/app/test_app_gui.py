"""The tray app in-process with pytest-qt (offscreen): tray menu actions, the status line as real
shims connect and disconnect, the startup error paths, no-tray mode, handing over to a second
instance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from app_helpers import ROOT, child_env, initialize_request, lines, write_call
from app_helpers import raw_shim as raw_pipe_shim
from PySide6.QtCore import QSettings
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QSystemTrayIcon
from pytestqt.qtbot import QtBot

from convmem_app.shell import autostart
from convmem_app.shell.app import EXIT_STARTUP_FAILED, ConvMemApp
from convmem_engine.service import MemoryService
from tests.crashed_store import crashed_store, zero_block_before_the_end

pytestmark = [
    pytest.mark.gui,
    pytest.mark.qt_log_ignore("This plugin does not support"),
]

INITIALIZE = lines(initialize_request("gui-test"))

MakeApp = Callable[..., ConvMemApp]


@pytest.fixture
def make_app(qtbot: QtBot, tmp_path: Path) -> Iterator[MakeApp]:
    apps: list[ConvMemApp] = []

    def make(data_dir: Path | None = None, **options: Any) -> ConvMemApp:
        settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
        options.setdefault("busy_wait", 0.3)
        app = ConvMemApp(data_dir or tmp_path / "data", settings=settings, **options)
        apps.append(app)
        return app

    yield make
    for app in apps:
        if app.state != "stopped":
            with qtbot.waitSignal(app.finished, timeout=30_000):
                app.quit()


def started(qtbot: QtBot, app: ConvMemApp, state: str = "running") -> ConvMemApp:
    app.start()
    qtbot.waitUntil(lambda: app.state == state, timeout=30_000)
    return app


@pytest.fixture
def with_tray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend the desktop has a system tray (offscreen has none)."""
    monkeypatch.setattr(QSystemTrayIcon, "isSystemTrayAvailable", staticmethod(lambda: True))


def raw_shim(data_dir: Path) -> subprocess.Popen[bytes]:
    """A shim for the app under test (which it must not start), past its initialize request."""
    shim = raw_pipe_shim(data_dir, "--start-timeout", "0")
    assert shim.stdin is not None
    shim.stdin.write(INITIALIZE)
    shim.stdin.flush()
    return shim


def test_tray_menu_actions(
    qtbot: QtBot, make_app: MakeApp, tmp_path: Path, with_tray: None
) -> None:
    app = started(qtbot, make_app(minimized=True))
    assert app.has_tray and app.tray.icon.isVisible()
    texts = [a.text() for a in app.tray.menu.actions() if not a.isSeparator()]
    assert texts == [
        "Open memory browser",
        "OK · 0 hosts connected",
        "Copy host configuration",
        "Copy HTTP host configuration",
        "HTTP endpoint…",
        "Rebuild index",
        "Start at login",
        "Quit ConvMem",
    ]
    assert app.window is None  # --minimized with a tray: no window until asked

    app.tray.open_action.trigger()
    assert app.window is not None and app.window.isVisible()

    app.tray.copy_action.trigger()
    config = json.loads(QGuiApplication.clipboard().text())
    server = config["mcpServers"]["convmem"]
    assert Path(server["command"]).is_absolute()
    assert server["args"][-2:] == ["--data-dir", str(app.data_dir)]
    assert "shim" in " ".join([server["command"], *server["args"]])

    with qtbot.waitSignal(app.rebuildFinished, timeout=30_000) as rebuilt:
        app.tray.rebuild_action.trigger()
    assert isinstance(rebuilt.args[0], dict) and rebuilt.args[0]["status"] == "OK"
    assert app.tray.rebuild_action.isEnabled()

    entry = autostart.desktop_file()
    assert not app.start_at_login and not entry.exists()
    app.tray.login_action.trigger()
    assert app.start_at_login
    text = entry.read_text()
    assert "--minimized" in text and str(app.data_dir) in text
    app.tray.login_action.trigger()
    assert not app.start_at_login and not entry.exists()

    with qtbot.waitSignal(app.finished, timeout=30_000) as finished:
        app.tray.quit_action.trigger()
    assert finished.args == [0]
    assert not app.tray.icon.isVisible()
    MemoryService.open(app.data_dir).close()  # the lock was released


def test_status_line_follows_hosts(qtbot: QtBot, make_app: MakeApp) -> None:
    app = started(qtbot, make_app())
    status = app.tray.status_action
    first = raw_shim(app.data_dir)
    qtbot.waitUntil(lambda: status.text() == "OK · 1 host connected (gui-test 0)", timeout=30_000)
    second = raw_shim(app.data_dir)
    qtbot.waitUntil(lambda: status.text() == "OK · 2 hosts connected (gui-test 0)", timeout=30_000)
    assert app.host_count == 2
    assert app.tray.icon.toolTip() == "ConvMem — OK · 2 hosts connected (gui-test 0)"
    assert first.stdin is not None
    first.stdin.close()  # a host that ends its session
    qtbot.waitUntil(lambda: status.text() == "OK · 1 host connected (gui-test 0)", timeout=30_000)
    second.kill()  # a host that dies
    qtbot.waitUntil(lambda: status.text() == "OK · 0 hosts connected", timeout=30_000)
    assert first.wait(30) == 0
    second.wait(30)
    for shim in (first, second):
        for stream in (shim.stdin, shim.stdout, shim.stderr):
            if stream is not None:
                stream.close()


def test_busy_lock_shows_the_error_then_retry_works(qtbot: QtBot, make_app: MakeApp) -> None:
    app = make_app()
    holder = MemoryService.open(app.data_dir)
    try:
        with qtbot.waitSignal(app.messageShown, timeout=30_000) as shown:
            started(qtbot, app, "error")
    finally:
        holder.close()
    assert app.last_problem_code == "BUSY"
    window = app.error_window
    assert window is not None and window.isVisible()
    assert window.problem is not None and window.problem.code == "BUSY"
    assert "Retry" in window.next_label.text()
    assert app.tray.status_text == "Cannot start: BUSY"
    assert not app.tray.copy_action.isEnabled()
    assert shown.args[0] == "The data folder is in use"

    window.retry_button.click()  # the other process is gone now
    qtbot.waitUntil(lambda: app.state == "running", timeout=30_000)
    assert not window.isVisible()
    assert app.tray.status_text.startswith("OK")


def test_corrupt_store_shows_what_to_do(qtbot: QtBot, make_app: MakeApp, tmp_path: Path) -> None:
    data_dir = tmp_path / "damaged"
    service = MemoryService.open(data_dir)
    for n in range(3):
        service.write_message(session_id="s", role="user", content=f"message number {n}")
    service.close()
    for name in ("snapshot.bin",):
        (data_dir / name).unlink(missing_ok=True)
    log_file = data_dir / "active.log"
    raw = bytearray(log_file.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # a complete record with a bad checksum
    log_file.write_bytes(bytes(raw))

    app = started(qtbot, make_app(data_dir), "error")
    assert app.last_problem_code == "CORRUPT_STORE"
    window = app.error_window
    assert window is not None and window.isVisible()
    assert "Nothing was changed" in window.detail_label.text()
    assert "somewhere safe" in window.next_label.text()
    assert window.repair_button.isHidden()  # a flipped byte is not a power cut: no button
    with qtbot.waitSignal(app.finished, timeout=30_000) as finished:
        window.quit_button.click()
    assert finished.args == [EXIT_STARTUP_FAILED]
    assert log_file.read_bytes() == bytes(raw)  # untouched


def refused_after_a_power_cut(
    qtbot: QtBot, make_app: MakeApp, tmp_path: Path
) -> tuple[ConvMemApp, Path, list[str]]:
    """An app started on a store a power cut left refused (a zeroed block before kept data):
    the app, its data dir and the acknowledged ids."""
    data_dir, acked = crashed_store(tmp_path, synced=40, unsynced=30)
    zero_block_before_the_end(data_dir, blocks_from_end=2)
    app = started(qtbot, make_app(data_dir), "error")
    assert app.last_problem_code == "CORRUPT_STORE"
    return app, data_dir, acked


def stored_ids(app: ConvMemApp) -> set[str]:
    """Every message id in the running app's store (crashed_store's sessions s0-s2)."""
    service = app.service
    assert service is not None
    return {
        m["message_id"]
        for session in ("s0", "s1", "s2")
        for m in service.read_messages(session_id=session, limit=100)["history"]
    }


def test_a_store_refused_after_a_power_cut_is_repaired_then_retry_works(
    qtbot: QtBot, make_app: MakeApp, tmp_path: Path
) -> None:
    """The window's advice followed as a person would: `convmem repair` run while the window
    shows, then Retry: the app runs on every acknowledged write."""
    app, data_dir, acked = refused_after_a_power_cut(qtbot, make_app, tmp_path)
    window = app.error_window
    assert window is not None and window.isVisible()
    assert "active.log: corrupt record at offset" in window.detail_label.text()
    assert "convmem repair" in window.next_label.text()
    repair = subprocess.run(
        [sys.executable, "-m", "convmem_app", "repair", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
        cwd=ROOT,
    )
    assert repair.returncode == 0, repair.stderr
    assert "repaired: active.log cut at offset" in repair.stdout
    window.retry_button.click()
    qtbot.waitUntil(lambda: app.state == "running", timeout=30_000)
    assert set(acked) <= stored_ids(app)


def test_the_windows_repair_button_after_a_power_cut(
    qtbot: QtBot, make_app: MakeApp, tmp_path: Path
) -> None:
    app, _, acked = refused_after_a_power_cut(qtbot, make_app, tmp_path)
    window = app.error_window
    assert window is not None and window.problem is not None and window.problem.repairable
    assert not window.repair_button.isHidden() and window.repair_button.isEnabled()
    assert "The log holds zeros followed by data" in window.detail_label.text()
    window.repair_button.click()
    qtbot.waitUntil(lambda: app.state == "running", timeout=30_000)
    assert window.isHidden()
    asides = list(tmp_path.glob("data.before-repair-*"))
    assert len(asides) == 1 and (asides[0] / "active.log").is_file()
    assert set(acked) <= stored_ids(app)


def test_unwritable_data_dir_is_an_io_error(
    qtbot: QtBot, make_app: MakeApp, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    app = started(qtbot, make_app(blocker / "data"), "error")
    assert app.last_problem_code == "IO_ERROR"
    assert app.error_window is not None
    assert "disk space" in app.error_window.next_label.text()


def test_without_tray_the_window_carries_the_menu_and_closing_quits(
    qtbot: QtBot, make_app: MakeApp
) -> None:
    app = started(qtbot, make_app(minimized=True))
    assert not app.has_tray
    window = app.window
    assert window is not None and window.isVisible()  # --minimized needs a tray to hide in
    assert app.tray.menu.menuAction() in window.menuBar().actions()
    with qtbot.waitSignal(app.finished, timeout=30_000) as finished:
        window.close()
    assert finished.args == [0]


def test_second_instance_raises_the_window(
    qtbot: QtBot, make_app: MakeApp, with_tray: None
) -> None:
    app = started(qtbot, make_app(minimized=True))
    assert app.window is None
    second = subprocess.Popen(
        [sys.executable, "-m", "convmem_app", "app", "--data-dir", str(app.data_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=child_env(),
        cwd=ROOT,
    )
    qtbot.waitUntil(lambda: second.poll() is not None, timeout=60_000)
    assert second.returncode == 0
    assert second.stderr is not None and b"already running" in second.stderr.read()
    second.stderr.close()
    assert app.window is not None and app.window.isVisible()


def test_quit_while_opening_still_finishes(qtbot: QtBot, make_app: MakeApp) -> None:
    app = make_app()
    with qtbot.waitSignal(app.finished, timeout=30_000):
        app.start()
        app.quit()
    assert app.state == "stopped"
    MemoryService.open(app.data_dir).close()


@pytest.mark.posix  # a socket path over the AF_UNIX limit; pipe names have no such limit
def test_a_pipe_that_cannot_listen_is_reported(
    qtbot: QtBot, make_app: MakeApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    too_long = tmp_path / ("r" * 120)
    too_long.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(too_long))
    app = started(qtbot, make_app(), "error")
    assert app.last_problem_code == "PIPE"
    assert app.error_window is not None
    assert "XDG_RUNTIME_DIR" in app.error_window.next_label.text()
    MemoryService.open(app.data_dir).close()  # the store was closed again: the lock is free


@pytest.mark.posix  # the private socket directory (POSIX owner and modes)
@pytest.mark.parametrize("planted", ["symlink", "other owner"])
def test_a_refused_socket_directory_is_reported_as_such_and_retry_recovers(
    qtbot: QtBot, make_app: MakeApp, private_dirs: Path, tmp_path: Path, planted: str
) -> None:
    """Issue 15 defect 8: the app said "check free disk space" for a socket directory that is
    not the user's own; it must say what the shim says, and how to fix it."""
    socket_dir = private_dirs / "convmem"
    if planted == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        socket_dir.symlink_to(tmp_path / "elsewhere")
    else:
        if not hasattr(os, "geteuid") or os.geteuid() != 0:
            pytest.skip("needs root to give a directory to another user")
        socket_dir.mkdir(mode=0o700)
        os.chown(socket_dir, 65534, 65534)
    app = started(qtbot, make_app(), "error")
    assert app.last_problem_code == "PIPE"
    window = app.error_window
    assert window is not None
    assert f"socket directory {socket_dir} is not a directory owned by this user" in (
        window.detail_label.text()
    )
    steps = window.next_label.text()
    assert "XDG_RUNTIME_DIR" in steps and str(socket_dir) in steps
    assert "disk space" not in steps
    MemoryService.open(app.data_dir).close()  # the store was closed again: the lock is free
    socket_dir.unlink() if socket_dir.is_symlink() else socket_dir.rmdir()
    window.retry_button.click()
    qtbot.waitUntil(lambda: app.state == "running", timeout=30_000)


def test_a_minimized_second_start_does_not_raise_the_window(
    qtbot: QtBot, make_app: MakeApp, with_tray: None
) -> None:
    app = started(qtbot, make_app(minimized=True))
    second = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "convmem_app",
            "app",
            "--minimized",
            "--data-dir",
            str(app.data_dir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(),
        cwd=ROOT,
    )
    qtbot.waitUntil(lambda: second.poll() is not None, timeout=60_000)
    assert second.returncode == 0  # e.g. started by a shim: it found us and left quietly
    assert app.window is None


def test_a_failure_escaping_a_worker_is_logged(
    qtbot: QtBot, make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    # A worker function reports its errors through its signal; what escapes even that (here a
    # BaseException, which it does not catch) must reach the log, not vanish in a Future.
    app = started(qtbot, make_app(minimized=True))

    def escapes() -> object:
        raise SystemExit(7)

    with caplog.at_level("ERROR", logger="convmem_app.shell.app"):
        app._call_in_worker(escapes, app.rebuildFinished)
        qtbot.waitUntil(lambda: "background work failed: SystemExit" in caplog.text)
    assert "escapes" in caplog.text  # the frames are there


def test_the_browser_welcomes_then_shows_the_connected_host_and_its_writes(
    qtbot: QtBot, make_app: MakeApp
) -> None:
    app = started(qtbot, make_app())
    app.show_window()
    portability = app.portability
    assert portability is not None and app.window is not None
    qtbot.waitUntil(lambda: portability.showing_welcome, timeout=30_000)
    assert app.backups is not None and not app.backups.busy  # first check a minute after start
    shim = raw_shim(app.data_dir)
    assert shim.stdin is not None and shim.stdout is not None
    shim.stdin.write(lines({"jsonrpc": "2.0", "method": "notifications/initialized"}))
    shim.stdin.write(lines(write_call(2, "trip", "remember the tram")))
    shim.stdin.flush()
    hosts = portability.hosts_page
    app.window.tabs.setCurrentWidget(hosts)
    qtbot.waitUntil(
        lambda: hosts.table.rowCount() == 1 and hosts.table.item(0, 0).text() == "gui-test 0",
        timeout=30_000,
    )
    qtbot.waitUntil(lambda: hosts.feed.count() == 1, timeout=30_000)
    assert "gui-test 0 wrote" in hosts.feed.item(0).text()
    qtbot.waitUntil(lambda: not portability.showing_welcome, timeout=30_000)
    shim.stdin.close()
    assert shim.wait(30) == 0
    for stream in (shim.stdout, shim.stderr):
        if stream is not None:
            stream.close()


def _restore_in_place_from_the_dialog(qtbot: QtBot, app: ConvMemApp, backup: str) -> Any:
    """Backup dialog → Restore in place… → confirm; returns the app's RestoreOutcome."""
    from PySide6.QtWidgets import QMessageBox

    app.show_window()
    assert app.portability is not None
    dialog = app.portability.open_backup()
    assert dialog is not None
    dialog.reload()
    rows = [dialog.backups.item(i).data(256) for i in range(dialog.backups.count())]
    dialog.backups.setCurrentRow(rows.index(backup))
    assert dialog.in_place_button.isVisibleTo(dialog) and dialog.in_place.text() == ""
    with qtbot.waitSignal(dialog.restoreConfirmationShown) as shown:
        dialog.in_place_button.click()
    box = shown.args[0]
    assert f"{app.data_dir}.before-restore-" in box.informativeText()
    assert "never overwritten" in box.informativeText()
    with qtbot.waitSignal(app.restoreFinished, timeout=60_000) as finished:
        box.button(QMessageBox.StandardButton.Yes).click()
    qtbot.waitUntil(lambda: app.state == "running", timeout=30_000)
    return finished.args[0]


def test_restore_in_place_from_the_browser_stops_restores_and_reopens(
    qtbot: QtBot, make_app: MakeApp
) -> None:
    from convmem_engine.tools import ToolRegistry
    from convmem_engine.transfer.backup import create_backup

    app = started(qtbot, make_app())
    service = app.service
    assert service is not None and app.backups is not None
    tools = ToolRegistry.for_service(service)
    for i in range(3):
        tools.call("write_message", {"session_id": "s", "role": "user", "content": f"kept {i}"})
    backup = create_backup(app.data_dir, app.backups.folder)  # online, the app keeps running
    tools.call("write_message", {"session_id": "s", "role": "user", "content": "after backup"})
    old_window = app.window

    outcome = _restore_in_place_from_the_dialog(qtbot, app, backup.path)
    assert outcome.ok and outcome.messages == 3, outcome
    # the data is the backup's, served by a new runtime, shown in a new window
    restored = app.service
    assert restored is not None and restored is not service
    history = restored.read_messages(view="history", session_id="s")["history"]
    assert [m["content"] for m in history] == ["kept 0", "kept 1", "kept 2"]
    assert app.window is not None and app.window is not old_window
    assert app.window.service is restored and "previous store is kept" in (
        app.window.status_text.text()
    )
    # the old store is kept beside it, whole: it still holds the message written after
    aside = Path(str(outcome.aside))
    assert aside.parent == app.data_dir.parent
    assert aside.name.startswith(f"{app.data_dir.name}.before-restore-")
    with MemoryService.open(aside) as old:
        contents = [
            m["content"] for m in old.read_messages(view="history", session_id="s")["history"]
        ]
    assert contents == ["kept 0", "kept 1", "kept 2", "after backup"]
    # hosts are served again over the pipe
    shim = raw_shim(app.data_dir)
    assert shim.stdin is not None and shim.stdout is not None
    qtbot.waitUntil(lambda: app.host_count == 1, timeout=30_000)
    shim.stdin.close()
    assert shim.wait(30) == 0
    for stream in (shim.stdout, shim.stderr):
        if stream is not None:
            stream.close()


def test_a_failed_restore_in_place_reopens_the_current_store_and_says_why(
    qtbot: QtBot, make_app: MakeApp
) -> None:
    from convmem_engine.tools import ToolRegistry
    from convmem_engine.transfer.backup import create_backup

    app = started(qtbot, make_app())
    service = app.service
    assert service is not None and app.backups is not None
    tools = ToolRegistry.for_service(service)
    tools.call("write_message", {"session_id": "s", "role": "user", "content": "current"})
    backup = create_backup(app.data_dir, app.backups.folder)
    log = Path(backup.path) / "active.log"  # damage the backup: one flipped byte
    data = bytearray(log.read_bytes())
    data[len(data) // 2] ^= 0xFF
    log.write_bytes(bytes(data))
    tools.call("write_message", {"session_id": "s", "role": "user", "content": "newer"})

    outcome = _restore_in_place_from_the_dialog(qtbot, app, backup.path)
    assert not outcome.ok and outcome.aside is None
    assert "restore failed and the current store was opened again" in outcome.text()
    reopened = app.service
    assert reopened is not None and reopened is not service
    history = reopened.read_messages(view="history", session_id="s")["history"]
    assert [m["content"] for m in history] == ["current", "newer"]
    assert not list(app.data_dir.parent.glob(f"{app.data_dir.name}.before-restore-*"))


def test_a_stream_of_writes_through_the_shim_all_reach_the_window_and_the_feed(
    qtbot: QtBot, make_app: MakeApp
) -> None:
    """Changes made while hosts keep writing reach the GUI thread in batches (convmem_app.inbox):
    every write still shows, in the browser's session list, in the history of the session open
    in Browse, and in the activity feed, which follows only while its tab is shown and catches
    up when it is."""
    app = started(qtbot, make_app())
    app.show_window()
    portability, window = app.portability, app.window
    assert portability is not None and window is not None
    shim = raw_shim(app.data_dir)
    assert shim.stdin is not None and shim.stdout is not None
    writes = 60
    shim.stdin.write(lines({"jsonrpc": "2.0", "method": "notifications/initialized"}))
    shim.stdin.write(lines(*(write_call(2 + i, "stream", f"note {i}") for i in range(writes))))
    shim.stdin.flush()
    answers: list[dict[str, Any]] = []
    out = shim.stdout

    def read() -> None:  # off the GUI thread: the app under test runs on it
        for _ in range(writes + 1):  # + initialize
            answers.append(json.loads(out.readline()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    qtbot.waitUntil(lambda: not reader.is_alive(), timeout=60_000)
    written = {
        json.loads(a["result"]["content"][0]["text"])["message"]["message_id"]
        for a in answers
        if a["id"] != 1
    }
    assert len(written) == writes
    hosts = portability.hosts_page
    assert not hosts.isVisible() and not hosts.following and hosts.feed.count() == 0
    window.tabs.setCurrentWidget(hosts)
    assert hosts.following
    qtbot.waitUntil(lambda: hosts.feed.count() == writes, timeout=30_000)
    shown = {hosts.feed.item(i).data(256)[0] for i in range(writes)}
    assert shown == written
    assert all("gui-test 0 wrote" in hosts.feed.item(i).text() for i in range(writes))
    sessions = window.browse.sessions_model

    def stream_count() -> int:
        row = sessions.row_of("stream")
        return -1 if row < 0 else int(sessions.rows()[row]["message_count"])

    qtbot.waitUntil(lambda: stream_count() == writes, timeout=30_000)
    # the session open in Browse: the host's next writes appear in its history as they come
    history = window.browse.history_model
    window.browse.select_session("stream")
    qtbot.waitUntil(lambda: history.rowCount() == writes and history.exhausted, timeout=30_000)
    more = 20
    shim.stdin.write(lines(*(write_call(100 + i, "stream", f"more {i}") for i in range(more))))
    shim.stdin.flush()
    later: list[str] = []

    def read_more() -> None:
        for _ in range(more):
            answer = json.loads(out.readline())
            later.append(
                json.loads(answer["result"]["content"][0]["text"])["message"]["message_id"]
            )

    reader = threading.Thread(target=read_more, daemon=True)
    reader.start()
    qtbot.waitUntil(lambda: not reader.is_alive(), timeout=60_000)
    qtbot.waitUntil(lambda: history.rowCount() == writes + more, timeout=30_000)
    assert [row["message_id"] for row in history.rows()[writes:]] == later
    qtbot.waitUntil(lambda: stream_count() == writes + more, timeout=30_000)
    shim.stdin.close()
    assert shim.wait(30) == 0
    for stream in (shim.stdout, shim.stderr):
        if stream is not None:
            stream.close()
