"""A MemoryService whose seven operations are called as tools, in-process: shared by the suites
that drive the service with the tool reference's raw JSON arguments (seed 000's tables).

    svc = ToolCalls.open(data_dir)       # or ToolCalls(service)
    svc.write_message(session_id="s", role="user", content="x", metadata_json="{...}")

Each of the seven names runs `ToolRegistry.call` (the arguments checked as a host's are, then
the typed MemoryService operation); an argument passed as None is omitted (the convention of
the service's former raw-argument methods). Everything else (check, close, subscribe, ...) is
the service's own. On sys.path as `tool_calls` (pytest puts tests/ there for tests/conftest.py).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from hypothesis.stateful import RuleBasedStateMachine

from convmem_engine.service import MemoryService
from convmem_engine.tools import ToolRegistry


class ToolCalls:
    def __init__(self, service: MemoryService) -> None:
        self.service = service
        self.tools = ToolRegistry.for_service(service)

    @classmethod
    def open(cls, *args: Any, **kwargs: Any) -> ToolCalls:
        return cls(MemoryService.open(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        if name in ("service", "tools"):  # not set yet (during unpickling/copying)
            raise AttributeError(name)
        if name in self.tools:
            return self._tool(name)
        return getattr(self.service, name)

    def _tool(self, name: str) -> Callable[..., Any]:
        def call(**arguments: Any) -> Any:
            given = {key: value for key, value in arguments.items() if value is not None}
            return self.tools.call(name, given)

        return call

    def __enter__(self) -> ToolCalls:
        return self

    def __exit__(self, *exc: object) -> None:
        self.service.close()


class ServiceOnDisk(RuleBasedStateMachine):
    """A hypothesis state machine over `ToolCalls` on a store in a folder of its own
    (`self.dir`, `self.svc`, opened with `open_args`); at teardown the store's check must be
    clean, and the store is closed and the folder removed whatever it says."""

    def __init__(self, **open_args: Any) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="convmem-machine-")
        self.svc = ToolCalls.open(self.dir, **open_args)

    def teardown(self) -> None:
        try:
            assert self.svc.check() == []
        finally:
            # closed even when the check fails: an open store left to the garbage collector
            # reports its unclosed lock file in whichever later test collects it
            try:
                self.svc.close()
            finally:
                shutil.rmtree(self.dir, ignore_errors=True)
