"""The tool registry: every tool ConvMem serves, looked up by name, checked and called in one way.

    registry = ToolRegistry.for_service(service)        # the seven memory tools
    registry = registry.with_tools(AGENT_TOOLS, agent)  # more tools, with their own context
    registry.get("read_messages")                       # the ToolSpec, or None
    registry.call("read_messages", {"view": "sessions"})        # the handler's result
    registry.result("read_messages", {"view": "sessions"})      # ToolResult(text, is_error)

`call` checks the arguments (the generated JSON Schema first, then each parameter's checks and
the tool's rule) and runs the handler on the calling thread; it raises the domain errors
(`ConvMemError` subclasses) and `UnknownToolError`. `result` is what every transport sends: the
result or the application error as one text block, shaped by the tool's result style; an
unexpected exception becomes INTERNAL_ERROR and is logged by type and traceback only
(exception messages can quote message content, so they are never logged).

A registry is immutable: `with_tools` returns a new one, so a server built from it never sees
its tools change.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from convmem_engine.domain.errors import ConvMemError, InternalError
from convmem_engine.service import result_json
from convmem_engine.tools.arguments import check_schema
from convmem_engine.tools.spec import ToolSpec

if TYPE_CHECKING:
    from convmem_engine.service import MemoryService

logger = logging.getLogger(__name__)

C = TypeVar("C")


class UnknownToolError(LookupError):
    """No tool of that name is registered (a protocol error in MCP, not a tool result)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.message = "unknown tool: name must be one of " + ", ".join(names)
        super().__init__(self.message)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """One tool call's answer as every transport sends it: one text block, and whether it is
    an application error (MCP `isError`)."""

    text: str
    is_error: bool


def error_text(spec: ToolSpec[Any], error: ConvMemError) -> str:
    """An application error in the tool's result style: the seed 000 error envelope as JSON,
    or for "text" tools `error: CODE` and `message: ...` lines."""
    if spec.result_style == "json":
        return result_json(error.to_json())
    return f"error: {error.code}\nmessage: {error.message}"


def _unexpected(spec: ToolSpec[Any], exc: BaseException) -> ToolResult:
    """INTERNAL_ERROR for a failure no handler should have; logged by type and traceback."""
    frames = "".join(traceback.format_tb(exc.__traceback__))
    logger.error("%s failed with %s (message withheld)\n%s", spec.name, type(exc).__name__, frames)
    error = InternalError(f"{spec.name} failed unexpectedly; see the log")
    return ToolResult(error_text(spec, error), is_error=True)


