"""Test configuration shared by every suite.

Qt runs on the offscreen platform: without a display and without this, Qt aborts the process.

Tests marked `windows` call the real Windows API (named pipes, msvcrt locks, winreg, process
tokens): they run on Windows (ci.yml's Windows jobs) and are skipped elsewhere. The logic around
those calls is tested on every platform through each module's small seam.
"""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if sys.platform == "win32":
        return
    skip = pytest.mark.skip(reason="Windows only (proved by ci.yml's Windows jobs)")
    for item in items:
        if item.get_closest_marker("windows"):
            item.add_marker(skip)
