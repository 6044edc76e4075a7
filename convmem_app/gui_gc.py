"""Python's cyclic garbage collector runs on the GUI thread only.

CPython collects on whichever thread allocates when a generation's count passes its threshold.
In the app that is as often an engine thread (the writer, the agent, MCP and HTTP workers, the
browser's job pool) as the GUI thread. When such a collection frees a cycle holding a Qt object
that Python owns (a closed window or dialog, a model, a job), its C++ side is destroyed from a
thread it does not live in. PySide defers that for widgets (it queues the deletion for the main
thread) but its queue is not safe against a destructor that lets another thread run: the test
suite crashed there, in `Shiboken::BindingManager::runDeletionInMainThread` (PySide6 6.11.3),
every time tests/agent, tests/app and tests/gui ran in one process. Other QObjects are deleted
on the spot, on the wrong thread.

So `collect_on_gui_thread` switches automatic collection off and collects from a timer on the
GUI thread instead, generation by generation with the interpreter's own thresholds (a full
collection at most every `FULL_SPACING` times the last one's duration, as the interpreter
bounds them by the heap's growth). Explicit `gc.collect()` calls still work anywhere.

The timer looks every `INTERVAL_MS` while there is something to collect and backs off, doubling,
to `IDLE_INTERVAL_MS` while there is not: a tray app idle all day wakes every few seconds for
it, not twice a second (the idle app's CPU was twice that of the app without the collector).
"""

from __future__ import annotations

import gc
import time
from typing import Final

from PySide6.QtCore import QCoreApplication, QObject, QTimer

INTERVAL_MS: Final = 500
"""How often the GUI thread looks at the collector's counts while collections are due."""

IDLE_INTERVAL_MS: Final = 4000
"""The longest wait between two looks, reached by doubling while nothing was due (cyclic
garbage made by a burst waits at most this long)."""

FULL_SPACING: Final = 20
"""A full collection waits this many times the last one's duration after it (at most ~5% of
the GUI thread's time goes to them)."""


class GuiThreadCollector(QObject):
    """Collects garbage on its own (the GUI) thread; see the module doc."""

    def __init__(
        self,
        parent: QObject,
        interval_ms: int = INTERVAL_MS,
        idle_interval_ms: int = IDLE_INTERVAL_MS,
    ) -> None:
        super().__init__(parent)
        self._next_full = 0.0
        self._interval_ms = interval_ms
        self._idle_interval_ms = max(interval_ms, idle_interval_ms)
        gc.disable()
        self._timer = QTimer(self)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self.collect_due)
        self._timer.start()

    def interval_ms(self) -> int:
        """The timer's current wait between two looks."""
        return self._timer.interval()

    def collect_due(self) -> int:
        """Collect the oldest generation whose count passed its threshold, as the interpreter
        would have on its own; returns that generation, or -1 when none was due. The next look
        comes sooner when one was due, later (up to the idle interval) when none was."""
        if gc.isenabled():  # someone switched it back on (say a pause that ended): off again
            gc.disable()
        counts, thresholds = gc.get_count(), gc.get_threshold()
        if thresholds[0] == 0 or counts[0] <= thresholds[0]:
            wait = min(self._timer.interval() * 2, self._idle_interval_ms)
            if wait != self._timer.interval():
                self._timer.setInterval(wait)  # takes effect from the next timeout on
            return -1
        if self._timer.interval() != self._interval_ms:
            self._timer.setInterval(self._interval_ms)
        generation = 0
        if counts[1] > thresholds[1]:
            generation = 1
            if counts[2] > thresholds[2] and time.monotonic() >= self._next_full:
                generation = 2
        started = time.monotonic()
        gc.collect(generation)
        if generation == 2:
            ended = time.monotonic()
            self._next_full = ended + FULL_SPACING * (ended - started)
        return generation


def collect_on_gui_thread(app: QCoreApplication) -> GuiThreadCollector:
    """Install the collector on `app`'s thread (once; later calls return the same one). Call
    it before starting any thread that runs Python code."""
    existing = app.findChild(GuiThreadCollector)
    if isinstance(existing, GuiThreadCollector):
        return existing
    return GuiThreadCollector(app)
