"""The Qt binding must not corrupt Python's reference counts.

PySide6-Essentials 6.12.0 returned the results of `Signal.emit()` (a bool) and
`QCoreApplication.processEvents()` (None) without a reference of their own: every call took
one reference away from True or None, and after a few thousand signals (a busy app relays one
per MCP reply) CPython aborted with "deallocating True". The full test suite hit it as a
segfault. pyproject.toml keeps that release out; this test catches any release that brings the
bug back, without crashing: it counts references over a few hundred calls.
"""

from __future__ import annotations

import gc
import sys
import threading

from PySide6.QtCore import QCoreApplication, QObject, Signal
from pytestqt.qtbot import QtBot

CALLS = 300
SLACK = 20  # unrelated references taken or dropped meanwhile (caches, the test itself)
# From Python 3.12 True, False and None are immortal (PEP 683): the bug cannot free them there
# and their reference counts no longer count anything, so only older Pythons can check.
COUNTS_REFERENCES = sys.version_info < (3, 12)


def count(obj: object) -> int:
    """References to `obj` now, after collecting the garbage earlier tests left (cycles holding
    True or None, freed at an arbitrary later moment, would otherwise count as lost here)."""
    gc.collect()
    return sys.getrefcount(obj)


def assert_kept(obj: object, before: int) -> None:
    if COUNTS_REFERENCES:
        lost = before - sys.getrefcount(obj)
        assert abs(lost) < SLACK, f"{obj!r} lost {lost} references"


class Emitter(QObject):
    payload = Signal(object)
    bare = Signal()


def test_emit_keeps_reference_counts(qtbot: QtBot) -> None:
    emitter = Emitter()
    received: list[object] = []
    emitter.payload.connect(received.append)
    emitter.bare.connect(lambda: None)
    before = count(True), count(False)
    for i in range(CALLS):
        emitter.payload.emit(("reply", i))
        emitter.bare.emit()
    assert len(received) == CALLS
    assert_kept(True, before[0])
    assert_kept(False, before[1])


def test_queued_emit_from_another_thread_keeps_payloads_alive(qtbot: QtBot) -> None:
    """The app's pattern: a worker thread emits, the GUI thread receives (queued)."""
    emitter = Emitter()
    received: list[tuple[str, int]] = []
    emitter.payload.connect(received.append)
    before = count(True)
    worker = threading.Thread(
        target=lambda: [emitter.payload.emit(("reply", i)) for i in range(CALLS)]
    )
    worker.start()
    qtbot.waitUntil(lambda: len(received) == CALLS, timeout=30_000)
    worker.join()
    assert received == [("reply", i) for i in range(CALLS)]
    assert_kept(True, before)


def test_process_events_keeps_reference_counts(qtbot: QtBot) -> None:
    before = count(None)
    for _ in range(CALLS):
        QCoreApplication.processEvents()
    assert_kept(None, before)
