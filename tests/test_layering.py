"""The dependency rules of the house, checked in fresh interpreters.

- nothing under `convmem_engine` imports PySide6 (Qt lives in `convmem_app` only);
- `convmem_app.shim` starts on the standard library alone: no PySide6, no `mcp`, no engine.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import convmem_engine

ROOT = Path(__file__).resolve().parent.parent


def engine_modules() -> list[str]:
    return sorted(
        info.name
        for info in pkgutil.walk_packages(convmem_engine.__path__, prefix="convmem_engine.")
    )


def imported_after(module: str) -> set[str]:
    """Import `module` in a fresh interpreter and return every module name it loaded."""
    code = (
        "import importlib, sys\n"
        f"importlib.import_module({module!r})\n"
        "print('\\n'.join(sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    return set(out.split())


def top_level(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


def test_engine_has_modules_to_check() -> None:
    assert "convmem_engine.domain" in engine_modules()


def test_engine_never_imports_qt() -> None:
    modules = engine_modules()
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'shiboken6'))\n"
        "print(' '.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()
    assert out == "", f"convmem_engine imported Qt: {out}"


def test_shim_imports_standard_library_only() -> None:
    loaded = top_level(imported_after("convmem_app.shim.launcher"))
    assert not loaded & {"PySide6", "shiboken6", "mcp", "convmem_engine", "anyio", "pydantic"}
