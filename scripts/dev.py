#!/usr/bin/env python3
"""One-command setup for ConvMem: create `.venv`, install, then run the app or the tests.

Standard library only, so it works on a fresh clone with nothing but Python 3.11+:

    python3 scripts/dev.py app   [app arguments...]   # set up, then start the tray app
    python3 scripts/dev.py test  [pytest arguments...] # set up, then run the whole test suite
    python3 scripts/dev.py lint                        # ruff + mypy
"""

from __future__ import annotations

import ctypes.util
import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = VENV / ".convmem-installed"
# Debian packages Qt needs for the offscreen platform (see docs/troubleshooting in README.md).
QT_APT_PACKAGES = [
    "libegl1",
    "libgl1",
    "libxkbcommon0",
    "libfontconfig1",
    "libdbus-1-3",
    "libglib2.0-0",
]
QT_LIBRARIES = ["GL", "EGL", "xkbcommon", "fontconfig", "dbus-1", "glib-2.0"]


def venv_python() -> Path:
    if os.name == "nt":
        return VENV / "Scripts" / "python.exe"
    return VENV / "bin" / "python"


def ensure_system_libraries() -> None:
    """Install Qt's shared libraries on Debian-like systems when they are missing."""
    if sys.platform != "linux":
        return
    missing = [lib for lib in QT_LIBRARIES if ctypes.util.find_library(lib) is None]
    if not missing:
        return
    apt = shutil.which("apt-get")
    if apt is None:
        sys.exit(f"dev.py: Qt needs these shared libraries: {', '.join(missing)}; install them.")
    sudo: list[str] = [] if os.geteuid() == 0 else ["sudo"]
    print(f"dev.py: installing Qt system libraries ({', '.join(missing)} missing)", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run([*sudo, apt, "-qq", "update"], check=True, env=env)
    subprocess.run(
        [*sudo, apt, "-qq", "install", "-y", "--no-install-recommends", *QT_APT_PACKAGES],
        check=True,
        env=env,
    )


def ensure_venv(extras: str) -> Path:
    """Create `.venv` and install the project with `extras`; reinstall when pyproject changes."""
    python = venv_python()
    if not python.exists():
        print(f"dev.py: creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + extras.encode()).hexdigest()
    if not STAMP.exists() or STAMP.read_text() != digest:
        print(f"dev.py: installing convmem[{extras}] into {VENV}", flush=True)
        pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
        subprocess.run([*pip, "install", "-e", f".[{extras}]"], check=True, cwd=ROOT)
        STAMP.write_text(digest)
    return python


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"app", "test", "lint", "setup"}:
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "app":
        python = ensure_venv("test,bench")
        ensure_system_libraries()
        return subprocess.call([str(python), "-m", "convmem_app", "app", *rest], cwd=ROOT)
    python = ensure_venv("test,bench")
    if command == "setup":
        ensure_system_libraries()
        return 0
    if command == "lint":
        code = subprocess.call([str(python), "-m", "ruff", "check", "."], cwd=ROOT)
        code |= subprocess.call([str(python), "-m", "ruff", "format", "--check", "."], cwd=ROOT)
        return code | subprocess.call([str(python), "-m", "mypy"], cwd=ROOT)
    ensure_system_libraries()
    return subprocess.call([str(python), "-m", "pytest", *rest], cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
