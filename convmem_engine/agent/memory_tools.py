"""The memory operations as the model's tools: the MCP tools' names, schemas and validation
(the same `ToolRegistry` the MCP server serves), called in process (no network hop), every
mutating call written to the audit journal.

`delete_message` and `rebuild_index` are offered only when the configuration allows them; a
call to a tool that was not offered is answered as an error, never run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from convmem_engine.agent.store import AgentStore, AuditRecord, now_iso
from convmem_engine.domain.errors import ConvMemError, InternalError, ValidationError
from convmem_engine.service import MemoryService, result_json
from convmem_engine.tools import MEMORY_TOOLS, ToolRegistry

log = logging.getLogger(__name__)

MUTATING: Final = frozenset({"write_message", "update_message", "delete_message", "rebuild_index"})
GUARDED: Final = {"delete_message": "allow_delete", "rebuild_index": "allow_rebuild"}


def offered_tool_names(*, allow_delete: bool, allow_rebuild: bool) -> list[str]:
    allowed = {"delete_message": allow_delete, "rebuild_index": allow_rebuild}
    return [tool.name for tool in MEMORY_TOOLS if allowed.get(tool.name, True)]


class MemoryTools:
    def __init__(
        self,
        service: MemoryService,
        store: AgentStore,
        *,
        allow_delete: bool,
        allow_rebuild: bool,
    ) -> None:
        self._service = service
        self._registry = ToolRegistry.for_service(service)
        self._store = store
        self.names = offered_tool_names(allow_delete=allow_delete, allow_rebuild=allow_rebuild)

    def ollama_tools(self) -> list[dict[str, Any]]:
        """The offered tools in Ollama's `tools` shape (the MCP input schemas unchanged)."""
        out = []
        for name in self.names:
            tool = self._registry.get(name)
            assert tool is not None
            out.append(
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.input_schema,
                    },
                }
            )
        return out

    def call(self, task_id: str, name: str, arguments: Mapping[str, Any]) -> tuple[str, bool]:
        """Run one tool call; returns (result JSON text, is_error) exactly as MCP would."""
        if name not in self.names or name not in self._registry:
            offered = ", ".join(self.names)
            error = ValidationError(f"unknown tool: name must be one of {offered}")
            return result_json(error.to_json()), True
        args = dict(arguments)
        before: int | None = None
        try:
            if name == "delete_message":
                before = self._revision(args.get("message_id"))
            result = self._registry.call(name, args)
        except ConvMemError as exc:
            self._audit(task_id, name, args, None, before, ok=False)
            return result_json(exc.to_json()), True
        except Exception as exc:
            log.error("agent tool %s failed with %s", name, type(exc).__name__)
            self._audit(task_id, name, args, None, before, ok=False)
            internal = InternalError(f"{name} failed unexpectedly; see the log")
            return result_json(internal.to_json()), True
        self._audit(task_id, name, args, result, before, ok=True)
        return result_json(result), False

    def _revision(self, message_id: object) -> int | None:
        if not isinstance(message_id, str):
            return None
        try:
            found = self._service.read_messages(
                view="content", message_id=message_id, content_limit=1
            )
        except ConvMemError:
            return None
        found_range = found.get("content_range")
        revision = found_range.get("revision") if isinstance(found_range, Mapping) else None
        return revision if isinstance(revision, int) else None

    def _audit(
        self,
        task_id: str,
        name: str,
        args: Mapping[str, Any],
        result: Mapping[str, Any] | None,
        before: int | None,
        *,
        ok: bool,
    ) -> None:
        if name not in MUTATING:
            return
        message = result.get("message") if result is not None else None
        ids: list[str] = []
        after: int | None = None
        if isinstance(message, Mapping):
            mid = message.get("message_id")
            if isinstance(mid, str):
                ids.append(mid)
            revision = message.get("revision")
            after = revision if isinstance(revision, int) else None
        elif isinstance(args.get("message_id"), str):
            ids.append(str(args["message_id"]))
        if name == "write_message":
            before = None
        elif name == "update_message" and result is not None and after is not None:
            before = after - 1 if result.get("changed") else after
        elif name == "update_message" and result is None:
            before = self._revision(args.get("message_id"))
            after = before
        elif name == "delete_message" and not ok:
            after = before
        self._store.audit(
            AuditRecord(
                at=now_iso(),
                task_id=task_id,
                tool=name,
                message_ids=tuple(ids),
                before_revision=before,
                after_revision=after,
                ok=ok and (result is None or result.get("status") == "OK"),
            )
        )
