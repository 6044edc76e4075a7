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

import pytest

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
