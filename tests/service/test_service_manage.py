"""delete_message, rebuild_index, get_system_health, change events, I/O failures, open/close."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from svc_helpers import io_counters, write
from tool_calls import ToolCalls

from convmem_engine.domain import BusyError, ConvMemError, StoreIOError, ValidationError
from convmem_engine.service import ChangeEvent, MemoryService
from convmem_engine.storage import FileSystem

MISSING = "01ARZ3NDEKTSV4RRFFQ69G5FAV"


# -- delete_message -----------------------------------------------------------------------------


def test_delete_is_invisible_everywhere_at_once(svc: MemoryService) -> None:
    keep = write(svc, "keep kiwi")
    gone = write(svc, "gone kiwi", relations=[{"type": "related_to", "message_id": keep}])
    assert svc.delete_message(message_id=gone) == {"status": "OK"}
    assert [m["message_id"] for m in svc.read_messages(session_id="s1")["history"]] == [keep]
    assert [r["message_id"] for r in svc.search_messages(query="kiwi")["results"]] == [keep]
    ctx = svc.read_messages(view="context", message_id=keep)
    assert ctx["chronological_context"] == {"before": [], "after": []}
    assert ctx["relations"] == [] and ctx["session"]["message_count"] == 1
    assert svc.read_messages(view="sessions")["sessions"][0]["message_count"] == 1
    health = svc.get_system_health()
    assert health["active_messages"] == 1 and health["deleted_messages"] == 1


def test_delete_not_found_is_a_result(svc: MemoryService) -> None:
    mid = write(svc, session="owner")
    before = io_counters(svc)
    assert svc.delete_message(message_id=MISSING) == {"status": "NOT_FOUND"}
    assert svc.delete_message(message_id=mid, session_id="someone-else") == {"status": "NOT_FOUND"}
    assert io_counters(svc) == before
    assert svc.delete_message(message_id=mid, session_id="owner") == {"status": "OK"}
    assert svc.delete_message(message_id=mid) == {"status": "NOT_FOUND"}


def test_delete_validation(svc: MemoryService) -> None:
    for kwargs, field in (
        ({"message_id": "bad"}, "message_id"),
        ({"message_id": MISSING.lower()}, "message_id"),
        ({"message_id": MISSING, "session_id": ""}, "session_id"),
        ({"message_id": MISSING, "session_id": "x" * 257}, "session_id"),
        ({"message_id": None}, "message_id"),
    ):
        with pytest.raises(ValidationError) as err:
            svc.delete_message(**kwargs)
        assert err.value.message.startswith(field)


# -- rebuild_index ------------------------------------------------------------------------------


def test_rebuild_result_and_effect(tmp_path: Path) -> None:
    svc = ToolCalls.open(tmp_path / "d")
    try:
        ids = [write(svc, f"secret-{i} text") for i in range(10)]
        for mid in ids[:4]:
            svc.delete_message(message_id=mid)
        svc.update_message(message_id=ids[5], content="changed text")
        before = svc.get_system_health()
        out = svc.rebuild_index()
        assert set(out) == {
            "status",
            "messages_indexed",
            "records_removed",
            "bytes_before",
            "bytes_after",
        }
        assert out["status"] == "OK" and out["messages_indexed"] == 6
        assert out["records_removed"] >= 4 + 4 + 1  # 4 PUT + 4 DEL of deleted, 1 old revision
        assert out["bytes_before"] == before["log_size"] > out["bytes_after"]
        after = svc.get_system_health()
        assert after["log_size"] == out["bytes_after"]
        assert after["deleted_messages"] == 0 and after["dead_bytes"] == 0
        assert after["active_messages"] == 6 and after["session_count"] == 1
        assert [m["message_id"] for m in svc.read_messages(session_id="s1")["history"]] == ids[4:]
        assert svc.search_messages(query="secret-0")["results"] == []
        assert svc.check() == []
    finally:
        svc.close()
    # deleted content exists nowhere in the data dir
    for name in os.listdir(tmp_path / "d"):
        assert b"secret-0" not in (tmp_path / "d" / name).read_bytes()


def test_rebuild_on_empty_store(svc: MemoryService) -> None:
    out = svc.rebuild_index()
    assert out["status"] == "OK" and out["messages_indexed"] == 0


def test_rebuild_makes_other_requests_wait(svc: MemoryService) -> None:
    for i in range(200):
        write(svc, f"m{i}")
    seen: list[int] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            out = svc.read_messages(session_id="s1", limit=1000)
            seen.append(len(out["history"]))

    t = threading.Thread(target=reader)
    t.start()
    for _ in range(3):
        svc.rebuild_index()
    stop.set()
    t.join()
    assert seen and set(seen) == {200}  # never a half-built index


# -- get_system_health --------------------------------------------------------------------------


def test_health_fields(svc: MemoryService) -> None:
    seq0 = svc.get_system_health()["last_sequence"]  # the log starts with a generation record
    write(svc, "a", session="x")
    write(svc, "b", session="y", tags=["t"], summary="s")
    h = svc.get_system_health()
    assert set(h) == {
        "status",
        "format_version",
        "log_size",
        "snapshot_size",
        "active_messages",
        "session_count",
        "deleted_messages",
        "last_sequence",
        "update_records",
        "dead_bytes",
        "memory_estimate",
        "io",
        "recovered_tail",
        "snapshot_valid",
        "last_error",
    }
    assert h["status"] == "OK" and h["last_error"] == "" and h["format_version"] == 3
    assert h["active_messages"] == 2 and h["session_count"] == 2 and h["last_sequence"] == seq0 + 2
    assert h["log_size"] > 0 and h["update_records"] == 0 and h["deleted_messages"] == 0
    assert set(h["io"]) == {
        "write_bytes",
        "write_calls",
        "flush_calls",
        "truncate_calls",
        "replace_calls",
    }
    est = h["memory_estimate"]
    parts = [
        "store_entries_bytes",
        "body_bytes",
        "metadata_bytes",
        "search_index_bytes",
        "history_index_bytes",
        "relation_index_bytes",
    ]
    assert set(est) == {"total_bytes", *parts}
    assert est["total_bytes"] == sum(est[p] for p in parts)
    assert all(est[p] > 0 for p in parts)
    assert isinstance(h["recovered_tail"], bool) and isinstance(h["snapshot_valid"], bool)


def test_memory_estimate_tracks_contents(svc: MemoryService) -> None:
    empty = svc.get_system_health()["memory_estimate"]
    mid = write(svc, "x" * 100_000, tags=["a" * 100])
    grown = svc.get_system_health()["memory_estimate"]
    assert grown["body_bytes"] - empty["body_bytes"] >= 100_000
    assert grown["metadata_bytes"] > empty["metadata_bytes"]
    svc.delete_message(message_id=mid)
    shrunk = svc.get_system_health()["memory_estimate"]
    assert shrunk["body_bytes"] == empty["body_bytes"]
    assert shrunk["metadata_bytes"] == empty["metadata_bytes"]


def test_health_counts_after_updates_and_reopen(tmp_path: Path) -> None:
    svc = ToolCalls.open(tmp_path / "d")
    mid = write(svc)
    svc.update_message(message_id=mid, content="v2")
    svc.delete_message(message_id=write(svc, session="other"))
    h = svc.get_system_health()
    assert (h["update_records"], h["deleted_messages"], h["session_count"]) == (1, 1, 1)
    svc.close()
    svc = ToolCalls.open(tmp_path / "d")
    try:
        h2 = svc.get_system_health()
        assert (h2["update_records"], h2["deleted_messages"], h2["session_count"]) == (1, 1, 1)
        assert h2["active_messages"] == 1 and h2["last_sequence"] == h["last_sequence"]
    finally:
        svc.close()


# -- I/O failures -------------------------------------------------------------------------------


class FailingFS(FileSystem):
    """Real filesystem; fails the next write or fsync when armed."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_write = False
        self.fail_fsync = False

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if self.fail_write:
            self.fail_write = False
            raise OSError(28, "No space left on device")
        return super().write(fd, data)

    def fsync(self, fd: int) -> None:
        if self.fail_fsync:
            self.fail_fsync = False
            raise OSError(5, "Input/output error")
        super().fsync(fd)


