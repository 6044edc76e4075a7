"""JSONL export is lossless (ids, times, revisions, metadata); Markdown is one file a session."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from export_samples import chatgpt_export, write_json
from tool_calls import ToolCalls

from convmem_engine.domain.errors import NotFoundError
from convmem_engine.service import MemoryService
from convmem_engine.transfer import (
    ExportCancelled,
    export_jsonl,
    export_markdown,
    run_import,
)
from convmem_engine.transfer.exporter import markdown_name


def fill(svc: MemoryService) -> None:
    """Messages with every kind of metadata, updates (revision > 1) and a delete."""
    tools = ToolCalls(svc)  # metadata as a host sends it
    ids = []
    for i in range(30):
        md: dict[str, Any] = {
            "tags": [f"t{i % 3}", "ünïcode"],
            "importance": i,
            "memory_tier": "mid",
        }
        if i % 5 == 0:
            md["summary"] = f"summary {i}"
        if i % 7 == 0:
            md["tool_call_id"] = ""
        if ids:
            md["relations"] = [{"type": "depends_on", "message_id": ids[-1]}]
            md["source_message_ids"] = ids[-2:]
        r = tools.write_message(
            session_id=f"s{i % 4}",
            role=("user", "assistant", "system")[i % 3],
            content=f'message {i} 日本語 \u2028 "quoted"\n',
            metadata_json=json.dumps(md),
        )
        ids.append(r["message"]["message_id"])
    svc.update_message(message_id=ids[3], content="edited once")
    tools.update_message(message_id=ids[3], metadata_json='{"memory_kind": "procedure"}')
    svc.delete_message(message_id=ids[4])


def everything(svc: MemoryService) -> dict[str, dict[str, Any]]:
    out = {}
    cursor = None
    while True:
        page = svc.read_messages(view="sessions", limit=1000, cursor=cursor)
        for s in page["sessions"]:
            c2 = None
            while True:
                h = svc.read_messages(
                    view="history", session_id=s["session_id"], limit=1000, cursor=c2
                )
                for m in h["history"]:
                    out[m["message_id"]] = m
                c2 = h.get("nextCursor")
                if c2 is None:
                    break
        cursor = page.get("nextCursor")
        if cursor is None:
            return out


def test_jsonl_roundtrip_is_lossless_and_idempotent(svc: MemoryService, tmp_path: Path) -> None:
    fill(svc)
    out = tmp_path / "export.jsonl"
    report = export_jsonl(svc, out)
    assert (report.messages, report.sessions) == (29, 4)
    if os.name != "nt":
        assert out.stat().st_mode & 0o777 == 0o600
    with MemoryService.open(tmp_path / "other") as other:
        imported = run_import(out, service=other)
        assert (imported.format, imported.messages, imported.skipped_total) == ("jsonl", 29, 0)
        assert everything(other) == everything(svc)
        assert run_import(out, service=other).messages == 0
        assert other.check() == []
    # into the store it came from: nothing added
    assert run_import(out, service=svc).skipped["already in the store"] == 29


def test_jsonl_session_export_and_unknown_session(svc: MemoryService, tmp_path: Path) -> None:
    fill(svc)
    report = export_jsonl(svc, tmp_path / "s1.jsonl", session_id="s1")
    lines = (tmp_path / "s1.jsonl").read_text(encoding="utf-8").split("\n")[:-1]
    assert json.loads(lines[0])["convmem_export"] == 1
    assert {json.loads(x)["session_id"] for x in lines[1:]} == {"s1"}
    assert report.messages == len(lines) - 1 == 8
    with pytest.raises(NotFoundError, match="session: no session"):
        export_jsonl(svc, tmp_path / "none.jsonl", session_id="nope")
    assert not (tmp_path / "none.jsonl").exists()


def test_jsonl_bad_lines_are_reported_by_number(svc: MemoryService, tmp_path: Path) -> None:
    fill(svc)
    out = tmp_path / "e.jsonl"
    export_jsonl(svc, out)
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    good = json.loads(lines[2])
    bad_role = dict(good, message_id="01ARZ3NDEKTSV4RRFFQ69G5FAV", role="robot")
    bad_meta = dict(good, message_id="01ARZ3NDEKTSV4RRFFQ69G5FAW", metadata={"importance": 101})
    lines[1:1] = ["{oops", json.dumps(bad_role), json.dumps(bad_meta), lines[3]]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with MemoryService.open(tmp_path / "other") as other:
        report = run_import(out, service=other)
        assert report.messages == 29
        assert [(p.position, p.reason.split(";")[0]) for p in report.problems] == [
            ("line 2", "not valid JSON (or not UTF-8)"),
            ("line 3", "role: must be one of user / assistant / system"),
            ("line 4", "metadata.importance: must be between 0 and 100"),
            ("line 8", "message_id: duplicate of line 5"),
        ]


def test_export_cancel_writes_nothing(svc: MemoryService, tmp_path: Path) -> None:
    src = tmp_path / "src.json"
    write_json(src, chatgpt_export(50, 50))
    assert run_import(src, service=svc).messages == 2500
    src.unlink()
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(ExportCancelled):
        export_jsonl(svc, tmp_path / "x.jsonl", cancel=cancel)
    assert os.listdir(tmp_path) == ["data"]


def test_markdown_one_readable_file_a_session(svc: MemoryService, tmp_path: Path) -> None:
    fill(svc)
    svc.write_message(session_id="odd/..\\name:*?", role="user", content="# not a heading of ours")
    report = export_markdown(svc, tmp_path / "md")
    files = sorted(os.listdir(tmp_path / "md"))
    assert report.files == len(files) == 5
    assert markdown_name("odd/..\\name:*?") in files
    text = (tmp_path / "md" / markdown_name("s1")).read_text(encoding="utf-8")
    assert text.startswith("# s1\n")
    assert text.count("\n## ") == 8
    assert "edited once" in (tmp_path / "md" / markdown_name("s3")).read_text(encoding="utf-8")
    assert "tags: t1, ünïcode" in text
