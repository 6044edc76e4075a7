"""Test configuration shared by every suite.

Qt runs on the offscreen platform: without a display and without this, Qt aborts the process.
"""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
