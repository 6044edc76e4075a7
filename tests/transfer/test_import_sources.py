"""Import of ChatGPT, Claude and memory.json exports into a real MemoryService (real files)."""

from __future__ import annotations

import json
import random
import zipfile
from pathlib import Path
from typing import Any

import pytest
from export_samples import (
    ChatGPTBuilder,
    chatgpt_export,
    chatgpt_rich_conversation,
    claude_conversation,
    memory_graph_lines,
    text_content,
    write_json,
)

from convmem_engine.domain import limits
from convmem_engine.service import MemoryService
from convmem_engine.transfer import ImportFormatError, run_import


def history(svc: MemoryService, session: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = svc.read_messages(view="history", session_id=session, limit=1000, cursor=cursor)
        out += page["history"]
        cursor = page.get("nextCursor")
        if cursor is None:
            return out


def sessions(svc: MemoryService) -> list[dict[str, Any]]:
    return list(svc.read_messages(view="sessions", limit=1000)["sessions"])


def test_chatgpt_keeps_only_the_current_branch_in_order(svc: MemoryService, tmp_path: Path) -> None:
    conv, expected = chatgpt_rich_conversation(random.Random(5))
    path = tmp_path / "conversations.json"
    write_json(path, [conv])
    report = run_import(path, service=svc)
    assert report.format == "chatgpt"
    assert (report.conversations, report.messages) == (1, len(expected))
    hist = history(svc, f"chatgpt:{conv['id']}")
    assert [(m["role"], m["content"]) for m in hist] == expected
    # off-branch (regenerated, edited), hidden, and reasoning are skipped and counted
    assert report.skipped["not on the conversation's current branch (regenerated or edited)"] == 2
    assert report.skipped["hidden from the conversation (system or context message)"] == 2
    assert report.skipped["the model's hidden reasoning (not part of the conversation)"] == 1
    # original times kept; the title is the session's summary; the source is in the tags
    by_content = {m["content"]: m for m in hist}
    first = by_content["Plan three days in Lisbon for me."]
    assert first["timestamp"] == round((1_714_000_000.25 + 1.5) * 1000)
    assert first["metadata"]["summary"] == "Planning a trip to Lisbon"
    assert sessions(svc)[0]["representative_summary"] == "Planning a trip to Lisbon"
    assert all("import:chatgpt" in m["metadata"]["tags"] for m in hist)
    # tool output is never the user's words
    tool = by_content["Carris: a single tram 28 ticket costs 3.10 EUR on board."]
    assert tool["role"] == "system"
    assert {"tool-output", "tool:browser"} <= set(tool["metadata"]["tags"])
    assert "tool-call" in by_content["search('Lisbon tram 28 ticket price')"]["metadata"]["tags"]
    # two messages in the same millisecond keep their order and their equal timestamps
    assert hist[-1]["timestamp"] == hist[-2]["timestamp"]
    assert hist[-1]["message_id"] > hist[-2]["message_id"]


def test_reimport_adds_nothing_and_dry_run_predicts_the_import(
    svc: MemoryService, tmp_path: Path
) -> None:
    path = tmp_path / "conversations.json"
    write_json(path, chatgpt_export(12, 9))
    dry = run_import(path, service=svc, dry_run=True)
    assert svc.get_system_health()["active_messages"] == 0
    real = run_import(path, service=svc)
    assert (dry.conversations, dry.messages) == (real.conversations, real.messages) == (12, 108)
    assert dry.skipped == real.skipped
    again = run_import(path, service=svc)
    assert (again.messages, again.conversations) == (0, 0)
    assert again.skipped["already in the store"] == 108
    assert svc.get_system_health()["active_messages"] == 108


def test_chatgpt_zip_and_crlf_bom_files(svc: MemoryService, tmp_path: Path) -> None:
    data = chatgpt_export(2, 4, seed=9)
    plain = tmp_path / "plain.json"
    write_json(plain, data, crlf=True, bom=True)
    zipped = tmp_path / "chatgpt-export.zip"
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("chat.html", "<html></html>")
        z.writestr("conversations.json", json.dumps(data))
    assert run_import(plain, service=svc).messages == 8
    assert run_import(zipped, service=svc).skipped["already in the store"] == 8


def test_claude_messages_follow_created_at_not_file_order(
    svc: MemoryService, tmp_path: Path
) -> None:
    rng = random.Random(3)
    texts = [
        ("human", "first question"),
        ("assistant", "first answer"),
        ("human", "second"),
        ("assistant", "last"),
    ]
    conv = claude_conversation(rng, "Garden planning", texts, 1_700_000_000.0)
    conv["chat_messages"].reverse()
    conv["chat_messages"][0]["attachments"] = [
        {
            "file_name": "notes.txt",
            "file_size": 5,
            "file_type": "txt",
            "extracted_content": "tomatoes",
        }
    ]
    path = tmp_path / "conversations.json"
    write_json(path, [conv])
    report = run_import(path, service=svc)
    assert (report.format, report.messages) == ("claude", 4)
    hist = history(svc, f"claude:{conv['uuid']}")
    assert [m["role"] for m in hist] == ["user", "assistant", "user", "assistant"]
    assert [m["content"].split("\n")[0] for m in hist] == [
        "first question",
        "first answer",
        "second",
        "last",
    ]
    assert hist[-1]["content"] == "last\n\n[attachment: notes.txt]\ntomatoes"
    assert hist[0]["metadata"]["summary"] == "Garden planning"
    assert hist[0]["timestamp"] == 1_700_000_000_000
    assert run_import(path, service=svc).messages == 0


def test_memory_json_every_entity_observation_and_relation_is_found(
    svc: MemoryService, tmp_path: Path
) -> None:
    path = tmp_path / "memory.json"
    path.write_text("\n".join(memory_graph_lines()) + "\n", encoding="utf-8")
    report = run_import(path, service=svc)
    assert (report.format, report.messages, report.conversations) == ("memory-json", 5, 1)
    for query in (
        "Ada_Lovelace",
        "person",
        "Wrote the first program",
        "Prefers tea over coffee",
        "Analytical Engine",
        "machine",
        "Charles Babbage",
        "Zürich office",
        "organization",
        "wrote_programs_for",
        "visits",
    ):
        hits = svc.search_messages(query=query)["results"]
        assert hits, query
    rel = svc.search_messages(query="wrote_programs_for")["results"][0]
    targets = {r["message_id"] for r in rel["metadata"]["relations"]}
    ada = svc.search_messages(query="Prefers tea")["results"][0]
    assert ada["message_id"] in targets and len(targets) == 2
    assert rel["metadata"]["memory_kind"] == "semantic"
    again = run_import(path, service=svc)
    assert again.messages == 0 and again.skipped["already in the store"] == 5


def test_over_limit_message_is_reported_with_its_position_never_truncated(
    svc: MemoryService, tmp_path: Path
) -> None:
    rng = random.Random(1)
    b = ChatGPTBuilder(rng, "big", 1_700_000_000.0)
    u = b.msg(b.root, "user", text_content("before"), 1.0)
    big = b.msg(u, "assistant", text_content("x" * (2 * limits.MIB)), 2.0)
    after = b.msg(big, "user", text_content("after"), 3.0)
    path = tmp_path / "c.json"
    write_json(path, [b.done(after)])
    report = run_import(path, service=svc)
    assert report.messages == 2
    [problem] = report.problems
    assert problem.position == "conversation 1, message 2"
    assert "content: must be at most 1048576 UTF-8 bytes" in problem.reason
    assert all(len(m["content"]) < 100 for m in history(svc, f"chatgpt:{b.conv_id}"))


def test_bad_records_are_reported_by_line(svc: MemoryService, tmp_path: Path) -> None:
    lines = memory_graph_lines()
    lines.insert(1, "{not json")
    lines.insert(
        3, json.dumps({"type": "entity", "name": "", "entityType": "x", "observations": []})
    )
    lines.insert(4, json.dumps({"type": "spaceship"}))
    path = tmp_path / "memory.json"
    path.write_text("\n".join(lines), encoding="utf-8")
    report = run_import(path, service=svc)
    assert report.messages == 5
    assert [(p.position, p.reason) for p in report.problems] == [
        ("line 2", "not valid JSON"),
        ("line 4", "name, entityType: must be strings (name not empty)"),
        ("line 5", "type: must be entity or relation"),
    ]


def test_unknown_content_is_refused_without_storing(svc: MemoryService, tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text('[{"hello": 1}]', encoding="utf-8")
    with pytest.raises(ImportFormatError, match="not of ChatGPT or Claude"):
        run_import(path, service=svc)
    path.write_text("[1, 2", encoding="utf-8")
    with pytest.raises(ImportFormatError, match=r"not valid JSON \(line 1"):
        run_import(path, service=svc)
    path.write_text("plain text", encoding="utf-8")
    with pytest.raises(ImportFormatError, match="use --format"):
        run_import(path, service=svc)
    assert svc.get_system_health()["active_messages"] == 0


def test_cancel_stops_between_batches_and_a_rerun_completes(
    svc: MemoryService, tmp_path: Path
) -> None:
    import threading

    path = tmp_path / "conversations.json"
    write_json(path, chatgpt_export(300, 10))
    cancel = threading.Event()

    def progress(done: int, total: int) -> None:
        if done >= total // 2:
            cancel.set()

    first = run_import(path, service=svc, progress=progress, cancel=cancel)
    assert first.cancelled and 0 < first.messages < 3000
    second = run_import(path, service=svc)
    assert second.messages == 3000 - first.messages
    assert svc.get_system_health()["active_messages"] == 3000


def test_derived_ids_are_canonical_ulids_that_sort_by_time() -> None:
    from ulid import ULID

    from convmem_engine.domain import validation as v
    from convmem_engine.transfer.records import make_id, random_bits_of

    rng = random.Random(7)
    for _ in range(500):
        ms, bits = rng.randrange(1 << 48), rng.getrandbits(80)
        mid = make_id(ms, bits)
        assert (
            v.message_id(mid)
            == mid
            == str(ULID.from_bytes(((ms << 80) | bits).to_bytes(16, "big")))
        )
        assert random_bits_of(mid) == bits
    assert make_id(5, (1 << 80) - 1) < make_id(6, 0)
