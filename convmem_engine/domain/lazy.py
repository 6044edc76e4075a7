"""Package attributes imported on first use (PEP 562), so that importing a package does not
import every module it exports: what `convmem serve`'s path to its first answer does not need
stays unloaded (docs/benchmarks.md, "Cold start")."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: name -> the value of that name in the submodule
    `where[name]`, imported on first use and then kept in the package's namespace."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