class ToolRegistry:
    """Tool specs and the context each one's handler runs with, in listing order."""

    __slots__ = ("_tools", "instructions")

    def __init__(
        self,
        tools: Iterable[tuple[ToolSpec[Any], Any]] = (),
        *,
        instructions: str = "",
    ) -> None:
        """`tools`: (spec, context) pairs; names must be unique. `instructions`: what the
        server tells a model about the tools when a session starts."""
        self._tools: dict[str, tuple[ToolSpec[Any], Any]] = {}
        for spec, context in tools:
            if spec.name in self._tools:
                raise ValueError(f"tool {spec.name}: registered twice")
            self._tools[spec.name] = (spec, context)
        self.instructions = instructions

    @classmethod
    def for_service(cls, service: MemoryService) -> ToolRegistry:
        """The seven memory tools over `service`, with their server instructions."""
        from convmem_engine.tools.memory import INSTRUCTIONS, MEMORY_TOOLS

        return cls(((spec, service) for spec in MEMORY_TOOLS), instructions=INSTRUCTIONS)

    def with_tools(
        self, specs: Iterable[ToolSpec[C]], context: C, *, instructions: str | None = None
    ) -> ToolRegistry:
        """A new registry: these tools (handlers run with `context`) after the current ones.
        `instructions` replaces the current instructions when given."""
        return ToolRegistry(
            [*self._tools.values(), *((spec, context) for spec in specs)],
            instructions=self.instructions if instructions is None else instructions,
        )

    # -- lookup ------------------------------------------------------------------------------

    @property
    def specs(self) -> tuple[ToolSpec[Any], ...]:
        return tuple(spec for spec, _context in self._tools.values())

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def get(self, name: str) -> ToolSpec[Any] | None:
        entry = self._tools.get(name)
        return None if entry is None else entry[0]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[ToolSpec[Any]]:
        return iter(self.specs)

    def __len__(self) -> int:
        return len(self._tools)

    def _entry(self, name: str) -> tuple[ToolSpec[Any], Any]:
        entry = self._tools.get(name)
        if entry is None:
            raise UnknownToolError(self._tools)
        return entry

    # -- calls -------------------------------------------------------------------------------

    def validate(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The checked arguments of a call to tool `name`; raises ValidationError naming each
        field and rule broken (never the value) or UnknownToolError."""
        return validate_arguments(self._entry(name)[0], arguments)

    def call(self, name: str, arguments: Mapping[str, Any]) -> Any:
        """Check the arguments and run the tool's handler on this thread; its result, or the
        domain error it raised (or ValidationError, UnknownToolError)."""
        spec, context = self._entry(name)
        return spec.handler(context, validate_arguments(spec, arguments))

    def result(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """`call` as the answer a transport sends: the result or an application error as one
        text block (see the module doc). Raises only UnknownToolError."""
        spec, context = self._entry(name)
        try:
            value = spec.handler(context, validate_arguments(spec, arguments))
        except Exception as exc:
            return self.failure(name, exc)
        if spec.result_style == "json":
            return ToolResult(result_json(value), is_error=False)
        if not isinstance(value, str):
            return _unexpected(spec, TypeError("a text tool returned no text"))
        return ToolResult(value, is_error=False)

    def failure(self, name: str, exc: Exception) -> ToolResult:
        """The answer `result` gives when tool `name`'s handler raises `exc`: the application
        error, or INTERNAL_ERROR for an unexpected exception (logged by type only)."""
        spec = self._entry(name)[0]
        if isinstance(exc, ConvMemError):
            return ToolResult(error_text(spec, exc), is_error=True)
        return _unexpected(spec, exc)


def validate_arguments(spec: ToolSpec[Any], arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The checked arguments of a call to `spec`: the schema check, then each parameter's
    checks and the tool's rule. Raises ValidationError.

    A call that plainly passes (`_plainly_valid`) skips the JSON Schema validator, whose walk
    was most of the argument checking's cost per call; the result and every error are the same
    either way (tests/tools/test_arguments_fast.py)."""
    checked = _plainly_valid(spec, arguments)
    if checked is None:
        check_schema(spec.validator, arguments)
        # In declaration order (after the schema check every given argument is declared), so
        # the first rule broken is reported the same way whatever order the caller sent.
        checked = {p.name: p.check(arguments[p.name]) for p in spec.params if p.name in arguments}
    if spec.rule is not None:
        spec.rule(checked)
    return checked


def _plainly_valid(spec: ToolSpec[Any], arguments: Mapping[str, Any]) -> dict[str, Any] | None:
    """The parameters' checked values when every given argument is declared, every required
    one is given and each value passes its check with a kind whose check implies its schema
    fragment (`Kind.check_implies_schema`): then the schema would accept the call too. None
    otherwise, so that the schema's own messages come first, as they always have."""
    if not spec.param_names.issuperset(arguments):
        return None
    for name in spec.required_names:
        if name not in arguments:
            return None
    checked: dict[str, Any] = {}
    try:
        for p in spec.params:
            if p.name in arguments:
                value = arguments[p.name]
                if not p.check_implies_schema(value):
                    return None
                checked[p.name] = p.check(value)
    except Exception:  # the slow path raises it again, after the schema's own errors
        return None
    return checked
