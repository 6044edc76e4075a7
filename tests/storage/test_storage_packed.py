"""The store's in-memory table (storage/packed.py) and the binary snapshot bodies (CMSNAP5
with its column blocks, and the older CMSNAP4, still read): every kind of message comes back
equal, the memory counts follow every change, a store whose snapshot is of an older layout
(CMSNAP3 JSON rows, CMSNAP4 binary rows) opens from it and writes the new one, and a crafted
body (CRCs recomputed) is refused whole, never half loaded."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from storage_helpers import (
    RICH_METADATA,
    dir_bytes,
    json_rows_snapshot,
    make_message,
    resign_snapshot,
)

from convmem_engine.domain import DEFAULT_METADATA, Message, Metadata
from convmem_engine.storage import FileSystem, Store, packed
from convmem_engine.storage import snapshot as snap
from convmem_engine.storage.packed import MessageTable

FIXTURE_V3 = Path(__file__).parent / "fixtures" / "store-v3"


def odd_messages() -> list[Message]:
    """One of each shape the table stores differently."""
    base = make_message("plain")
    return [
        base,
        make_message("ünïcödé ☃ 😀, a NUL \x00 and a\nnewline", session="s-ü"),
        make_message("rich", metadata=RICH_METADATA, session="s2"),
        make_message("tags only", metadata=Metadata(tags=("t",), importance=7)),
        Message("01JU", "s1", 5, "assistant", "edited", 3, 99, DEFAULT_METADATA),  # updated_at
        Message("01JR", "s1", 5, "tool", "a role not in ROLES", 1, 5, DEFAULT_METADATA),
        Message("01JS", "s1", 5, "user", "lone \udc80 surrogate", 1, 5, DEFAULT_METADATA),
        Message("01JB", "s1", 2**70, "user", "a huge timestamp", 2**40, -(2**70)),
        Message("01JE", "s1", -5, "system", "", 1, -5, DEFAULT_METADATA),
        make_message("x" * (5 << 20), session="big"),  # longer than a 4 MiB read
    ]


def test_every_shape_comes_back_equal_and_counted() -> None:
    table = MessageTable()
    msgs = odd_messages()
    for m in msgs:
        table.set(m)
    assert list(table.values()) == msgs
    assert [table.get(m.message_id) for m in msgs] == msgs
    assert dict(table.view) == {m.message_id: m for m in msgs}
    kept = [k for k, v in table.stored_items() if type(v) is not bytes]
    assert kept == ["01JR", "01JS", "01JB"]  # the ones the packed layout cannot hold
    assert [r for r in table.history_rows()] == [
        (m.message_id, m.session_id, m.metadata) for m in msgs
    ]
    with_md = [m for m in msgs if m.metadata != DEFAULT_METADATA]
    assert list(table.with_metadata()) == with_md
    frozen = table.frozen()
    table.set(Message("01JU", "s1", 5, "assistant", "edited again", 4, 100, DEFAULT_METADATA))
    assert list(frozen) == msgs and len(frozen) == len(msgs)  # the moment it was taken
    keys, taken = frozen.take()  # once, the snapshot's parts dropped as they are read
    assert keys == [m.message_id for m in msgs] and list(taken) == msgs
    assert len(frozen) == 0 and list(frozen) == []
    counted = table.memory()
    assert counted == table.recount()
    assert counted.body_bytes >= 5 << 20
    assert counted.metadata_bytes > 0
    for m in msgs:
        table.pop(m.message_id)
    assert table.memory().entry_bytes == table.memory().body_bytes == 0
    assert table.memory().metadata_bytes == 0 and len(table) == 0


def test_packed_value_is_header_plus_content() -> None:
    table = MessageTable()
    m = make_message("hello")
    table.set(m)
    v = dict(table.stored_items())[m.message_id]
    assert type(v) is bytes and len(v) == packed.HEAD_SIZE + 5 == 23
    assert v.endswith(b"hello")


def _snapshot_of(tmp_path: Path, msgs: list[Message], layout: int = snap.COLUMNS) -> Path:
    path = tmp_path / "s.bin"
    table = MessageTable()
    for m in msgs:
        table.set(m)
    fs = FileSystem()
    fd = fs.open_new(str(path))
    try:
        snap.write_snapshot_file(
            fs,
            fd,
            table,
            layout,
            generation=1,
            log_offset=1,
            log_prefix_crc32=0,
            last_sequence=1,
            record_count=1,
            deleted_records=0,
            update_records=0,
            live_bytes=0,
            count=len(table),
        )
    finally:
        fs.close(fd)
    return path


def _load(path: Path) -> MessageTable:
    fs = FileSystem()
    fd = fs.open_read(str(path))
    try:
        meta, _ = snap.read_meta(fs, fd)
        return snap.read_body(fs, fd, meta)
    finally:
        fs.close(fd)


@pytest.mark.parametrize("layout", [snap.COLUMNS, snap.BINARY])
def test_binary_snapshot_round_trip(tmp_path: Path, layout: int) -> None:
    msgs = odd_messages() + [make_message(f"m{i}", session=f"s{i % 7}") for i in range(20_000)]
    path = _snapshot_of(tmp_path, msgs, layout)
    assert path.read_bytes().startswith(b"CMSNAP%d\n" % layout)
    table = _load(path)
    assert list(table.values()) == msgs
    assert table.memory() == table.recount()
    s1 = {id(m.session_id) for m in table.values() if m.session_id == "s1"}
    assert len(s1) == 1  # one string per session


def _row(kind: int, a: bytes, b: bytes = b"") -> bytes:
    return packed.ROW.pack(kind, len(a), len(b)) + a + b


def _value(ts: int = 1, session: int = 0, role: int = 0, flags: int = 0, rev: int = 1) -> bytes:
    return packed.HEAD.pack(ts, session, role, flags, rev)


@pytest.mark.parametrize(
    "rows",
    [
        _row(0, b"m1", _value(session=1) + b"x"),  # no such session
        _row(0, b"m1", _value(role=3) + b"x"),  # no such role
        _row(0, b"m1", _value(flags=4) + b"x"),  # unknown flag
        _row(0, b"m1", _value()[:10]),  # value shorter than its header
        _row(0, b"m1", _value() + b"\xff"),  # content not UTF-8
        _row(0, b"\xff", _value() + b"x"),  # id not UTF-8
        _row(0, b"m1", _value(flags=1) + b"\x01"),  # updated_at missing
        _row(0, b"m1", _value(flags=2) + struct.pack("<I", 50) + b"[1]"),  # metadata cut
        _row(0, b"m1", _value(flags=2) + struct.pack("<I", 3) + b"[1]"),  # not a metadata row
        _row(2, b"s", b"x"),  # a session row with a value
        _row(2, b"s"),  # the session twice
        _row(1, b"", b'["m",1]'),  # a JSON row that is no message
        _row(9, b"", b""),  # unknown kind
        packed.ROW.pack(0, 5, 100) + b"short",  # cut short
    ],
)
@pytest.mark.parametrize("layout", [snap.COLUMNS, snap.BINARY])
def test_crafted_binary_rows_are_refused(tmp_path: Path, rows: bytes, layout: int) -> None:
    path = _snapshot_of(tmp_path, [make_message("a", session="s")], layout)
    data = path.read_bytes()
    body = _row(2, b"s") + rows
    path.write_bytes(resign_snapshot(data, body))
    with pytest.raises(snap.SnapshotError):
        _load(path)
    path.write_bytes(resign_snapshot(data, body[:0] + _row(2, b"s") + _row(0, b"m", _value())))
    assert [m.content for m in _load(path).values()] == [""]  # the same frame, well formed


def v3_store(tmp_path: Path) -> Path:
    d = tmp_path / "store"
    shutil.copytree(FIXTURE_V3, d)
    (d / "expected.json").unlink()
    os.chmod(d, 0o700)
    return d


def test_a_store_with_a_json_snapshot_opens_from_it_and_writes_binary(tmp_path: Path) -> None:
    expected = json.loads((FIXTURE_V3 / "expected.json").read_text("utf-8"))
    assert (FIXTURE_V3 / "snapshot.bin").read_bytes().startswith(b"CMSNAP3\n")
    d = v3_store(tmp_path)
    with Store.open(d) as s:
        assert s.take_open_changes() is not None  # the snapshot was loaded, the tail replayed
        assert s.stats().snapshot_valid is True
        assert [m.to_json() for m in s.messages.values()] == expected
        assert s.check() == []
    assert (d / "snapshot.bin").read_bytes().startswith(snap.MAGIC)
    with Store.open(d) as s:
        assert s.take_open_changes() == {}  # the new snapshot covers the whole log
        assert [m.to_json() for m in s.messages.values()] == expected
        assert s.check() == []


def test_a_json_snapshot_of_an_unchanged_log_is_rewritten_binary_at_close(tmp_path: Path) -> None:
    msgs = [make_message("a"), make_message("b", metadata=RICH_METADATA)]
    with Store.open(tmp_path) as s:
        for m in msgs:
            s.put(m)
    data = (tmp_path / "snapshot.bin").read_bytes()
    (tmp_path / "snapshot.bin").write_bytes(json_rows_snapshot(data, msgs))
    log = (tmp_path / "active.log").read_bytes()
    with Store.open(tmp_path) as s:
        assert s.take_open_changes() == {} and list(s.messages.values()) == msgs
    assert (tmp_path / "active.log").read_bytes() == log  # the log untouched
    again = (tmp_path / "snapshot.bin").read_bytes()
    assert again.startswith(snap.MAGIC) and again == data  # the same state, binary rows
    with Store.open(tmp_path) as s:
        assert list(s.messages.values()) == msgs and s.check() == []


def test_compaction_drops_deleted_messages_session_ids(tmp_path: Path) -> None:
    with Store.open(tmp_path) as s:
        keep = make_message("kept", session="session-kept")
        gone = make_message("gone", session="session-of-the-deleted")
        s.put(keep)
        s.put(gone)
        s.delete(gone.message_id)
        s.compact()
        s.put(make_message("after", session="session-new"))
        assert s.check() == []
    everything = dir_bytes(tmp_path)
    assert b"session-of-the-deleted" not in everything
    with Store.open(tmp_path) as s:
        assert [m.session_id for m in s.messages.values()] == ["session-kept", "session-new"]
        s.put(make_message("back", session="session-of-the-deleted"))  # a new number
        assert s.check() == []
    with Store.open(tmp_path) as s:
        assert [m.session_id for m in s.messages.values()] == [
            "session-kept",
            "session-new",
            "session-of-the-deleted",
        ]
        assert s.check() == []


def test_a_taken_snapshot_lets_go_of_each_part_once_read() -> None:
    parts: list[list[bytes | Message]] = [[b"a", b"b"], [b"c"], [b"d", b"e"]]
    values = packed._drained(parts)
    assert [next(values), next(values), next(values)] == [b"a", b"b", b"c"]
    assert parts == [[b"d", b"e"]]  # the parts read are gone
    assert list(values) == [b"d", b"e"] and parts == []
    table = packed.MessageTable()
    msgs = [
        Message(f"01J{i:05d}", f"s{i % 7}", i, "user", f"text {i}", 1, i, DEFAULT_METADATA)
        for i in range(2 * packed.FROZEN_PART + 5)
    ]
    for m in msgs:
        table.set(m)
    keys, taken = table.frozen().take()
    assert keys == [m.message_id for m in msgs] and list(taken) == msgs
