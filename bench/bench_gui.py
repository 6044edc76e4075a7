"""Memory browser benchmark on the whole chitchat-dataset corpus (258,145 messages).

Measures, on a store holding the corpus:
- opening the window until the first page of sessions is on screen;
- selecting a session until its first history page is shown;
- a search until its results are shown;
- the longest stall of the GUI thread (QTimer heartbeat every 5 ms) while the window opens, while
  it pages, and during a rebuild_index (target: no stall over 100 ms), then the same rebuild with
  the heap never frozen (the service's gc.freeze() a no-op) as its peer.
Each GUI figure is printed next to its peer: the same MemoryService call made directly in the same
process, so the ratio is the browser's own overhead.

Usage: python bench/bench_gui.py [--dir DIR] [--messages N]   (offscreen unless QT_QPA_PLATFORM set)
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from corpus import load_corpus
from PySide6.QtCore import QEventLoop, QSettings, QTimer, SignalInstance
from PySide6.QtWidgets import QApplication
from ulid import ULID

from convmem_app.browser import MemoryBrowser
from convmem_app.browser.maintenance_panel import MaintenancePanel
from convmem_app.browser.search_panel import SearchPanel
from convmem_engine.domain import Message
from convmem_engine.service import MemoryService
from convmem_engine.storage import Store

QUERIES = ("pizza", "how are you", "favorite movie", "weekend")


class Heartbeat:
    """Records the gaps between 5 ms timer ticks on the GUI thread: a gap is a stall."""

    def __init__(self) -> None:
        self.timer = QTimer()
        self.timer.setInterval(5)
        self.timer.timeout.connect(self._tick)
        self.gaps: list[float] = []
        self.at: list[float] = []  # when each gap ended, seconds after start()
        self._last = 0.0
        self._t0 = 0.0
        self.gc_pauses: list[tuple[float, float]] = []  # (start s, duration ms), generation 2
        self._gc_start = 0.0
        self.active = False
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2 or not self.active:
            return
        now = time.perf_counter()
        if phase == "start":
            self._gc_start = now
        else:
            self.gc_pauses.append((self._gc_start - self._t0, (now - self._gc_start) * 1000))

    def start(self) -> None:
        self.gaps = []
        self.at = []
        self.gc_pauses = []
        self._last = self._t0 = time.perf_counter()
        self.active = True
        self.timer.start()

    def _tick(self) -> None:
        now = time.perf_counter()
        self.gaps.append(now - self._last)
        self.at.append(now - self._t0)
        self._last = now

    def worst(self) -> str:
        i = max(range(len(self.gaps)), key=self.gaps.__getitem__)
        gcs = ", ".join(f"{d:.0f} ms at {t:.2f} s" for t, d in self.gc_pauses) or "none"
        return f"worst gap ends at {self.at[i]:.2f} s; gen-2 collections: {gcs}"

    def stop(self) -> float:
        self.active = False
        self.timer.stop()
        self._tick()
        return max(self.gaps) * 1000 if self.gaps else 0.0


def wait_for(signal: SignalInstance, timeout_s: float = 120.0) -> list[Any]:
    loop = QEventLoop()
    got: list[Any] = []

    def fire(*args: Any) -> None:
        got.extend(args)
        loop.quit()

    signal.connect(fire)
    QTimer.singleShot(int(timeout_s * 1000), loop.quit)
    loop.exec()
    signal.disconnect(fire)
    return got


def settle(ms: int = 50) -> None:
    """Run the event loop for `ms` (0: until the events pending now, paints included, are done).

    A QEventLoop rather than `processEvents()`: PySide6 6.12.0 dropped a reference to None on
    every `processEvents()` call (see tests/app/test_qt_binding.py)."""
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def shown_after(start: Callable[[], object], shown: SignalInstance) -> float:
    """Milliseconds from `start()` until `shown` fires and the GUI has painted the result."""
    t = time.perf_counter()
    start()
    wait_for(shown)
    settle(0)
    return (time.perf_counter() - t) * 1000


def build_store(data_dir: str, n: int | None) -> int:
    corpus = load_corpus()
    if n is not None:
        corpus = corpus[:n]
    base = 1_700_000_000_000
    store = Store.open(data_dir)
    last = 0
    for i, (session, role, content) in enumerate(corpus):
        ts = base + i * 1000
        last = store.write_put(Message(str(ULID()), session, ts, role, content, 1, ts))
    store.sync(last)
    store.close()
    return len(corpus)


def timed(fn: Callable[[], Any], repeat: int = 3) -> float:
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t)
    return statistics.median(runs) * 1000


def browser_rebuild(
    b: MemoryBrowser, beat: Heartbeat, frozen: bool
) -> tuple[float, float, dict[str, Any]]:
    """Rebuild from the maintenance tab with the heartbeat running: (longest stall ms, rebuild s,
    result). `frozen=False` first thaws the heap and keeps it thawed (gc.freeze a no-op)."""
    freeze = gc.freeze
    if not frozen:
        gc.unfreeze()
        gc.freeze = lambda: None
    try:
        settle(200)
        beat.start()
        t = time.perf_counter()
        b.page_of(MaintenancePanel).rebuild()
        [result] = wait_for(b.page_of(MaintenancePanel).rebuildFinished, 600)
        rebuild_s = time.perf_counter() - t
        settle(1500)  # the health refresh and the sessions refresh the rebuild event triggers
        stall = beat.stop()
    finally:
        gc.freeze = freeze
        gc.freeze()
    label = "browser rebuild" if frozen else "browser rebuild, heap not frozen"
    print(f"{label} (finished at {rebuild_s:.2f} s):", beat.worst(), flush=True)
    return stall, rebuild_s, result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", help="work directory (default: a temp dir)")
    parser.add_argument("--messages", type=int, help="only the first N corpus messages")
    args = parser.parse_args()
    _app = QApplication(sys.argv)
    root = tempfile.mkdtemp(prefix="convmem-bench-gui-", dir=args.dir)
    rows: list[tuple[str, str]] = []
    try:
        data = os.path.join(root, "data")
        t = time.perf_counter()
        count = build_store(data, args.messages)
        rows.append(
            (
                f"build store ({count:,} messages, bulk write_put)",
                f"{time.perf_counter() - t:.1f} s",
            )
        )
        t = time.perf_counter()
        svc = MemoryService.open(data)
        rows.append(("MemoryService.open (not GUI: indexes)", f"{time.perf_counter() - t:.2f} s"))
        settings = QSettings(os.path.join(root, "settings.ini"), QSettings.Format.IniFormat)

        # peers: the same calls made directly
        peer_sessions = timed(lambda: svc.read_messages(view="sessions", limit=200))
        first_session = svc.read_messages(view="sessions", limit=1)["sessions"][0]["session_id"]
        biggest = max(
            svc.read_messages(view="sessions", limit=1000)["sessions"],
            key=lambda s: s["message_count"],
        )["session_id"]
        peer_history = timed(
            lambda: svc.read_messages(view="history", session_id=biggest, limit=200)
        )
        peer_search = statistics.median(
            timed(partial(svc.search_messages, query=q, limit=20), 1) for q in QUERIES
        )

        beat = Heartbeat()
        # 0. peer: the same rebuild on a bare Qt event loop (no browser)
        done: list[dict[str, Any]] = []
        worker = threading.Thread(target=lambda: done.append(svc.rebuild_index()))
        beat.start()
        worker.start()
        while worker.is_alive():
            settle(20)
        worker.join()
        bare_stall = beat.stop()
        print("bare rebuild:", beat.worst(), flush=True)
        rows.append(
            (
                "peer: longest stall, same rebuild, bare event loop",
                f"{bare_stall:.0f} ms (no browser: GIL hand-offs to the rebuild thread)",
            )
        )

        # 1. open the window until the first sessions page is shown
        beat.start()
        t = time.perf_counter()
        b = MemoryBrowser(svc, settings=settings)
        b.show()
        constructed = (time.perf_counter() - t) * 1000
        if b.browse.sessions_model.rowCount() == 0:
            wait_for(b.browse.sessions_model.pageLoaded)
        settle(0)  # paint
        opened = (time.perf_counter() - t) * 1000
        settle(300)
        open_stall = beat.stop()
        rows.append(("window constructed and shown", f"{constructed:.0f} ms"))
        rows.append(
            (
                "open → first sessions page on screen",
                f"{opened:.0f} ms (direct read of a page: {peer_sessions:.1f} ms)",
            )
        )
        rows.append(("longest GUI stall while opening", f"{open_stall:.0f} ms"))

        # 2. select the biggest session until its first history page is shown
        times: list[float] = []
        beat.start()
        for sid in (biggest, first_session, biggest):
            b.browse.history_model.set_session(None)
            times.append(
                shown_after(
                    partial(b.browse.select_session, sid), b.browse.history_model.pageLoaded
                )
            )
        hist_stall = beat.stop()
        shown = statistics.median(times)
        rows.append(
            (
                f"select session → first history page ({b.browse.history_model.rowCount()} rows)",
                f"{shown:.0f} ms (direct: {peer_history:.1f} ms, x{shown / peer_history:.1f})",
            )
        )
        rows.append(("longest GUI stall while paging history", f"{hist_stall:.0f} ms"))

        # 3. search until results are shown
        b.focus_page("search")
        times = []
        beat.start()
        for q in QUERIES:
            b.page_of(SearchPanel).query.setText(q)
            times.append(
                shown_after(b.page_of(SearchPanel).search, b.page_of(SearchPanel).searched)
            )
        search_stall = beat.stop()
        shown = statistics.median(times)
        rows.append(
            (
                "search → results on screen (median of 4 queries)",
                f"{shown:.0f} ms (direct: {peer_search:.1f} ms, x{shown / peer_search:.1f})",
            )
        )
        rows.append(("longest GUI stall while searching", f"{search_stall:.0f} ms"))

        # 4. rebuild with the maintenance tab open, heartbeat running; then its peer: the same
        # rebuild with nothing frozen (the service's gc.freeze() after building its indexes is
        # the one freeze in the process; without it full collections walk every index object)
        b.show_page("maintenance")
        for label, frozen in (("", True), ("peer: ", False)):
            stall, rebuild_s, result = browser_rebuild(b, beat, frozen)
            rows.append(
                (
                    f"{label}rebuild_index from the browser"
                    f" ({result['messages_indexed']:,} messages{'' if frozen else ', no freeze'})",
                    f"{rebuild_s:.1f} s",
                )
            )
            verdict = "OK" if stall <= 100 else "OVER TARGET"
            rows.append(
                (
                    f"{label}longest GUI stall during rebuild"
                    + (" (target ≤ 100 ms)" if frozen else ", heap never frozen"),
                    f"{stall:.0f} ms over {len(beat.gaps):,} heartbeats ({verdict})",
                )
            )
        b.close()
        b.shutdown()
        svc.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    print(f"Browser benchmark ({os.environ.get('QT_QPA_PLATFORM')}, {os.cpu_count()} cores)")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


if __name__ == "__main__":
    main()
