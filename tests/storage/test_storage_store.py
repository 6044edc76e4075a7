"""The Store API: writes, reads, stats, compaction, close/reopen, group commit."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from storage_helpers import RICH_METADATA, dir_bytes, make_message

from convmem_engine.domain import (
    DEFAULT_METADATA,
    ConflictError,
    InternalError,
    Message,
    Metadata,
    NotFoundError,
    StoreIOError,
    ValidationError,
)
from convmem_engine.storage import CompactionResult, FileSystem, Store


def edited(m: Message, content: str) -> Message:
    return Message(
        m.message_id,
        m.session_id,
        m.timestamp,
        m.role,
        content,
        m.revision + 1,
        m.updated_at + 1,
        m.metadata,
    )


def test_put_update_delete_and_order(tmp_path: Path) -> None:
    with Store.open(tmp_path) as s:
        a, b, c = (make_message(x) for x in "abc")
        seqs = [s.put(a), s.put(b), s.put(c)]
        assert seqs == sorted(seqs) and len(set(seqs)) == 3
        s.update(edited(a, "a2"))
        s.delete(b.message_id)
        assert [m.content for m in s.messages.values()] == ["a2", "c"]
        assert s.get(b.message_id) is None
        assert s.get(a.message_id) == edited(a, "a2")
        with pytest.raises(TypeError):
            s.messages[a.message_id] = a  # type: ignore[index]
        assert s.check() == []
    with Store.open(tmp_path) as s:
        assert [m.content for m in s.messages.values()] == ["a2", "c"]
        assert s.check() == []


def test_messages_round_trip_exactly(tmp_path: Path) -> None:
    msgs = [make_message("x", metadata=RICH_METADATA), make_message("y ☃\u2028\x01")]
    with Store.open(tmp_path) as s:
        for m in msgs:
            s.put(m)
    for _ in range(2):  # once from the snapshot, once from a full replay
        with Store.open(tmp_path) as s:
            assert list(s.messages.values()) == msgs
        (tmp_path / "snapshot.bin").unlink()


def test_default_metadata_is_shared(tmp_path: Path) -> None:
    m = make_message("x", metadata=Metadata())
    assert m.metadata is not DEFAULT_METADATA
    with Store.open(tmp_path) as s:
        s.put(m)
        assert s.get(m.message_id) == m
        assert s.get(m.message_id).metadata is DEFAULT_METADATA  # type: ignore[union-attr]
    (tmp_path / "snapshot.bin").unlink()
    with Store.open(tmp_path) as s:
        assert s.get(m.message_id).metadata is DEFAULT_METADATA  # type: ignore[union-attr]


def test_write_preconditions(tmp_path: Path) -> None:
    with Store.open(tmp_path) as s:
        m = make_message("x")
        s.put(m)
        size = s.stats().log_size
        with pytest.raises(ConflictError):
            s.put(m)
        with pytest.raises(NotFoundError):
            s.update(make_message("never written"))
        with pytest.raises(NotFoundError):
            s.delete("01JNOPE")
        with pytest.raises(ValidationError, match="Unicode"):
            s.put(make_message("lone \ud800 surrogate"))
        assert s.stats().log_size == size
        with pytest.raises(InternalError):
            s.sync(s.stats().last_sequence + 10)
        s.delete(m.message_id)
        s.put(m)  # an id may come back after its deletion
        assert list(s.messages) == [m.message_id]
    with Store.open(tmp_path) as s:
        assert list(s.messages) == [m.message_id]
        assert s.check() == []


def test_stats_counters(tmp_path: Path) -> None:
    with Store.open(tmp_path) as s:
        st0 = s.stats()
        assert (st0.deleted_messages, st0.update_records, st0.dead_bytes) == (0, 0, 0)
        assert st0.recovered_tail is False and st0.snapshot_valid is True and st0.last_error == ""
        a, b = make_message("a" * 100), make_message("b" * 100)
        s.put(a)
        s.put(b)
        st1 = s.stats()
        assert st1.last_sequence == st0.last_sequence + 2
        assert st1.io.write_calls == st0.io.write_calls + 2
        assert st1.io.flush_calls == st0.io.flush_calls + 2
        assert st1.io.write_bytes - st0.io.write_bytes == st1.log_size - st0.log_size
        assert st1.dead_bytes == 0
        size_before_update = st1.log_size
        s.update(edited(a, "a2"))
        st2 = s.stats()
        put_a_size = st2.dead_bytes
        assert st2.update_records == 1 and put_a_size > 100
        s.delete(b.message_id)
        st3 = s.stats()
        assert st3.deleted_messages == 1
        # dead: PUT a, PUT b (both superseded/deleted) and the DEL b tombstone
        both_puts = size_before_update - st0.log_size
        del_b = st3.log_size - st2.log_size
        assert st3.dead_bytes == both_puts + del_b
        res = s.compact()
        assert res == CompactionResult(
            messages=1, records_removed=3, bytes_before=st3.log_size, bytes_after=res.bytes_after
        )
        st4 = s.stats()
        assert (st4.deleted_messages, st4.update_records, st4.dead_bytes) == (0, 0, 0)
        assert st4.log_size == res.bytes_after
        assert st4.io.replace_calls == st3.io.replace_calls + 2
        assert st4.snapshot_size == os.path.getsize(tmp_path / "snapshot.bin")
        assert st4.last_sequence > st3.last_sequence
        assert s.check() == []


def test_reads_do_not_count_io(tmp_path: Path) -> None:
    with Store.open(tmp_path) as s:
        s.put(make_message("x"))
        before = s.stats().io
        list(s.messages.values())
        s.get("x")
        s.stats()
        assert s.check() == []
        assert s.stats().io == before


def test_compaction_removes_deleted_content_from_every_file(tmp_path: Path) -> None:
    secret = "SECRET-CONTENT-7f3a9"
    old_secret = "OLD-REVISION-b41c"
    with Store.open(tmp_path) as s:
        keep = make_message("keep me")
        gone = make_message(f"{secret} in a message")
        upd = make_message(f"{old_secret} first version")
        for m in (keep, gone, upd):
            s.put(m)
        s.close()
    with Store.open(tmp_path) as s:  # the snapshot now holds the secret too
        s.delete(gone.message_id)
        s.update(edited(upd, "second version"))
        assert secret.encode() in dir_bytes(tmp_path)
        s.compact()
        data = dir_bytes(tmp_path)
        assert secret.encode() not in data
        assert old_secret.encode() not in data
        assert b"keep me" in data
        assert sorted(os.listdir(tmp_path)) == ["active.log", "lock", "lock.pid", "snapshot.bin"]
        assert [m.content for m in s.messages.values()] == ["keep me", "second version"]
        s.put(make_message("after compaction"))
        assert s.check() == []
    assert secret.encode() not in dir_bytes(tmp_path)
    with Store.open(tmp_path) as s:
        assert s.stats().snapshot_valid
        assert [m.content for m in s.messages.values()] == [
            "keep me",
            "second version",
            "after compaction",
        ]
        assert s.check() == []


def test_compaction_of_an_empty_store_and_twice(tmp_path: Path) -> None:
    with Store.open(tmp_path) as s:
        r = s.compact()
        assert r.messages == 0 and r.records_removed == 0
        s.put(make_message("x"))
        s.compact()
        s.compact()
        assert s.check() == []


def test_close_writes_a_snapshot_only_when_needed_and_is_idempotent(tmp_path: Path) -> None:
    s = Store.open(tmp_path)
    s.put(make_message("x"))
    s.close()
    s.close()
    mtime = os.stat(tmp_path / "snapshot.bin").st_mtime_ns
    replaces = None
    s = Store.open(tmp_path)
    replaces = s.stats().io.replace_calls
    s.close()
    assert os.stat(tmp_path / "snapshot.bin").st_mtime_ns == mtime
    assert replaces == 0
    with pytest.raises(StoreIOError, match="closed"):
        s.put(make_message("y"))


def test_open_with_snapshot_reports_stats_of_the_log(tmp_path: Path) -> None:
    with Store.open(tmp_path) as s:
        a = make_message("a")
        s.put(a)
        s.put(make_message("b"))
        s.update(edited(a, "a2"))
        s.delete(a.message_id)
        expect = s.stats()
    with Store.open(tmp_path) as s:
        got = s.stats()
        for field in (
            "log_size",
            "deleted_messages",
            "last_sequence",
            "update_records",
            "dead_bytes",
        ):
            assert getattr(got, field) == getattr(expect, field), field
        assert got.snapshot_size > 0


class GatedFS(FileSystem):
    """fsync waits for a gate, so the test decides when the first fsync finishes."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.fsync_calls = 0
        self.gated = False

    def fsync(self, fd: int) -> None:
        self.fsync_calls += 1
        if self.gated:
            self.entered.set()
            assert self.gate.wait(10)
        super().fsync(fd)


