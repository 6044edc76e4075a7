"""Bulk curation of selected messages: metadata changes and deletes, revision-checked, with Undo.

No Qt: runs on a worker thread over MemoryService. Each message is changed with
`update_message(..., expected_revision=<the revision the user saw>)`, so a message a host edited
meanwhile is reported as a conflict and left as the host wrote it, never overwritten. The
result lists what changed, what conflicted and what was gone.

Undo of the last bulk metadata change puts back, on each message it changed, the fields it
changed, again with `expected_revision` (the revision the change produced): a message edited
since is reported, not reverted over the newer edit.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from convmem_engine.domain.errors import ConflictError, NotFoundError
from convmem_engine.service import MemoryService
from convmem_engine.tools import ToolRegistry


@dataclass(frozen=True)
class BulkChange:
    """What to do to every selected message. None = leave that field alone."""

    memory_tier: str | None = None
    memory_kind: str | None = None
    importance: int | None = None
    add_tags: tuple[str, ...] = ()
    remove_tags: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return (
            self.memory_tier is None
            and self.memory_kind is None
            and self.importance is None
            and not self.add_tags
            and not self.remove_tags
        )

    def patch_for(self, metadata: dict[str, Any]) -> dict[str, Any]:
        """The metadata_json patch for one message (its current metadata), {} if no change."""
        patch: dict[str, Any] = {}
        for key in ("memory_tier", "memory_kind", "importance"):
            value = getattr(self, key)
            if value is not None and metadata.get(key) != value:
                patch[key] = value
        if self.add_tags or self.remove_tags:
            tags = [t for t in metadata.get("tags", []) if t not in self.remove_tags]
            tags += [t for t in self.add_tags if t not in tags]
            if tags != list(metadata.get("tags", [])):
                patch["tags"] = tags
        return patch


@dataclass(frozen=True)
class Target:
    """A selected message as the user saw it (`session_id`: where it was shown, a guard)."""

    message_id: str
    revision: int
    session_id: str | None = None


@dataclass
class BulkResult:
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # edited by someone else meanwhile
    missing: list[str] = field(default_factory=list)  # deleted meanwhile
    failed: list[tuple[str, str]] = field(default_factory=list)  # (id, error message)
    cancelled: bool = False
    # for Undo: id -> (the fields' previous values, the revision our change produced)
    undo: dict[str, tuple[dict[str, Any], int]] = field(default_factory=dict)

    def summary(self, verb: str) -> str:
        parts = [f"{len(self.changed)} {verb}"]
        if self.unchanged:
            parts.append(f"{len(self.unchanged)} already so")
        if self.conflicts:
            kept = "kept, not deleted" if verb == "deleted" else "left as is"
            parts.append(f"{len(self.conflicts)} changed by another client meanwhile ({kept})")
        if self.missing:
            parts.append(f"{len(self.missing)} deleted meanwhile")
        if self.failed:
            parts.append(f"{len(self.failed)} failed: {self.failed[0][1]}")
        if self.cancelled:
            parts.append("cancelled")
        return ", ".join(parts)


Progress = Callable[[int, int], None]


def _current(service: MemoryService, message_id: str) -> dict[str, Any] | None:
    """The message as it is now (None when it is gone)."""
    try:
        ctx = service.read_messages(
            view="context", message_id=message_id, before=0, after=0, relation_depth=0
        )
    except NotFoundError:
        return None
    msg = ctx.get("message")
    return msg if isinstance(msg, dict) else None


def apply_change(
    service: MemoryService,
    targets: Sequence[Target],
    change: BulkChange,
    *,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> BulkResult:
    result = BulkResult()
    tools = ToolRegistry.for_service(service)  # the user's values checked as a host's are
    for n, t in enumerate(targets, 1):
        if cancel is not None and cancel.is_set():
            result.cancelled = True
            break
        msg = _current(service, t.message_id)
        if msg is None:
            result.missing.append(t.message_id)
            continue
        if msg["revision"] != t.revision:
            result.conflicts.append(t.message_id)
            continue
        md = msg["metadata"]
        patch = change.patch_for(md)
        if not patch:
            result.unchanged.append(t.message_id)
            continue
        try:
            arguments = {
                "message_id": t.message_id,
                "metadata_json": json.dumps(patch),
                "expected_revision": t.revision,
            }
            r = tools.call("update_message", arguments)
        except ConflictError:
            result.conflicts.append(t.message_id)
            continue
        except NotFoundError:
            result.missing.append(t.message_id)
            continue
        except Exception as e:  # a validation error (e.g. too many tags): reported per message
            result.failed.append((t.message_id, getattr(e, "message", type(e).__name__)))
            continue
        before = {k: md.get(k) for k in patch}
        result.changed.append(t.message_id)
        result.undo[t.message_id] = (before, int(r["message"]["revision"]))
        if progress is not None:
            progress(n, len(targets))
    return result


def undo_change(
    service: MemoryService, previous: BulkResult, *, progress: Progress | None = None
) -> BulkResult:
    """Put back what `previous` changed, where nobody changed the message since."""
    result = BulkResult()
    tools = ToolRegistry.for_service(service)
    items = list(previous.undo.items())
    for n, (mid, (before, revision)) in enumerate(items, 1):
        try:
            arguments = {
                "message_id": mid,
                "metadata_json": json.dumps(before),
                "expected_revision": revision,
            }
            tools.call("update_message", arguments)
            result.changed.append(mid)
        except ConflictError:
            result.conflicts.append(mid)
        except NotFoundError:
            result.missing.append(mid)
        if progress is not None:
            progress(n, len(items))
    return result


def delete_messages(
    service: MemoryService,
    targets: Sequence[Target],
    *,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> BulkResult:
    """Delete each selected message unless a host changed it since it was selected: the
    revision check and the delete are one step under the service's write lock, so an edit can
    never slip in between. Changed messages are kept and listed in `conflicts`, messages
    already gone in `missing`."""
    result = BulkResult()
    for n, t in enumerate(targets, 1):
        if cancel is not None and cancel.is_set():
            result.cancelled = True
            break
        try:
            r = service.delete_message(
                message_id=t.message_id, session_id=t.session_id, expected_revision=t.revision
            )
        except ConflictError:
            result.conflicts.append(t.message_id)
        else:
            (result.changed if r["status"] == "OK" else result.missing).append(t.message_id)
        if progress is not None:
            progress(n, len(targets))
    return result
