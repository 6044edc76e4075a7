"""`convmem_app.inbox.Inbox`: what writer threads put reaches the GUI thread whole, in order,
in batches, with one cross-thread signal per batch (not per item); and the memory browser's
change bridge built on it still delivers every change event."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from PySide6.QtCore import QCoreApplication, QObject, Qt, QThread

from convmem_app.browser.changes import ChangeBridge
from convmem_app.inbox import Inbox
from convmem_engine.service import ChangeEvent, MemoryService

pytestmark = pytest.mark.gui

LONG = 600_000  # an interval no test waits for: the timer fires only when a test says so


class _Batches:
    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.threads: set[object] = set()

    def __call__(self, items: list[int]) -> None:
        self.threads.add(QThread.currentThread())
        self.batches.append(items)

    @property
    def items(self) -> list[int]:
        return [i for batch in self.batches for i in batch]


def _put_from_a_thread(inbox: Inbox[int], items: range) -> None:
    def run() -> None:
        for i in items:
            inbox.put(i)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()


def _count_wakes(inbox: Inbox[int]) -> list[int]:
    wakes: list[int] = []
    # a direct connection runs in the putting thread: it counts every signal sent over
    inbox._signals.wake.connect(lambda: wakes.append(1), Qt.ConnectionType.DirectConnection)
    return wakes


def test_a_stream_of_items_costs_one_signal_and_arrives_whole_in_order(qtbot: Any) -> None:
    parent = QObject()
    got = _Batches()
    inbox: Inbox[int] = Inbox(got, parent, interval_ms=LONG)
    wakes = _count_wakes(inbox)
    _put_from_a_thread(inbox, range(1000))
    assert len(wakes) == 1  # only the first item after a quiet spell wakes the GUI thread
    QCoreApplication.processEvents()
    assert got.items == list(range(1000))  # everything put before the wake was handled
    assert got.threads == {QThread.currentThread()}  # delivered on the GUI thread
    assert inbox._timer.isActive()  # it looks again after an interval
    _put_from_a_thread(inbox, range(1000, 1500))
    QCoreApplication.processEvents()
    assert len(wakes) == 1 and len(got.batches) == 1  # still armed: no signal, no delivery
    inbox._timer.timeout.emit()  # the interval is over: the next look finds 500 more
    assert got.batches[1] == list(range(1000, 1500))
    assert inbox._timer.isActive()
    inbox._timer.stop()
    inbox.take()  # a look that finds nothing: quiet again
    _put_from_a_thread(inbox, range(1500, 1501))
    assert len(wakes) == 2  # the first item after the quiet spell wakes it at once
    QCoreApplication.processEvents()
    assert got.items == list(range(1501))


def test_the_timer_delivers_what_comes_while_armed_then_goes_quiet(qtbot: Any) -> None:
    parent = QObject()
    got = _Batches()
    inbox: Inbox[int] = Inbox(got, parent, interval_ms=20)
    wakes = _count_wakes(inbox)
    _put_from_a_thread(inbox, range(5))
    qtbot.waitUntil(lambda: got.items == list(range(5)), timeout=10_000)
    _put_from_a_thread(inbox, range(5, 10))  # while armed: delivered by the timer
    qtbot.waitUntil(lambda: got.items == list(range(10)), timeout=10_000)
    qtbot.waitUntil(lambda: not inbox._timer.isActive(), timeout=10_000)  # found nothing: quiet
    assert len(wakes) == 1
    _put_from_a_thread(inbox, range(10, 11))
    qtbot.waitUntil(lambda: got.items == list(range(11)), timeout=10_000)
    assert len(wakes) == 2


def test_many_writer_threads_lose_nothing(qtbot: Any) -> None:
    parent = QObject()
    got = _Batches()
    inbox: Inbox[int] = Inbox(got, parent, interval_ms=5)

    def put(k: int) -> None:
        for i in range(500):
            inbox.put(k * 1000 + i)

    threads = [threading.Thread(target=put, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    qtbot.waitUntil(lambda: len(got.items) == 4000, timeout=30_000)  # while they still put
    for thread in threads:
        thread.join()
    assert sorted(got.items) == sorted(k * 1000 + i for k in range(8) for i in range(500))
    for k in range(8):  # each thread's items in the order it put them
        mine = [i for i in got.items if i // 1000 == k]
        assert mine == sorted(mine)


def test_the_change_bridge_carries_every_event_of_writer_threads_in_order(
    qtbot: Any, service: MemoryService
) -> None:
    owner = QObject()  # freed on this thread when the test ends, its bridge with it
    bridge = ChangeBridge(service, owner)
    seen: list[tuple[str, object, object]] = []
    batches: list[int] = []

    def changes(events: list[ChangeEvent]) -> None:
        batches.append(len(events))
        seen.extend((e.kind, e.message_id, e.session_id) for e in events)

    bridge.listen(changes)
    bridge.start()
    written: list[str] = []

    def write() -> None:
        for i in range(50):
            result = service.write_message(session_id=f"s{i % 3}", role="user", content=f"n{i}")
            written.append(result["message"]["message_id"])

    thread = threading.Thread(target=write)
    thread.start()
    thread.join()
    qtbot.waitUntil(lambda: len(seen) == 50, timeout=30_000)
    assert [mid for _kind, mid, _sid in seen] == written
    assert {kind for kind, _mid, _sid in seen} == {"write"}
    assert [sid for _kind, _mid, sid in seen] == [f"s{i % 3}" for i in range(50)]
    assert batches == [50]  # all came while the GUI thread was busy: one batch
    bridge.stop()
    service.write_message(session_id="s0", role="user", content="after stop")
    qtbot.wait(50)
    QCoreApplication.processEvents()
    assert len(seen) == 50  # a stopped bridge follows nothing