def test_group_commit_one_fsync_covers_every_record_written_before_it(tmp_path: Path) -> None:
    fs = GatedFS()
    s = Store.open(tmp_path, fs=fs)
    try:
        fs.gated = True
        base = fs.fsync_calls
        first = s.write_put(make_message("leader"))
        errors: list[BaseException] = []

        def sync(seq: int) -> None:
            try:
                s.sync(seq)
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        leader = threading.Thread(target=sync, args=(first,))
        leader.start()
        assert fs.entered.wait(10)  # the leader is inside fsync, gate closed
        # followers write while the leader's fsync is running: not covered by it
        seqs = [s.write_put(make_message(f"follower {i}")) for i in range(5)]
        followers = [threading.Thread(target=sync, args=(q,)) for q in seqs]
        for t in followers:
            t.start()
        fs.gate.set()
        leader.join(10)
        for t in followers:
            t.join(10)
        assert not errors
        # one fsync for the leader, then exactly one for all five followers
        assert fs.fsync_calls - base == 2
        s.sync(seqs[-1])  # already durable: no new fsync
        assert fs.fsync_calls - base == 2
    finally:
        fs.gated = False
        s.close()


def test_concurrent_writers_all_durable_and_consistent(tmp_path: Path) -> None:
    s = Store.open(tmp_path)
    written: list[Message] = []
    lock = threading.Lock()

    def run(k: int) -> None:
        for i in range(25):
            m = make_message(f"t{k} m{i}", session=f"s{k}")
            s.put(m)
            with lock:
                written.append(m)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    st = s.stats()
    assert st.io.write_calls >= 200
    assert s.check() == []
    s.close()
    with Store.open(tmp_path) as s2:
        assert {m.message_id: m for m in written} == dict(s2.messages)
        assert s2.check() == []


def test_ids_that_would_break_the_format_are_refused(tmp_path: Path) -> None:
    with Store.open(tmp_path) as s:
        before = s.stats()
        for bad in ("", "01J\0"):
            with pytest.raises(ValidationError, match="message_id"):
                s.put(Message(bad, "s", 1, "user", "x"))
            with pytest.raises(ValidationError, match="message_id"):
                s.delete(bad)
        assert s.stats().io == before.io and s.stats().log_size == before.log_size
