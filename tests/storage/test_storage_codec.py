"""The record codec and the snapshot file format: round trips and rejection of bad headers."""

from __future__ import annotations

import os
import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from storage_helpers import RICH_METADATA, make_message

from convmem_engine.domain import DEFAULT_METADATA, Message, Metadata, Relation
from convmem_engine.storage import FileSystem
from convmem_engine.storage import snapshot as snap
from convmem_engine.storage.codec import decode_message, encode_message, message_row
from convmem_engine.storage.packed import MessageTable
from convmem_engine.storage.record import (
    DEL,
    FORMAT_VERSION,
    GENERATION,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    MAX_PAYLOAD,
    PUT,
    UPDATE,
    decode_generation,
    encode_generation,
    encode_record,
    header_problem,
)


def test_header_layout_is_28_little_endian_bytes() -> None:
    rec = encode_record(PUT, 0x0102030405060708, b"abc")
    assert HEADER_SIZE == 28 and len(rec) == 31
    assert rec[0:4] == MAGIC == b"CMLR"
    assert rec[4] == FORMAT_VERSION == 3
    assert rec[5] == PUT
    assert rec[6:8] == b"\0\0"
    assert rec[8:12] == (3).to_bytes(4, "little")
    assert rec[12:20] == bytes.fromhex("0807060504030201")
    assert rec[20:24] == zlib.crc32(b"abc").to_bytes(4, "little")
    assert rec[24:28] == zlib.crc32(rec[:24]).to_bytes(4, "little")
    assert rec[28:] == b"abc"


def test_record_types_are_distinct() -> None:
    assert len({PUT, DEL, GENERATION, UPDATE}) == 4


def test_message_round_trip_default_metadata_is_shared() -> None:
    m = make_message('héllo ☃ \x00 \n "quoted"')
    back = decode_message(encode_message(m))
    assert back == m
    assert back.metadata is DEFAULT_METADATA


def test_message_round_trip_rich_metadata() -> None:
    m = make_message("x", metadata=RICH_METADATA, revision=7)
    back = decode_message(encode_message(m))
    assert back == m
    assert back.metadata == RICH_METADATA


def test_payload_is_the_storage_codecs_compact_row_not_the_tool_json() -> None:
    import json

    m = make_message("日本語")
    payload = encode_message(m)
    assert b" " not in payload.replace("日本語".encode(), b"")
    row = json.loads(payload.decode("utf-8"))
    assert row == [m.message_id, m.session_id, m.timestamp, m.role, "日本語", 1, m.updated_at, 0]
    assert row == message_row(m)
    assert "日本語".encode() in payload
    rich = make_message("x", metadata=RICH_METADATA)
    assert json.loads(encode_message(rich))[7] == [
        "call-1",
        ["a", "ユニコード"],
        "long",
        "semantic",
        90,
        "sum",
        [["depends_on", "01J" + "0" * 23]],
        ["01J" + "1" * 23],
    ]


def test_generation_round_trip() -> None:
    assert decode_generation(encode_generation(2**62 + 5)) == 2**62 + 5
    with pytest.raises(ValueError):
        decode_generation(b'{"x":1}')


@pytest.mark.parametrize(
    ("version", "rtype", "flags", "length", "expect"),
    [
        (3, PUT, 0, 10, ""),
        (1, PUT, 0, 10, "unknown format version"),
        (2, PUT, 0, 10, "format version 2 record in a format 3 log"),
        (4, PUT, 0, 10, "unknown format version"),
        (3, 9, 0, 10, "unknown record type"),
        (3, 0, 0, 10, "unknown record type"),
        (3, PUT, 1, 10, "reserved flags"),
        (3, PUT, 0, MAX_PAYLOAD + 1, "impossible payload length"),
        (3, DEL, 0, 0, "impossible payload length"),
    ],
)
def test_header_problems(version: int, rtype: int, flags: int, length: int, expect: str) -> None:
    problem = header_problem(version, rtype, flags, length)
    assert (expect in problem) if expect else problem == ""


text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=200)


@given(
    content=text,
    session=st.text(alphabet=st.characters(exclude_categories=["Cs"]), min_size=1, max_size=30),
    tags=st.lists(text, max_size=4),
    summary=st.none() | text,
    importance=st.integers(0, 100),
    revision=st.integers(1, 2**40),
)
def test_message_round_trip_property(
    content: str, session: str, tags: list[str], summary: str | None, importance: int, revision: int
) -> None:
    md = Metadata(
        tags=tuple(tags),
        summary=summary,
        importance=importance,
        relations=(Relation("related_to", "01J" + "2" * 23),),
    )
    m = Message("01J" + "3" * 23, session, 5, "system", content, revision, 9, md)
    assert decode_message(encode_message(m)) == m
    rec = encode_record(UPDATE, revision, encode_message(m))
    magic, ver, rtype, flags, length, seq, pcrc, hcrc = HEADER.unpack_from(rec)
    assert (magic, ver, rtype, flags, length, seq) == (MAGIC, 3, UPDATE, 0, len(rec) - 28, revision)
    assert pcrc == zlib.crc32(rec[28:]) and hcrc == zlib.crc32(rec[:24])


def _write_snapshot(path: str, msgs: list[Message]) -> None:
    fs = FileSystem()
    fd = fs.open_new(path)
    table = MessageTable()
    for m in msgs:
        table.set(m)
    try:
        snap.write_snapshot_file(
            fs,
            fd,
            table,
            generation=7,
            log_offset=100,
            log_prefix_crc32=5,
            last_sequence=9,
            record_count=3,
            deleted_records=1,
            update_records=2,
            live_bytes=50,
            count=len(msgs),
        )
    finally:
        fs.close(fd)


def _read_snapshot(path: str) -> tuple[snap.SnapshotMeta, MessageTable]:
    fs = FileSystem()
    fd = fs.open_read(path)
    try:
        meta, _ = snap.read_meta(fs, fd)
        return meta, snap.read_body(fs, fd, meta)
    finally:
        fs.close(fd)


def test_snapshot_round_trip_keeps_order_and_values(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "s.bin")
    msgs = [make_message(f"m{i} ☃", session=f"s{i % 3}") for i in range(4101)]
    msgs.append(make_message("rich", metadata=RICH_METADATA))
    _write_snapshot(path, msgs)
    meta, body = _read_snapshot(path)
    assert (meta.generation, meta.log_offset, meta.last_sequence, meta.count) == (
        7,
        100,
        9,
        len(msgs),
    )
    assert list(body.values()) == msgs
    assert all(m.metadata is DEFAULT_METADATA for m in list(body.values())[:-1])
    sessions = {id(m.session_id) for m in body.values() if m.session_id == "s1"}
    assert len(sessions) == 1  # interned: one string object per session


def test_snapshot_any_flipped_byte_is_rejected(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "s.bin")
    _write_snapshot(path, [make_message("abc"), make_message("def")])
    with open(path, "rb") as f:
        good = f.read()
    for i in range(len(good)):
        bad = bytearray(good)
        bad[i] ^= 0x41
        with open(path, "wb") as f:
            f.write(bad)
        with pytest.raises(snap.SnapshotError):
            _read_snapshot(path)
    for cut in range(len(good)):
        with open(path, "wb") as f:
            f.write(good[:cut])
        with pytest.raises(snap.SnapshotError):
            _read_snapshot(path)


def test_snapshot_trailer_is_little_endian_struct() -> None:
    assert snap.TRAILER.size == 12 and snap.TRAILER.format == "<II4s"
    assert struct.calcsize("<II4s") == 12
