"""Welcome page and host setup, import/export/backup dialogs: real widgets, real files."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QSettings, Qt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transfer"))
from export_samples import chatgpt_export, write_json

from convmem_app.backup_schedule import BackupScheduler
from convmem_app.browser.host_setup import HostSetup, WelcomePage
from convmem_app.browser.jobs import JobRunner
from convmem_app.browser.transfer_dialogs import (
    BackupDialog,
    ExportDialog,
    ImportDialog,
)
from convmem_app.hosts import Env
from convmem_engine.service import MemoryService
from convmem_engine.transfer import list_backups

pytestmark = pytest.mark.gui


@pytest.fixture
def runner(qtbot: Any) -> Any:
    r = JobRunner(max_threads=2)
    yield r
    r.shutdown(30_000)


def test_welcome_page_adds_and_removes_a_host(
    qtbot: Any, runner: JobRunner, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    (home / ".cursor").mkdir(parents=True)
    (home / ".cursor" / "mcp.json").write_text('{\n  "mcpServers": {}\n}\n', encoding="utf-8")
    env = Env(home, {"PATH": ""}, "linux")
    setup = HostSetup(tmp_path / "data", runner, env_factory=lambda: env)
    page = WelcomePage(setup)
    qtbot.addWidget(page)
    page.show()
    with qtbot.waitSignal(setup.refreshed, timeout=10_000):
        setup.refresh()
    assert setup.state_labels["cursor"].text() == "Not configured"
    assert setup.buttons["cursor"].isEnabled()
    assert not setup.buttons["windsurf"].isEnabled()  # not installed
    assert setup.state_labels["windsurf"].text().startswith("Not found on this computer.")
    with qtbot.waitSignal(setup.changed, timeout=10_000) as changed:
        qtbot.mouseClick(setup.buttons["cursor"], Qt.MouseButton.LeftButton)
    assert "Restart Cursor" in changed.args[1]
    qtbot.waitUntil(lambda: setup.state_labels["cursor"].text() == "✓ Configured", timeout=10_000)
    data = json.loads((home / ".cursor" / "mcp.json").read_text(encoding="utf-8"))
    assert data["mcpServers"]["convmem"]["args"][-1] == str(tmp_path / "data")
    assert setup.remove_buttons["cursor"].isVisible()
    with qtbot.waitSignal(setup.changed, timeout=10_000):
        qtbot.mouseClick(setup.remove_buttons["cursor"], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: setup.state_labels["cursor"].text() == "Not configured", timeout=10_000)
    (home / ".cursor" / "mcp.json").write_text("{oops", encoding="utf-8")
    with qtbot.waitSignal(setup.refreshed, timeout=10_000):
        setup.refresh()
    assert "does not parse" in setup.state_labels["cursor"].text()
    assert "line 1, column 2" in setup.state_labels["cursor"].toolTip()


def test_import_dialog_dry_run_then_import(
    qtbot: Any, runner: JobRunner, service: MemoryService, tmp_path: Path
) -> None:
    src = tmp_path / "conversations.json"
    write_json(src, chatgpt_export(6, 5))
    dialog = ImportDialog(service, runner)
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.path.setText(str(src))
    assert not dialog.import_button.isEnabled()
    with qtbot.waitSignal(dialog.checked, timeout=30_000):
        qtbot.mouseClick(dialog.check_button, Qt.MouseButton.LeftButton)
    assert dialog.status.text().startswith("chatgpt: 30 messages in 6 conversations would be")
    assert "not on the conversation's current branch" in dialog.problems.toPlainText()
    assert service.get_system_health()["active_messages"] == 0
    with qtbot.waitSignal(dialog.imported, timeout=30_000):
        qtbot.mouseClick(dialog.import_button, Qt.MouseButton.LeftButton)
    assert dialog.status.text().startswith("Stored 30 messages in 6 conversations")
    assert service.get_system_health()["active_messages"] == 30
    bad = tmp_path / "bad.txt"
    bad.write_text("hello", encoding="utf-8")
    dialog.path.setText(str(bad))
    job = dialog.dry_run()
    qtbot.waitUntil(lambda: job.done, timeout=30_000)
    assert dialog.status.text().startswith("Failed: bad.txt: not a format")


def test_export_dialog_search_results_and_session(
    qtbot: Any, runner: JobRunner, service: MemoryService, tmp_path: Path
) -> None:
    for i in range(5):
        service.write_message(session_id=f"s{i % 2}", role="user", content=f"tram {i}")
    results = service.search_messages(query="tram", limit=3)["results"]
    dialog = ExportDialog(service, runner, session_id="s1", results=results)
    qtbot.addWidget(dialog)
    dialog.scope.setCurrentIndex(2)
    dialog.path.setText(str(tmp_path / "results.jsonl"))
    with qtbot.waitSignal(dialog.exported, timeout=30_000) as done:
        qtbot.mouseClick(dialog.export_button, Qt.MouseButton.LeftButton)
    assert done.args[0].messages == 3
    lines = (tmp_path / "results.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 4 and "score" in json.loads(lines[1])
    dialog.scope.setCurrentIndex(1)
    dialog.format.setCurrentIndex(1)
    dialog.path.setText(str(tmp_path / "md"))
    with qtbot.waitSignal(dialog.exported, timeout=30_000) as done:
        dialog.run()
    assert done.args[0].messages == 2 and len(os.listdir(tmp_path / "md")) == 1


def test_backup_dialog_backs_up_verifies_and_restores(
    qtbot: Any, runner: JobRunner, service: MemoryService, settings: QSettings, tmp_path: Path
) -> None:
    service.write_message(session_id="s", role="user", content="keep me safe")
    sched = BackupScheduler(str(tmp_path / "data"), settings)
    dialog = BackupDialog(tmp_path / "data", sched, runner)
    qtbot.addWidget(dialog)
    dialog.show()
    assert dialog.backups.count() == 0
    with qtbot.waitSignal(dialog.backupMade, timeout=60_000):
        qtbot.mouseClick(dialog.backup_button, Qt.MouseButton.LeftButton)
    assert "1 messages, verified" in dialog.last.text()
    assert dialog.open_button.isEnabled()
    assert dialog.backups.count() == 1
    assert "convmem restore --in-place" in dialog.in_place.text()
    with qtbot.waitSignal(dialog.verified, timeout=60_000):
        qtbot.mouseClick(dialog.verify_button, Qt.MouseButton.LeftButton)
    assert dialog.status.text() == "Backup OK: 1 messages in 1 sessions."
    with qtbot.waitSignal(dialog.restored, timeout=60_000):
        dialog.restore_into(str(tmp_path / "restored"))
    with MemoryService.open(tmp_path / "restored") as copy:
        assert copy.get_system_health()["active_messages"] == 1
    dialog.keep.setValue(3)
    assert sched.keep == 3
    dialog.enabled.setChecked(False)
    assert not sched.enabled
    assert len(list_backups(sched.folder)) == 1
    sched.stop()


# -- attached to the memory browser ------------------------------------------------------------

from gui_helpers import select_history_rows, select_session, stored, write  # noqa: E402

from convmem_app.browser.portability import Portability  # noqa: E402
from convmem_engine.runtime.activity import ActivityLog  # noqa: E402


def _attach(b: Any, tmp_path: Path, **kw: Any) -> Portability:
    env = Env(tmp_path / "home", {"PATH": ""}, "linux")
    return Portability(b, data_dir=tmp_path / "data", env_factory=lambda: env, **kw)


def test_welcome_page_while_the_store_is_empty(
    qtbot: Any, service: MemoryService, make_browser: Any, tmp_path: Path
) -> None:
    b = make_browser()
    p = _attach(b, tmp_path)
    qtbot.waitUntil(lambda: p.showing_welcome, timeout=10_000)
    assert p.welcome.isVisible()
    assert [b.tabs.tabText(i) for i in range(b.tabs.count())] == [
        "&Browse",
        "Sea&rch",
        "&Maintenance",
        "&Hosts",
    ]
    write(service, "first", "remember that I like trams")
    qtbot.waitUntil(lambda: not p.showing_welcome, timeout=10_000)
    assert b.browse.isVisible()
    p.stop()


def test_bulk_change_from_the_history_and_undo(
    qtbot: Any, service: MemoryService, make_browser: Any, tmp_path: Path
) -> None:
    ids = [write(service, "s", f"m{i}", tags=["old"])["message_id"] for i in range(4)]
    b = make_browser()
    p = _attach(b, tmp_path)
    select_session(qtbot, b, "s")
    select_history_rows(b, 0, 2, 3)
    targets = p.targets()
    assert [t.message_id for t in targets] == [ids[0], ids[2], ids[3]]
    service.update_message(message_id=ids[3], content="a host edited this meanwhile")
    dialog = p.open_bulk()
    assert dialog is not None
    dialog.tier.setCurrentText("long")
    dialog.add_tags.setText("trip, lisbon")
    dialog.remove_tags.setText("old")
    with qtbot.waitSignal(p.bulkDone, timeout=10_000) as done:
        dialog.accept()
    result = done.args[0]
    assert (result.changed, result.conflicts) == ([ids[0], ids[2]], [ids[3]])
    assert "1 changed by another client meanwhile" in b.status_text.text()
    assert stored(service, ids[0])["metadata"]["tags"] == ["trip", "lisbon"]
    assert stored(service, ids[0])["metadata"]["memory_tier"] == "long"
    assert stored(service, ids[3])["metadata"]["tags"] == ["old"]
    assert p.act_undo.isEnabled()
    with qtbot.waitSignal(p.undoDone, timeout=10_000):
        p.act_undo.trigger()
    assert stored(service, ids[0])["metadata"]["tags"] == ["old"]
    assert stored(service, ids[0])["metadata"]["memory_tier"] == "short"
    assert not p.act_undo.isEnabled()
    p.stop()


def test_hosts_tab_shows_the_activity_and_opens_a_message(
    qtbot: Any, service: MemoryService, make_browser: Any, tmp_path: Path
) -> None:
    feed = ActivityLog(service)
    b = make_browser()
    p = _attach(b, tmp_path, activity=feed, clients=list)
    b.tabs.setCurrentWidget(p.hosts_page)
    assert p.hosts_page.empty_clients.isVisible()
    msg = write(service, "s", "remember the tram")
    qtbot.waitUntil(lambda: p.hosts_page.feed.count() == 1, timeout=10_000)
    item = p.hosts_page.feed.item(0)
    assert f"this app wrote {msg['message_id']} in s" in item.text()
    with qtbot.waitSignal(b.messageOpened, timeout=10_000):
        p.hosts_page.feed.itemClicked.emit(item)
    assert b.browse.current_message() is not None
    p.stop()
    feed.close()


def test_the_activity_feed_follows_only_while_shown_and_catches_up(
    qtbot: Any, service: MemoryService, make_browser: Any, tmp_path: Path
) -> None:
    """The feed takes the log's entries only while its tab is shown (in a window shown and not
    minimized); shown again it catches up from the log: every change once, newest first."""
    feed = ActivityLog(service)
    b = make_browser()
    p = _attach(b, tmp_path, activity=feed, clients=list)
    hosts = p.hosts_page
    ids = [write(service, "s", "before the tab was ever shown")["message_id"]]
    assert not hosts.following and hosts.feed.count() == 0  # another tab is current
    b.tabs.setCurrentWidget(hosts)
    assert hosts.following

    def shown() -> list[str]:
        return [
            hosts.feed.item(i).data(Qt.ItemDataRole.UserRole)[0] for i in range(hosts.feed.count())
        ]

    assert shown() == ids  # caught up at once
    ids.append(write(service, "s", "live")["message_id"])
    qtbot.waitUntil(lambda: shown() == ids[::-1], timeout=10_000)
    b.tabs.setCurrentWidget(p.browse_stack)
    assert not hosts.following
    ids += [write(service, "t", f"while on another tab {i}")["message_id"] for i in range(3)]
    b.tabs.setCurrentWidget(hosts)
    assert shown() == ids[::-1]
    b.showMinimized()
    qtbot.waitUntil(lambda: not hosts.following)
    ids.append(write(service, "t", "while minimized")["message_id"])
    qtbot.wait(300)  # longer than the inbox's interval: nothing arrives
    assert shown() == ids[-2::-1]
    b.showNormal()
    qtbot.waitUntil(lambda: hosts.following)
    assert shown() == ids[::-1]
    qtbot.wait(300)  # and no batch of the earlier subscription shows twice
    assert shown() == ids[::-1]
    p.stop()
    assert not hosts.following
    feed.close()
