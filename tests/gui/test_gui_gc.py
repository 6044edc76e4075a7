"""The cyclic garbage collector runs on the GUI thread only (convmem_app.gui_gc): a window
left in a reference cycle is freed there, however much other threads allocate."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import pytest
from PySide6.QtCore import QObject
from PySide6.QtWidgets import QApplication, QWidget

from convmem_app.gui_gc import GuiThreadCollector, collect_on_gui_thread

pytestmark = pytest.mark.gui


class _Node:
    def __init__(self) -> None:
        self.me = self


def _allocate_cycles(n: int) -> None:
    for _ in range(n):
        _Node()


def test_a_window_in_a_cycle_is_freed_on_the_gui_thread(qtbot: Any) -> None:
    """Before, the collection that found such a window ran on whichever thread allocated past
    the threshold (here a worker making cycles, in the app an engine thread): the window was
    freed there, which crashed PySide's deferred deletion."""
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    collector = collect_on_gui_thread(app)  # what the app's main and the tests' conftest do
    assert collect_on_gui_thread(app) is collector
    assert not gc.isenabled()
    freed_on: list[threading.Thread] = []
    for _ in range(5):
        window = QWidget()
        window.cycle = window  # type: ignore[attr-defined]
        weakref.finalize(window, lambda: freed_on.append(threading.current_thread()))
        del window
    workers = [threading.Thread(target=_allocate_cycles, args=(50_000,)) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert freed_on == []  # the workers passed every threshold many times: nothing collected
    # the collector's timer on the GUI thread (it may be backed off to its idle interval)
    qtbot.waitUntil(lambda: len(freed_on) == 5, timeout=20_000)
    assert set(freed_on) == {threading.main_thread()}


def test_collect_due_follows_the_interpreters_thresholds(qtbot: Any) -> None:
    owner = QObject()
    collector = GuiThreadCollector(owner, interval_ms=60_000)
    gc.collect()
    assert collector.collect_due() == -1  # nothing allocated since: nothing due
    _allocate_cycles(gc.get_threshold()[0] + 10)
    assert collector.collect_due() == 0
    assert gc.get_count()[0] < gc.get_threshold()[0]
    gc.enable()  # say an engine's pause re-enabled it: the next look turns it off again
    collector.collect_due()
    assert not gc.isenabled()


def test_the_timer_backs_off_while_nothing_is_due_and_comes_back_when_something_is(
    qtbot: Any,
) -> None:
    """An idle tray app should not wake twice a second for nothing: the wait doubles up to the
    idle interval while no collection is due, and drops back at the first one that is."""
    owner = QObject()
    collector = GuiThreadCollector(owner, interval_ms=500, idle_interval_ms=4000)
    gc.collect()
    waits = []
    for _ in range(5):
        assert collector.collect_due() == -1
        waits.append(collector.interval_ms())
    assert waits == [1000, 2000, 4000, 4000, 4000]
    _allocate_cycles(gc.get_threshold()[0] + 10)
    assert collector.collect_due() == 0
    assert collector.interval_ms() == 500
