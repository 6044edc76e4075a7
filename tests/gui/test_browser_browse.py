"""Sessions list, history paging, message detail, window state, shortcuts, palette."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from gui_helpers import (
    delete_confirmation,
    history_ids,
    select_history_rows,
    select_session,
    update,
    write,
)
from PySide6.QtCore import QModelIndex, QSettings, Qt, QThread
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication

from convmem_app.browser import theme
from convmem_app.browser.browse_panel import DETAIL_EDIT
from convmem_app.browser.history_model import INLINE_CHARS, HistoryModel
from convmem_app.browser.jobs import JobRunner
from convmem_app.browser.sessions_model import COL_COUNT, COL_KINDS, SessionsModel
from convmem_engine.service import MemoryService

pytestmark = pytest.mark.gui


def test_sessions_show_counts_kinds_summary_and_times(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    write(service, "alpha", "first note about databases")
    write(service, "alpha", "we chose sqlite", memory_kind="semantic", summary="decided on sqlite")
    write(service, "beta", "hello there")
    b = make_browser()
    qtbot.waitUntil(
        lambda: b.browse.sessions_model.rowCount() == 2 and b.browse.sessions_model.exhausted
    )
    row = b.browse.sessions_model.row_of("alpha")
    model = b.browse.sessions_model
    assert model.index(row, COL_COUNT).data() == 2
    assert model.index(row, COL_KINDS).data() == "conv 1 · sem 1"
    assert "semantic: 1" in model.index(row, COL_KINDS).data(Qt.ItemDataRole.ToolTipRole)
    entry = model.row_data(row)
    assert model.index(row, 3).data() == entry["representative_summary"]
    assert model.index(row, 4).data() and model.index(row, 5).data()
    assert b.browse.sessions_label.text() == "Sessions (2)"


def test_sessions_filter_and_sort_see_every_session(
    qtbot: Any, service: MemoryService, make_browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(SessionsModel, "PAGE_SIZE", 2)
    monkeypatch.setattr(SessionsModel, "BULK_PAGE_SIZE", 2)
    for i, name in enumerate(("project-x", "holiday", "misc-1", "misc-2", "project-y")):
        for _ in range(i + 1):
            write(service, name, f"message in {name}")
    b = make_browser()
    qtbot.waitUntil(
        lambda: b.browse.sessions_model.rowCount() >= 2 and not b.browse.sessions_model.loading
    )
    b.browse.session_filter.setText("PROJECT")  # filtering loads the remaining pages first
    proxy = b.browse.sessions_proxy
    qtbot.waitUntil(lambda: b.browse.sessions_model.exhausted and proxy.rowCount() == 2)
    assert {proxy.index(r, 0).data() for r in range(2)} == {"project-x", "project-y"}
    b.browse.session_filter.clear()
    b.browse.sessions_view.sortByColumn(COL_COUNT, Qt.SortOrder.DescendingOrder)
    assert [proxy.index(r, 0).data() for r in range(5)] == [
        "project-y",
        "misc-2",
        "misc-1",
        "holiday",
        "project-x",
    ]


def test_select_session_shows_history_rows(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    written = [
        write(service, "s1", "question one"),
        write(service, "s1", "answer one", role="assistant", tags=["a", "b"], importance=80),
    ]
    write(service, "s2", "elsewhere")
    b = make_browser()
    select_session(qtbot, b, "s1")
    assert history_ids(b) == [m["message_id"] for m in written]
    m = b.browse.history_model
    assert [m.index(1, c).data() for c in range(1, 7)] == [
        "assistant",
        "conversation",
        "short",
        80,
        "a, b",
        "answer one",
    ]
    assert m.index(1, 0).data()  # time
    assert "s1 (2 messages)" in b.browse.history_label.text()


def _load_all(qtbot: Any, model: Any) -> None:
    """Page to the end as a scrolling view would (fetchMore while canFetchMore)."""
    while not model.exhausted:
        qtbot.waitUntil(lambda: not model.loading)
        if model.canFetchMore(QModelIndex()):
            model.fetchMore(QModelIndex())


def test_sessions_and_history_load_page_by_page(
    qtbot: Any, service: MemoryService, make_browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(SessionsModel, "PAGE_SIZE", 4)
    monkeypatch.setattr(HistoryModel, "PAGE_SIZE", 5)
    for s in range(10):
        write(service, f"session-{s:02}", "x")
    ids = [write(service, "big", f"message {i}")["message_id"] for i in range(12)]
    b = make_browser()
    sessions = b.browse.sessions_model
    pages: list[int] = []
    sessions.pageLoaded.connect(pages.append)
    _load_all(qtbot, sessions)
    assert pages == [4, 8, 11]  # one page of 4 at a time, from the sessions view's cursors
    assert b.browse.sessions_label.text() == "Sessions (11)"
    select_session(qtbot, b, "big")
    history = b.browse.history_model
    assert history.rowCount() in (5, 10)  # the first page, or two if the view asked to fill up
    _load_all(qtbot, history)
    assert history_ids(b) == ids
    assert not history.canFetchMore(QModelIndex())


def test_detail_shows_fields_and_loads_large_content_in_chunks(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    big = ("Grüße aus Köln — " * 20_000)[:300_000]  # multi-byte text over several chunks
    msg = write(service, "s", big, tags=["long"], summary="a long one", importance=7)
    b = make_browser()
    select_session(qtbot, b, "s")
    assert len(b.browse.history_model.row_data(0)["content"]) == INLINE_CHARS  # rows keep a prefix
    with qtbot.waitSignal(b.browse.detail.contentLoaded, timeout=10_000) as loaded:
        select_history_rows(b, 0)
    assert loaded.args == [msg["message_id"]]
    assert b.browse.detail.content.toPlainText() == big
    total = len(big.encode("utf-8"))
    assert b.browse.detail.progress.maximum() == total and b.browse.detail.progress.value() == total
    assert b.browse.detail.fields["tags"].text() == "long"
    assert b.browse.detail.fields["summary"].text() == "a long one"
    assert b.browse.detail.fields["importance"].text() == "7"
    assert "revision 1" in b.browse.detail.header.text()


def test_window_state_is_remembered(
    qtbot: Any, service: MemoryService, settings: QSettings, make_browser: Any
) -> None:
    write(service, "s", "x")
    b = make_browser()
    b.resize(700, 560)
    b.show_page("maintenance")
    b.close()
    assert settings.value("browser/geometry") is not None
    again = make_browser()
    assert again.size().width() == 700 and again.size().height() == 560
    assert again.current_page().name == "maintenance"


def test_keyboard_shortcuts(qtbot: Any, service: MemoryService, make_browser: Any) -> None:
    write(service, "s", "one")
    write(service, "s", "two")
    b = make_browser()
    b.activateWindow()
    select_session(qtbot, b, "s")
    qtbot.keyClick(b, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    assert b.current_page().name == "search"
    qtbot.keyClick(b, Qt.Key.Key_L, Qt.KeyboardModifier.ControlModifier)
    assert b.current_page().name == "browse"
    select_history_rows(b, 0, 1)
    b.browse.history_view.setFocus()
    delete_confirmation(
        qtbot, b, lambda: qtbot.keyClick(b.browse.history_view, Qt.Key.Key_Delete)
    ).reject()
    write(service, "t", "three")
    qtbot.keyClick(b, Qt.Key.Key_F5)
    qtbot.waitUntil(lambda: b.browse.sessions_model.row_of("t") >= 0)


def test_palette_follows_colour_scheme(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    b = make_browser()
    b.apply_color_scheme(Qt.ColorScheme.Dark)
    assert theme.is_dark(b.palette())
    assert b.palette().color(QPalette.ColorRole.Window) == theme.dark_palette().color(
        QPalette.ColorRole.Window
    )
    b.apply_color_scheme(Qt.ColorScheme.Light)
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    assert theme.is_dark(b.palette()) == theme.is_dark(app.palette())


def test_jobs_report_on_the_gui_thread(qtbot: Any) -> None:
    runner = JobRunner()
    threads: list[object] = []
    gui = QThread.currentThread()

    def work(job: Any) -> object:
        job.report(1, 2)
        return QThread.currentThread()

    job_obj = runner.run(work)
    job_obj.progress.connect(lambda d, t: threads.append(QThread.currentThread()))
    with qtbot.waitSignal(job_obj.succeeded) as done:
        pass
    assert done.args[0] is not gui  # the work ran on a pool thread
    assert all(t is gui for t in threads)
    runner.wait()


def test_runner_shutdown_drops_queued_jobs_and_stops_the_running_one(qtbot: Any) -> None:
    runner = JobRunner(max_threads=1)
    started = threading.Event()
    ran: list[int] = []

    def running(job: Any) -> str:
        started.set()
        while not job.cancelled:  # a long read that checks for cancellation
            time.sleep(0.005)
        return "stopped"

    first = runner.run(running)
    for i in range(5):
        runner.run(lambda _job, i=i: ran.append(i))
    assert started.wait(30)
    with qtbot.waitSignal(first.succeeded) as stopped:
        assert runner.shutdown(30_000)
    assert stopped.args == ["stopped"]
    assert ran == []  # queued behind it: never run against a store about to close


def test_closed_window_catches_up_when_shown_again(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    write(service, "s", "one")
    b = make_browser()
    select_session(qtbot, b, "s")
    b.close()
    assert not b.bridge.active  # a hidden window does not follow the service
    write(service, "s", "two")
    write(service, "new-session", "three")
    b.show()
    assert b.bridge.active
    qtbot.waitUntil(lambda: b.browse.sessions_model.row_of("new-session") >= 0)
    qtbot.waitUntil(lambda: b.browse.history_model.rowCount() == 2)


@pytest.mark.parametrize("away", ["hidden", "minimized"])
def test_a_window_out_of_sight_does_not_follow_and_catches_up_when_shown(
    qtbot: Any, service: MemoryService, make_browser: Any, away: str
) -> None:
    """Hidden (closed to the tray) or minimized, the window takes no change events (hosts
    writing cost the GUI nothing); shown again it shows what changed meanwhile: new sessions
    and messages, an open message changed by a host, and one deleted."""
    first = write(service, "s", "one")
    write(service, "s", "other")
    b = make_browser()
    select_session(qtbot, b, "s")
    select_history_rows(b, 0)
    b.browse.detail_tabs.setCurrentIndex(DETAIL_EDIT)
    qtbot.waitUntil(lambda: b.browse.editor.message is not None)
    assert b.browse.editor.message["message_id"] == first["message_id"]
    changes: list[object] = []
    b.bridge.listen(changes.extend)
    if away == "hidden":
        b.hide()
    else:
        b.showMinimized()
        qtbot.waitUntil(lambda: b.isMinimized())
    assert not b.following
    write(service, "s", "two")
    write(service, "new-session", "three")
    update(service, first["message_id"], '{"tags": ["while-away"]}')
    qtbot.wait(300)  # longer than the change bridge's batch interval
    assert changes == []  # nothing was carried over to the GUI thread
    assert b.browse.sessions_model.row_of("new-session") < 0
    b.showNormal()
    assert b.following
    qtbot.waitUntil(lambda: b.browse.sessions_model.row_of("new-session") >= 0)
    qtbot.waitUntil(lambda: b.browse.history_model.rowCount() == 3)
    qtbot.waitUntil(lambda: b.browse.editor.message["revision"] == 2)
    assert b.browse.editor.message["metadata"]["tags"] == ["while-away"]
    # live again
    write(service, "s", "four")
    qtbot.waitUntil(lambda: b.browse.history_model.rowCount() == 4)
    # deleted while away: gone from the history and the editor when shown
    b.hide()
    service.delete_message(message_id=first["message_id"])
    b.show()
    qtbot.waitUntil(lambda: b.browse.history_model.rowCount() == 3)
    assert first["message_id"] not in history_ids(b)
    edited = b.browse.editor.message
    assert edited is None or edited["message_id"] != first["message_id"]


def test_a_burst_of_changes_reaches_the_window_as_one_batch_and_all_of_it_shows(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    """Hosts writing while the GUI thread is busy: what changed meanwhile reaches the pages as
    one batch (one call), and the window shows all of it: the new messages of the open
    session in order, those of other sessions in the list, a host's update of a shown message
    and a deletion."""
    first = write(service, "chat", "one")
    doomed = write(service, "chat", "two")
    b = make_browser()
    select_session(qtbot, b, "chat")
    batches: list[int] = []
    b.bridge.listen(lambda events: batches.append(len(events)))
    new: list[str] = []

    def hosts() -> None:
        for i in range(40):
            new.append(write(service, "chat", f"burst {i}")["message_id"])
            write(service, f"other-{i % 4}", f"elsewhere {i}")
        update(service, first["message_id"], '{"tags": ["burst"]}')
        service.delete_message(message_id=doomed["message_id"])

    thread = threading.Thread(target=hosts)
    thread.start()
    thread.join()  # the GUI thread waits meanwhile: everything comes in one batch
    qtbot.waitUntil(lambda: history_ids(b) == [first["message_id"], *new])
    qtbot.waitUntil(lambda: b.browse.history_model.index(0, 5).data() == "burst")
    sessions = b.browse.sessions_model
    qtbot.waitUntil(lambda: all(sessions.row_of(f"other-{k}") >= 0 for k in range(4)))
    qtbot.waitUntil(lambda: sessions.row_data(sessions.row_of("chat"))["message_count"] == 41)
    assert batches == [82]  # 80 writes, an update and a delete: one batch
    assert b.browse.history_label.text() == "History of chat (41 messages)"
