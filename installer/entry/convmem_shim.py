"""Entry script of the bundled `convmem-shim` executable: standard library + convmem_app.shim.paths
+ convmem_app.shim only (installer/convmem.spec fails the build if anything else gets in)."""

from __future__ import annotations

import sys

from convmem_app.shim.launcher import main

if __name__ == "__main__":
    sys.exit(main())
