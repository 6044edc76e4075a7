"""Bulk curation over a real service: revision-checked changes, conflicts reported, Undo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tool_calls import ToolCalls

from convmem_app.browser.bulk import (
    BulkChange,
    Target,
    apply_change,
    delete_messages,
    undo_change,
)
from convmem_engine.domain.errors import ConflictError
from convmem_engine.service import MemoryService


def _write(svc: MemoryService, i: int, tags: list[str]) -> Target:
    r = ToolCalls(svc).write_message(
        session_id="s", role="user", content=f"m{i}", metadata_json=json.dumps({"tags": tags})
    )
    return Target(r["message"]["message_id"], r["message"]["revision"])


def _md(svc: MemoryService, mid: str) -> dict[str, object]:
    msg = svc.read_messages(view="context", message_id=mid, before=0, after=0)["message"]
    return dict(msg["metadata"]) | {"revision": msg["revision"]}


def test_bulk_change_reports_conflicts_and_undo_restores(tmp_path: Path) -> None:
    with MemoryService.open(tmp_path / "d") as svc:
        targets = [_write(svc, i, ["keep", "old"]) for i in range(5)]
        # a host edits message 1 after the user selected it; message 2 is deleted meanwhile
        svc.update_message(message_id=targets[1].message_id, content="host edit")
        svc.delete_message(message_id=targets[2].message_id)
        change = BulkChange(
            memory_tier="long", importance=90, add_tags=("project-x",), remove_tags=("old",)
        )
        result = apply_change(svc, targets, change)
        assert result.changed == [targets[i].message_id for i in (0, 3, 4)]
        assert result.conflicts == [targets[1].message_id]
        assert result.missing == [targets[2].message_id]
        md = _md(svc, targets[0].message_id)
        assert (md["memory_tier"], md["importance"], md["tags"]) == (
            "long",
            90,
            ["keep", "project-x"],
        )
        assert _md(svc, targets[1].message_id)["tags"] == ["keep", "old"]  # not overwritten
        # a host changes message 4 after the bulk change: Undo leaves it alone
        ToolCalls(svc).update_message(
            message_id=targets[4].message_id, metadata_json='{"importance": 1}'
        )
        undone = undo_change(svc, result)
        assert undone.changed == [targets[0].message_id, targets[3].message_id]
        assert undone.conflicts == [targets[4].message_id]
        md = _md(svc, targets[0].message_id)
        assert (md["memory_tier"], md["importance"], md["tags"]) == ("short", 50, ["keep", "old"])
        assert _md(svc, targets[4].message_id)["importance"] == 1
        assert "1 changed by another client" in undone.summary("restored")
        assert svc.check() == []


def test_bulk_delete_skips_messages_edited_since_selection(tmp_path: Path) -> None:
    with MemoryService.open(tmp_path / "d") as svc:
        targets = [_write(svc, i, []) for i in range(3)]
        svc.update_message(message_id=targets[0].message_id, content="edited")
        result = delete_messages(svc, targets)
        assert result.changed == [targets[1].message_id, targets[2].message_id]
        assert result.conflicts == [targets[0].message_id]
        assert svc.get_system_health()["active_messages"] == 1
        assert "1 changed by another client meanwhile (kept, not deleted)" in result.summary(
            "deleted"
        )
        # the service checks the revision under its write lock: a stale one deletes nothing
        with pytest.raises(ConflictError):
            svc.delete_message(message_id=targets[0].message_id, expected_revision=1)
        assert svc.get_system_health()["active_messages"] == 1
        # a session guard that does not match: reported as gone, nothing deleted
        r = delete_messages(svc, [Target(targets[0].message_id, 2, "other-session")])
        assert r.missing == [targets[0].message_id]
        assert svc.get_system_health()["active_messages"] == 1
        assert BulkChange().empty and not BulkChange(importance=1).empty