def test_failed_write_leaves_indexes_matching_the_store(tmp_path: Path) -> None:
    fs = FailingFS()
    svc = ToolCalls.open(tmp_path / "d", fs=fs)
    try:
        keep = write(svc, "kept alpha")
        fs.fail_write = True
        with pytest.raises(StoreIOError) as err:
            write(svc, "lost alpha")
        assert err.value.code == "IO_ERROR"
        assert svc.check() == []
        assert [r["message_id"] for r in svc.search_messages(query="alpha")["results"]] == [keep]
        assert svc.get_system_health()["active_messages"] == 1
        fs.fail_write = True
        with pytest.raises(StoreIOError):
            svc.update_message(message_id=keep, content="new")
        fs.fail_write = True
        with pytest.raises(StoreIOError):
            svc.delete_message(message_id=keep)
        assert svc.read_messages(session_id="s1")["history"][0]["content"] == "kept alpha"
        assert svc.check() == []
        h = svc.get_system_health()
        assert h["status"] == "DEGRADED" and h["last_error"]
    finally:
        svc.close()


def test_failed_fsync_reports_io_error_and_degraded(tmp_path: Path) -> None:
    fs = FailingFS()
    svc = ToolCalls.open(tmp_path / "d", fs=fs)
    try:
        write(svc, "first")
        fs.fail_fsync = True
        with pytest.raises(StoreIOError):
            write(svc, "second")
        assert svc.check() == []  # the indexes match the store's state
        h = svc.get_system_health()
        assert h["status"] == "DEGRADED" and h["last_error"]
        with pytest.raises(StoreIOError):  # the store refuses writes until reopened
            write(svc, "third")
        assert svc.check() == []
    finally:
        svc.close()
    svc = ToolCalls.open(tmp_path / "d")
    try:
        assert svc.get_system_health()["status"] == "OK"
        assert svc.check() == []
    finally:
        svc.close()


