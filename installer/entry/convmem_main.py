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

if __name__ == "__main__":
    stem = os.path.splitext(os.path.basename(sys.executable))[0]
    # Windows file names are case-insensitive: compare folded.
    sys.exit(app_main() if stem.casefold() == "convmem" else main())
