"""docs/tools.md is exactly what scripts/gen_tools_doc.py writes from the live schemas."""

from __future__ import annotations

import subprocess
import sys

from mcp_helpers import ROOT


def test_tools_doc_matches_the_schemas() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_tools_doc.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