# -- events, open, close ------------------------------------------------------------------------


def test_change_events(svc: MemoryService) -> None:
    events: list[ChangeEvent] = []
    unsubscribe = svc.subscribe(events.append)

    def boom(_event: ChangeEvent) -> None:
        raise RuntimeError("subscriber bug")

    unsubscribe_boom = svc.subscribe(boom)
    mid = write(svc, session="e")
    svc.update_message(message_id=mid, content="v2")
    svc.update_message(message_id=mid, content="v2")  # no-op: no event
    svc.delete_message(message_id=MISSING)  # nothing deleted: no event
    svc.delete_message(message_id=mid)
    svc.rebuild_index()
    assert events == [
        ChangeEvent("write", mid, "e"),
        ChangeEvent("update", mid, "e"),
        ChangeEvent("delete", mid, "e"),
        ChangeEvent("rebuild", None, None),
    ]
    unsubscribe()
    unsubscribe_boom()
    write(svc)
    assert len(events) == 4


def test_second_open_is_busy_and_close_is_idempotent(tmp_path: Path) -> None:
    svc = ToolCalls.open(tmp_path / "d")
    try:
        with pytest.raises(BusyError):
            ToolCalls.open(tmp_path / "d")
    finally:
        svc.close()
        svc.close()
    with pytest.raises(ConvMemError):
        svc.get_system_health()
    with ToolCalls.open(tmp_path / "d") as again:
        assert again.get_system_health()["status"] == "OK"


def call_every_tool(svc: MemoryService, mid: str) -> list[dict[str, Any]]:
    return [
        svc.read_messages(session_id="s1"),
        svc.read_messages(view="content", message_id=mid),
        svc.read_messages(view="context", message_id=mid),
        svc.read_messages(view="sessions"),
        svc.search_messages(query="hello"),
        svc.get_system_health(),
    ]


def test_everything_survives_reopen(tmp_path: Path) -> None:
    svc = ToolCalls.open(tmp_path / "d")
    a = write(svc, "hello a", tags=["t"], summary="sum")
    write(svc, "hello b", relations=[{"type": "depends_on", "message_id": a}])
    first = call_every_tool(svc, a)
    svc.close()
    svc = ToolCalls.open(tmp_path / "d")
    try:
        again = call_every_tool(svc, a)
        for x, y in zip(first[:-1], again[:-1], strict=True):
            assert x == y
        assert svc.check() == []
    finally:
        svc.close()
