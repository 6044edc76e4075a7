"""Entry script of the bundled `ConvMem` (windowed tray app) and `convmem-cli` (console)
executables.

Both executables are built from this one script and one analysis (installer/convmem.spec); the
name they were started by picks the command: `ConvMem[.exe] ARGS` is `convmem app ARGS`,
`convmem-cli[.exe] ARGS` is `convmem ARGS` (serve | app | shim).
"""

from __future__ import annotations

import os
import sys

from convmem_app.cli import app_main, main


def qt_environment(base: str, windows: bool) -> dict[str, str]:
    """What PyInstaller's PySide6 run-time hook would set at every start (installer/convmem.spec
    leaves that hook out, so that `serve` does not load Qt): where the bundled Qt plugins are,
    and on Windows the bundle folder first on PATH for the DLLs Qt loads by name."""
    qt = os.path.join(base, "PySide6") if windows else os.path.join(base, "PySide6", "Qt")
    env = {"QT_PLUGIN_PATH": os.path.join(qt, "plugins")}
    if windows:
        env["PATH"] = base + os.pathsep + os.environ.get("PATH", "")
    return env


if __name__ == "__main__":
    stem = os.path.splitext(os.path.basename(sys.executable))[0]
    # Windows file names are case-insensitive: compare folded.
    starts_app = stem.casefold() == "convmem" or sys.argv[1:2] == ["app"]
    if starts_app and hasattr(sys, "_MEIPASS"):
        os.environ.update(qt_environment(sys._MEIPASS, sys.platform == "win32"))
    sys.exit(app_main() if stem.casefold() == "convmem" else main())
