"""The dependency rules of the house.

- nothing under `convmem_engine` imports PySide6 (Qt lives in `convmem_app` only);
- `convmem_app.shim` starts on the standard library alone: no PySide6, no `mcp`, no engine;
- the engine's floors: each package imports only from its own package and from packages on
  lower floors (domain <- storage/index <- service <- tools <- agent <- mcp <- runtime), and
  never `convmem_app`. Checked on the source (every import statement, including ones inside
  functions and under TYPE_CHECKING), so a lazy import cannot hide a dependency;
- within the runtime, the stdio front's pure part (`front_plan`) imports nothing of ours but
  the generated `handshake_answers`: `front` imports it, never the other way.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import convmem_engine

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "convmem_engine"

FLOORS: dict[str, int] = {
    "domain": 0,  # values, limits, validation, errors: imports nothing of ours
    "storage": 1,  # the log, snapshot, lock
    "index": 1,  # derived state over domain values
    "service": 2,  # MemoryService: the operations over store + indexes
    "tools": 3,  # the tool registry: declarations, argument checks, handlers
    "transfer": 3,  # export, import, backups: over the service and the store's files
    "agent": 4,  # the memory agent: calls tools through the registry
    "mcp": 5,  # the protocol face: servers and transports built from the registry
    "runtime": 6,  # owns the lock, the service, the server, the listeners
}
"""A new engine package gets a floor here (a test below fails until it has one)."""


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


def _engine_imports(source: str, module: tuple[str, ...]) -> set[str]:
    """Every `convmem_engine.<package>` (and `convmem_app`) the source of `module` (its dotted
    name as parts) imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = list(module[: len(module) - node.level])
                names = [".".join([*base, *([node.module] if node.module else [])])]
            elif node.module:
                names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "convmem_app":
                found.add("convmem_app")
            elif parts[0] == "convmem_engine" and len(parts) > 1:
                found.add(parts[1])
    return found


def _engine_packages() -> dict[str, list[Path]]:
    packages: dict[str, list[Path]] = {}
    for path in sorted(ENGINE.rglob("*.py")):
        rel = path.relative_to(ENGINE).parts
        if len(rel) > 1:
            packages.setdefault(rel[0], []).append(path)
    return packages


def test_every_engine_package_has_a_floor() -> None:
    packages = _engine_packages()
    assert {"domain", "storage", "index", "service", "tools", "mcp"} <= set(packages)
    missing = sorted(set(packages) - set(FLOORS))
    assert missing == [], f"give these engine packages a floor in FLOORS: {missing}"


def test_engine_packages_import_only_lower_floors() -> None:
    violations: list[str] = []
    for package, paths in _engine_packages().items():
        floor = FLOORS.get(package)
        if floor is None:
            continue  # reported by the test above
        for path in paths:
            module = path.relative_to(ROOT).with_suffix("").parts
            imported = _engine_imports(path.read_text(encoding="utf-8"), module)
            for name in sorted(imported - {package}):
                other = FLOORS.get(name)
                if other is None or other >= floor:
                    rel = path.relative_to(ROOT)
                    violations.append(f"{rel} imports {name} (floor {other}, own {floor})")
    assert violations == []


def test_the_floor_check_sees_lazy_guarded_and_relative_imports() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from convmem_engine.mcp import build_server\n"
        "def f():\n"
        "    import convmem_engine.tools.registry\n"
        "    from ..runtime import x\n"
        "    from . import ids\n"
        "    import convmem_app.cli\n"
    )
    module = ("convmem_engine", "service", "probe")
    assert _engine_imports(source, module) == {"mcp", "tools", "runtime", "service", "convmem_app"}


def test_the_fronts_plan_imports_only_the_generated_answers() -> None:
    tree = ast.parse((ENGINE / "runtime" / "front_plan.py").read_text(encoding="utf-8"))
    ours: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            ours |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, "front_plan: a relative import"
            ours |= {f"{node.module}.{alias.name}" for alias in node.names}
    ours = {name for name in ours if name.startswith(("convmem_engine", "convmem_app"))}
    assert ours <= {"convmem_engine.runtime.handshake_answers"}, sorted(ours)
