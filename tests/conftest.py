"""Test configuration shared by every suite.

Qt runs on the offscreen platform: without a display and without this, Qt aborts the process.

Platform markers (pyproject.toml); `pytest_collection_modifyitems` turns them into skips:
- `windows`: calls the real Windows API (named pipes, msvcrt locks, winreg, process tokens):
  runs on Windows (ci.yml's Windows jobs), skipped elsewhere. The logic around those calls is
  tested on every platform through each module's small seam.
- `posix`: needs POSIX APIs (fork, uid/setuid, AF_UNIX sockets, SIGKILL/SIGTERM, POSIX modes and
  symlinks): skipped on Windows.
- `linux`: needs Linux itself (/proc, prlimit, tmpfs mounts): skipped on macOS and Windows.

`CONVMEM_TEST_PLATFORM` (test-only knob, never set in CI): makes the skip decision as if
`sys.platform` were its value (`win32`, `darwin`, `linux`), so a Linux machine can list what
the Windows and macOS jobs skip: `CONVMEM_TEST_PLATFORM=win32 pytest --co -q` plus
`pytest --setup-plan -q -rs`. It changes nothing else (the code under test still sees the real
platform), so never run the tests themselves with it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from convmem_app.gui_gc import GuiThreadCollector

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

PLATFORM = os.environ.get("CONVMEM_TEST_PLATFORM") or sys.platform

_SKIPS = {
    "windows": (
        PLATFORM != "win32",
        "Windows only (proved by ci.yml's Windows jobs)",
    ),
    "posix": (
        PLATFORM == "win32",
        "POSIX only (fork, uid, AF_UNIX sockets, POSIX signals or modes): not on Windows",
    ),
    "linux": (
        not PLATFORM.startswith("linux"),
        "Linux only (/proc, prlimit or tmpfs mounts): runs in the Linux jobs",
    ),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marks = {
        name: pytest.mark.skip(reason=reason) for name, (skip, reason) in _SKIPS.items() if skip
    }
    for item in items:
        for name, mark in marks.items():
            if item.get_closest_marker(name):
                item.add_marker(mark)
                break


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A fresh private folder with a short path, for Unix socket paths (at most 104 bytes on
    macOS, whose `tmp_path` under /var/folders is already longer than that)."""
    base = "/tmp" if os.path.isdir("/tmp") and sys.platform != "win32" else None
    folder = Path(tempfile.mkdtemp(prefix="cm", dir=base))
    folder.chmod(0o700)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


_collector: list[GuiThreadCollector] = []


@pytest.fixture(autouse=True)
def _gc_on_the_gui_thread(request: pytest.FixtureRequest) -> Iterator[None]:
    """From the first Qt test on, the cyclic garbage collector runs on the GUI thread only, as
    in the app (`convmem_app.gui_gc`): else a collection on an engine or pool thread frees a
    window or job an earlier test left in a cycle, off its thread (a segfault in PySide's
    deferred deletion, every run of tests/agent, tests/app and tests/gui in one process).
    After each test what is due is collected here, on the main thread: tests that never run
    Qt's event loop would otherwise leave it all to the end."""
    if not _collector and "qapp" in request.fixturenames:
        from convmem_app.gui_gc import collect_on_gui_thread

        _collector.append(collect_on_gui_thread(request.getfixturevalue("qapp")))
    yield
    if _collector:
        _collector[0].collect_due()
