"""Recovery on open: torn tails are truncated and reported, corruption stops the open untouched."""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import pytest
from reliability_log import Tally
from storage_helpers import (
    FaultFS,
    json_rows_snapshot,
    make_message,
    resign_snapshot,
    snapshot_body,
)

from convmem_engine.domain import CorruptStoreError, Message, Metadata
from convmem_engine.storage import Store
from convmem_engine.storage.codec import encode_message
from convmem_engine.storage.record import (
    DEL,
    GENERATION,
    HEADER_SIZE,
    MAX_PAYLOAD,
    PUT,
    UPDATE,
    encode_generation,
    encode_record,
)


def raw_record(
    rtype: int,
    seq: int,
    payload: bytes,
    *,
    version: int = 3,
    flags: int = 0,
    length: int | None = None,
    pcrc: int | None = None,
    magic: bytes = b"CMLR",
) -> bytes:
    n = len(payload) if length is None else length
    crc = zlib.crc32(payload) if pcrc is None else pcrc
    prefix = struct.pack("<4sBBHIQI", magic, version, rtype, flags, n, seq, crc)
    return prefix + struct.pack("<I", zlib.crc32(prefix)) + payload


def build(path: Path, n: int = 3, *, close: bool = True) -> tuple[list[Message], list[int]]:
    """A store with n messages; returns them and the start offset of every record."""
    store = Store.open(path)
    msgs = [make_message(f"message number {i}") for i in range(n)]
    offsets = []
    for m in msgs:
        offsets.append(store.stats().log_size)
        store.put(m)
    offsets.append(store.stats().log_size)  # end
    if close:
        store.close()
    else:
        crash(store)
    return msgs, offsets


def crash(store: Store) -> None:
    """Drop a store like a killed process would: descriptors and the lock go, nothing else."""
    store._abandon()


def log_bytes(path: Path) -> bytes:
    return (path / "active.log").read_bytes()


def seq_after(path: Path) -> int:
    with Store.open(path) as s:
        return s.stats().last_sequence + 1


def assert_corrupt(path: Path, *fragments: str) -> str:
    before = {p.name: p.read_bytes() for p in path.iterdir() if p.name != "lock"}
    with pytest.raises(CorruptStoreError) as ei:
        Store.open(path)
    after = {p.name: p.read_bytes() for p in path.iterdir() if p.name != "lock"}
    assert after == before  # nothing touched on the corruption path
    msg = str(ei.value)
    assert "active.log" in msg
    for f in fragments:
        assert f in msg
    # and the lock was released: another attempt fails the same way, not with BUSY
    with pytest.raises(CorruptStoreError):
        Store.open(path)
    return msg


@pytest.mark.parametrize("with_snapshot", [False, True])
def test_truncating_inside_the_last_record_recovers_the_tail(
    tmp_path: Path, with_snapshot: bool
) -> None:
    msgs, offsets = build(tmp_path, 3)
    if with_snapshot:
        # snapshot at close covers the first three; a fourth record follows it
        s = Store.open(tmp_path)
        extra = make_message("the last one, torn")
        start = s.stats().log_size
        s.put(extra)
        crash(s)
        assert (tmp_path / "snapshot.bin").exists()
    else:
        start = offsets[-2]
        msgs = msgs[:-1]
    full = log_bytes(tmp_path)
    snapshot = (tmp_path / "snapshot.bin").read_bytes() if with_snapshot else None
    with Tally("log cut at every byte of its last record (torn tail)") as tally:
        _cut_every_byte(tmp_path, full, start, snapshot, msgs, tally)
    # and the truncated store takes new writes after the recovered tail
    with Store.open(tmp_path) as s:
        assert s.stats().recovered_tail is False
        s.put(make_message("after recovery"))
        assert s.check() == []


def _cut_every_byte(
    tmp_path: Path,
    full: bytes,
    start: int,
    snapshot: bytes | None,
    msgs: list[Message],
    tally: Tally,
) -> None:
    for cut in range(start + 1, len(full)):
        tally.cases += 1
        (tmp_path / "active.log").write_bytes(full[:cut])
        if snapshot is not None:
            (tmp_path / "snapshot.bin").write_bytes(snapshot)
        else:
            (tmp_path / "snapshot.bin").unlink(missing_ok=True)
        with Store.open(tmp_path) as s:
            st = s.stats()
            assert st.recovered_tail is True, cut
            assert st.snapshot_valid is True
            assert list(s.messages.values()) == msgs
            assert st.log_size == start
            assert os.path.getsize(tmp_path / "active.log") == start
            assert s.check() == []


@pytest.mark.parametrize("with_snapshot", [False, True])
def test_flipping_any_byte_of_an_earlier_record_is_corrupt_store(
    tmp_path: Path, with_snapshot: bool
) -> None:
    build(tmp_path, 3)
    full = log_bytes(tmp_path)
    # record boundaries: GENERATION, then three PUTs
    bounds = [0]
    pos = 0
    while pos < len(full):
        (length,) = struct.unpack_from("<I", full, pos + 8)
        pos += HEADER_SIZE + length
        bounds.append(pos)
    assert len(bounds) == 5
    snapshot = (tmp_path / "snapshot.bin").read_bytes()
    target_start, target_end = bounds[1], bounds[2]  # the first PUT (not the last record)
    with Tally("flipped byte in an earlier log record (corruption refused)") as tally:
        tally.cases = target_end - target_start + bounds[1]
        _flip_each(tmp_path, full, bounds, snapshot, with_snapshot)


def _flip_each(
    tmp_path: Path, full: bytes, bounds: list[int], snapshot: bytes, with_snapshot: bool
) -> None:
    target_start, target_end = bounds[1], bounds[2]
    for i in range(target_start, target_end):
        bad = bytearray(full)
        bad[i] ^= 0x01 if i % 2 else 0x80
        (tmp_path / "active.log").write_bytes(bytes(bad))
        if with_snapshot:
            (tmp_path / "snapshot.bin").write_bytes(snapshot)
        else:
            (tmp_path / "snapshot.bin").unlink(missing_ok=True)
        assert_corrupt(tmp_path, f"offset {target_start}")
    # the GENERATION record too
    for i in range(0, bounds[1]):
        bad = bytearray(full)
        bad[i] ^= 0x10
        (tmp_path / "active.log").write_bytes(bytes(bad))
        assert_corrupt(tmp_path)


def _append(path: Path, data: bytes) -> None:
    with open(path / "active.log", "ab") as f:
        f.write(data)


@pytest.mark.parametrize("last", [True, False], ids=["last-record", "middle-record"])
@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("bad-crc", "payload CRC mismatch"),
        ("version-2", "format version 2 record in a format 3 log"),
        ("version-4", "unknown format version 4"),
        ("type", "unknown record type"),
        ("flags", "reserved flags"),
        ("length", "impossible payload length"),
        ("seq-repeat", "non-monotonic sequence"),
        ("seq-skip", "non-monotonic sequence"),
        ("seq-back", "non-monotonic sequence"),
        ("magic", "bad magic"),
        ("header-crc", "header CRC mismatch"),
        ("json", "payload is not a message"),
        ("update-unknown", "UPDATE of a message that is not live"),
        ("del-unknown", "DEL of a message that is not live"),
        ("put-live", "PUT of a message id that is already live"),
        ("generation", "GENERATION record after the start"),
    ],
)
def test_corruption_classes(tmp_path: Path, case: str, why: str, last: bool) -> None:
    msgs, _offsets = build(tmp_path, 2)
    (tmp_path / "snapshot.bin").unlink()
    seq = seq_after(tmp_path)
    end = os.path.getsize(tmp_path / "active.log")
    new = make_message("new one")
    payload = encode_message(new)
    rec = {
        "bad-crc": raw_record(PUT, seq, payload, pcrc=zlib.crc32(payload) ^ 1),
        "version-2": raw_record(PUT, seq, payload, version=2),
        "version-4": raw_record(PUT, seq, payload, version=4),
        "type": raw_record(77, seq, payload),
        "flags": raw_record(PUT, seq, payload, flags=4),
        "length": raw_record(PUT, seq, payload, length=MAX_PAYLOAD + 1),
        "seq-repeat": raw_record(PUT, seq - 1, payload),
        "seq-skip": raw_record(PUT, seq + 1, payload),
        "seq-back": raw_record(PUT, 0, payload),
        "magic": raw_record(PUT, seq, payload, magic=b"XMLR"),
        "header-crc": encode_record(PUT, seq, payload)[:24] + b"\0\0\0\0" + payload,
        "json": raw_record(PUT, seq, b'{"not": "a message"}'),
        "update-unknown": raw_record(UPDATE, seq, payload),
        "del-unknown": raw_record(DEL, seq, new.message_id.encode()),
        "put-live": raw_record(PUT, seq, encode_message(msgs[0])),
        "generation": raw_record(GENERATION, seq, encode_generation(5)),
    }[case]
    _append(tmp_path, rec)
    if not last:
        _append(tmp_path, encode_record(PUT, seq + 1, encode_message(make_message("after"))))
    assert_corrupt(tmp_path, why, f"offset {end}")


def test_header_only_at_end_is_a_torn_tail(tmp_path: Path) -> None:
    msgs, _ = build(tmp_path, 2)
    seq = seq_after(tmp_path)
    rec = encode_record(PUT, seq, encode_message(make_message("torn")))
    for cut in (1, 5, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 3):
        size = os.path.getsize(tmp_path / "active.log")
        _append(tmp_path, rec[:cut])
        with Store.open(tmp_path) as s:
            assert s.stats().recovered_tail
            assert list(s.messages.values()) == msgs
            assert s.stats().log_size == size


def test_zero_filled_tail_is_a_torn_tail(tmp_path: Path) -> None:
    msgs, _ = build(tmp_path, 2)
    size = os.path.getsize(tmp_path / "active.log")
    _append(tmp_path, b"\0" * 5000)
    with Store.open(tmp_path) as s:
        assert s.stats().recovered_tail
        assert list(s.messages.values()) == msgs
    assert os.path.getsize(tmp_path / "active.log") == size


def test_zeros_followed_by_data_are_corrupt(tmp_path: Path) -> None:
    build(tmp_path, 2)
    size = os.path.getsize(tmp_path / "active.log")
    _append(tmp_path, b"\0" * 100 + b"x")
    assert_corrupt(tmp_path, f"offset {size}")


def test_garbage_snapshot_is_ignored_for_a_full_replay(tmp_path: Path) -> None:
    msgs, _ = build(tmp_path, 4)
    for garbage in (b"", b"junk", b"CMSNAP3\n" + os.urandom(300)):
        (tmp_path / "snapshot.bin").write_bytes(garbage)
        s = Store.open(tmp_path)
        assert s.stats().snapshot_valid is False
        assert list(s.messages.values()) == msgs
        s.close()  # writes a good snapshot
        with Store.open(tmp_path) as s:
            assert s.stats().snapshot_valid is True
            assert list(s.messages.values()) == msgs
            assert s.check() == []


def test_flipped_snapshot_byte_is_ignored(tmp_path: Path) -> None:
    msgs, _ = build(tmp_path, 5)
    good = (tmp_path / "snapshot.bin").read_bytes()
    for i in range(0, len(good), 7):
        bad = bytearray(good)
        bad[i] ^= 0x20
        (tmp_path / "snapshot.bin").write_bytes(bytes(bad))
        s = Store.open(tmp_path)
        assert s.stats().snapshot_valid is False, i
        assert list(s.messages.values()) == msgs
        s._abandon()


def test_snapshot_of_another_generation_is_ignored_and_removed(tmp_path: Path) -> None:
    msgs, _ = build(tmp_path, 3)
    old_snapshot = (tmp_path / "snapshot.bin").read_bytes()
    with Store.open(tmp_path) as s:
        s.delete(msgs[0].message_id)
        s.compact()
    (tmp_path / "snapshot.bin").write_bytes(old_snapshot)  # as a crash mid-compaction leaves it
    s = Store.open(tmp_path)
    assert s.stats().snapshot_valid is False
    assert list(s.messages.values()) == msgs[1:]
    assert not (tmp_path / "snapshot.bin").exists()
    assert s.check() == []
    s.close()


def test_truncated_log_under_a_snapshot_is_corrupt_store(tmp_path: Path) -> None:
    """Issue 15, defect 1: 50 messages, a clean close (the snapshot covers the whole log), the
    log cut short: the snapshot proves that durable records are gone. CORRUPT_STORE, not a torn
    tail, and nothing in the data dir is touched (the snapshot, the evidence, survives)."""
    msgs, offsets = build(tmp_path, 50)
    full = log_bytes(tmp_path)
    snapshot = (tmp_path / "snapshot.bin").read_bytes()
    cuts = [len(full) // 2, offsets[-2], offsets[-2] + 5, len(full) - 1, offsets[0] + 3]
    with Tally("log truncated under a current snapshot") as tally:
        for cut in cuts:
            (tmp_path / "active.log").write_bytes(full[:cut])
            assert_corrupt(tmp_path, "snapshot.bin", f"offset {len(full)}", "missing")
            assert (tmp_path / "snapshot.bin").read_bytes() == snapshot
            tally.cases += 1
        # zeros in place of durable records (the size kept) are the same loss
        for z in (offsets[25] + 7, offsets[-2] + HEADER_SIZE + 2):
            (tmp_path / "active.log").write_bytes(full[:z] + b"\0" * (len(full) - z))
            assert_corrupt(tmp_path, "snapshot.bin", "missing")
            tally.cases += 1
    (tmp_path / "active.log").write_bytes(full)
    with Store.open(tmp_path) as s:
        assert list(s.messages.values()) == msgs
        assert s.check() == []


def test_snapshot_offset_beyond_the_log_of_another_generation_is_ignored(tmp_path: Path) -> None:
    """A stale snapshot (another generation) proves nothing about this log."""
    msgs, _ = build(tmp_path, 30)
    old_size = os.path.getsize(tmp_path / "active.log")
    old_snapshot = (tmp_path / "snapshot.bin").read_bytes()
    with Store.open(tmp_path) as s:
        for m in msgs[:25]:
            s.delete(m.message_id)
        s.compact()
    assert os.path.getsize(tmp_path / "active.log") < old_size
    (tmp_path / "snapshot.bin").write_bytes(old_snapshot)
    with Store.open(tmp_path) as s:
        assert s.stats().snapshot_valid is False
        assert list(s.messages.values()) == msgs[25:]
    assert (
        not (tmp_path / "snapshot.bin").exists()
        or (tmp_path / "snapshot.bin").read_bytes() != old_snapshot
    )


def test_zeros_from_inside_any_record_to_the_end_are_an_incomplete_tail(tmp_path: Path) -> None:
    """Issue 15, defect 2: group commit leaves several records unsynced; XFS / ext4
    data=writeback keep the size but not the data after a block: zeros from the middle of a
    record that is not the last one, to the end. Every acknowledged record is before them."""
    msgs, offsets = build(tmp_path, 6)
    (tmp_path / "snapshot.bin").unlink()
    full = log_bytes(tmp_path)
    with Tally("zero-filled log tail (power loss, size kept)") as tally:
        for k in range(len(msgs)):
            start, end = offsets[k], offsets[k + 1]
            for z in (start, start + 5, start + HEADER_SIZE - 1, start + HEADER_SIZE + 3, end - 1):
                (tmp_path / "active.log").write_bytes(full[:z] + b"\0" * (len(full) - z))
                with Store.open(tmp_path) as s:
                    st = s.stats()
                    assert st.recovered_tail, (k, z)
                    assert list(s.messages.values()) == msgs[:k], (k, z)
                    assert st.log_size == start
                    assert s.check() == []
                assert os.path.getsize(tmp_path / "active.log") == start
                (tmp_path / "snapshot.bin").unlink()
                tally.cases += 1


def test_damage_that_zeros_do_not_explain_is_still_corrupt(tmp_path: Path) -> None:
    _, offsets = build(tmp_path, 6)
    (tmp_path / "snapshot.bin").unlink()
    full = log_bytes(tmp_path)
    start, end = offsets[2], offsets[3]
    # zeros from inside record 2, then one non-zero byte before the end of the file
    bad = bytearray(full[: start + 40] + b"\0" * (len(full) - start - 40))
    bad[-100] = 0x31
    (tmp_path / "active.log").write_bytes(bytes(bad))
    assert_corrupt(tmp_path, f"offset {start}")
    # a flipped byte in record 2 (its last byte non-zero), every later record zeroed
    bad = bytearray(full[:end] + b"\0" * (len(full) - end))
    bad[start + HEADER_SIZE + 4] ^= 0x01
    (tmp_path / "active.log").write_bytes(bytes(bad))
    assert_corrupt(tmp_path, f"offset {start}", "payload CRC mismatch")
    # a zeroed stretch in the middle of record 2 followed by valid records
    bad = bytearray(full)
    bad[start + HEADER_SIZE + 2 : end] = b"\0" * (end - start - HEADER_SIZE - 2)
    (tmp_path / "active.log").write_bytes(bytes(bad))
    assert_corrupt(tmp_path, f"offset {start}", "payload CRC mismatch")
    # non-zero garbage from inside record 2 to the end
    bad = bytearray(full[: start + 40] + b"\xff" * (len(full) - start - 40))
    (tmp_path / "active.log").write_bytes(bytes(bad))
    assert_corrupt(tmp_path, f"offset {start}")


def _edit_snapshot_body(path: Path, old: bytes, new: bytes, *, resign: bool) -> None:
    data = (path / "snapshot.bin").read_bytes()
    assert len(old) == len(new) and data.count(old) == 1
    if resign:
        body = snapshot_body(data).replace(old, new)
        (path / "snapshot.bin").write_bytes(resign_snapshot(data, body))
    else:
        (path / "snapshot.bin").write_bytes(data.replace(old, new))


@pytest.mark.parametrize("layout", ["binary", "json-rows"])
@pytest.mark.parametrize("resign", [False, True], ids=["damaged", "crafted-crc-ok"])
@pytest.mark.parametrize("case", ["infinity", "nan", "deep-nesting", "huge-int", "wrong-shape"])
def test_snapshot_that_breaks_the_decoder_falls_back_to_the_log(
    tmp_path: Path, case: str, resign: bool, layout: str
) -> None:
    """Issue 15, defect 5: a same-length edit of the snapshot body that the JSON decoder
    chokes on (OverflowError, RecursionError, ...) never stops the open: full replay. The
    binary rows (CMSNAP4) hold JSON only in the metadata; the JSON rows (CMSNAP3, still read)
    everywhere: the edits hit the metadata, which is JSON in both."""
    store = Store.open(tmp_path)
    deep = "d" * 6000
    msgs = [
        make_message("one", metadata=Metadata(tags=("first",))),
        make_message("eight ch", metadata=Metadata(importance=12345678)),
        make_message("deep", metadata=Metadata(tags=(deep,))),
    ]
    for m in msgs:
        store.put(m)
    store.close()
    if layout == "json-rows":
        data = (tmp_path / "snapshot.bin").read_bytes()
        (tmp_path / "snapshot.bin").write_bytes(json_rows_snapshot(data, msgs))
    old, new = {
        "infinity": (b"12345678", b"Infinity"),
        "nan": (b"12345678", b"NaN     "),
        "deep-nesting": (f'"{deep}"'.encode(), b"[" * 3001 + b"]" * 3001),
        "huge-int": (b"12345678", b"9" * 8),
        "wrong-shape": (b'"first"', b"[1,2,3]"),
    }[case]
    _edit_snapshot_body(tmp_path, old, new, resign=resign)
    if case == "huge-int" and resign:
        return  # a valid row with a valid CRC: nothing to fall back from (see the codec)
    with Store.open(tmp_path) as s:
        assert s.stats().snapshot_valid is False
        assert list(s.messages.values()) == msgs
    with Store.open(tmp_path) as s:  # the close wrote a good snapshot again
        assert s.stats().snapshot_valid is True
        assert list(s.messages.values()) == msgs
        assert s.check() == []


def test_missing_log_with_a_snapshot_is_corrupt(tmp_path: Path) -> None:
    build(tmp_path, 2)
    (tmp_path / "active.log").unlink()
    with pytest.raises(CorruptStoreError, match=r"active\.log"):
        Store.open(tmp_path)
    assert (tmp_path / "snapshot.bin").exists()
    assert not (tmp_path / "active.log").exists()


def test_empty_log_file_is_corrupt(tmp_path: Path) -> None:
    (tmp_path / "active.log").write_bytes(b"")
    with pytest.raises(CorruptStoreError, match="GENERATION"):
        Store.open(tmp_path)


def test_log_must_start_with_generation(tmp_path: Path) -> None:
    (tmp_path / "active.log").write_bytes(
        encode_record(PUT, 1, encode_message(make_message("no marker")))
    )
    with pytest.raises(CorruptStoreError, match="offset 0"):
        Store.open(tmp_path)


def test_temporary_leftovers_are_removed_on_open(tmp_path: Path) -> None:
    msgs, _ = build(tmp_path, 2)
    (tmp_path / "active.log.tmp").write_bytes(b"half a compaction")
    (tmp_path / "snapshot.bin.tmp").write_bytes(b"half a snapshot")
    with Store.open(tmp_path) as s:
        assert list(s.messages.values()) == msgs
        assert sorted(os.listdir(tmp_path)) == ["active.log", "lock", "lock.pid", "snapshot.bin"]


def test_open_creates_missing_directories(tmp_path: Path) -> None:
    d = tmp_path / "a" / "b"
    with Store.open(d) as s:
        assert s.messages == {}
        st = s.stats()
        assert st.format_version == 3 and st.last_sequence == 1 and st.dead_bytes == 0
    assert (d / "active.log").exists()


def test_tail_replay_after_snapshot(tmp_path: Path) -> None:
    msgs, _ = build(tmp_path, 3)
    s = Store.open(tmp_path, fs=FaultFS())
    more = [make_message(f"tail {i}") for i in range(3)]
    for m in more:
        s.put(m)
    s.update(_edited(more[0]))
    s.delete(msgs[1].message_id)
    expect = list(s.messages.values())
    crash(s)
    with Store.open(tmp_path) as s2:
        assert s2.stats().snapshot_valid is True
        assert list(s2.messages.values()) == expect
        assert s2.check() == []


def _edited(m: Message) -> Message:
    return Message(
        m.message_id,
        m.session_id,
        m.timestamp,
        m.role,
        m.content + " edited",
        m.revision + 1,
        m.updated_at + 1,
        m.metadata,
    )


def test_message_payload_fields_survive(tmp_path: Path) -> None:
    build(tmp_path, 1)
    log = log_bytes(tmp_path)
    # the payload of the PUT is the storage codec's row: content at position 4
    (length,) = struct.unpack_from("<I", log, 8)
    put = log[HEADER_SIZE + length :]
    (plen,) = struct.unpack_from("<I", put, 8)
    assert json.loads(put[HEADER_SIZE : HEADER_SIZE + plen])[4] == "message number 0"


def test_flipping_any_byte_of_the_last_complete_record_is_corrupt_store(tmp_path: Path) -> None:
    """Our decision (docs/storage-format.md): a full-length final record that fails its checks
    is damage, not a torn write; a crash only ever leaves a prefix of the last record."""
    _, offsets = build(tmp_path, 2)
    (tmp_path / "snapshot.bin").unlink()
    full = log_bytes(tmp_path)
    start = offsets[-2]
    for i in range(start, len(full)):
        bad = bytearray(full)
        bad[i] ^= 0x04
        (tmp_path / "active.log").write_bytes(bytes(bad))
        assert_corrupt(tmp_path, f"offset {start}")


def test_last_record_zero_filled_at_its_end_is_a_torn_tail(tmp_path: Path) -> None:
    """Power loss on a filesystem that extended the file before writing the data: the size is
    complete, the end of the payload is zeros. Not damage: the write was never acknowledged."""
    msgs, offsets = build(tmp_path, 3)
    (tmp_path / "snapshot.bin").unlink()
    full = log_bytes(tmp_path)
    start = offsets[-2]
    for zeros in (1, 7, len(full) - start - HEADER_SIZE):
        (tmp_path / "active.log").write_bytes(full[: len(full) - zeros] + b"\0" * zeros)
        with Store.open(tmp_path) as s:
            assert s.stats().recovered_tail
            assert list(s.messages.values()) == msgs[:-1]
            assert s.stats().log_size == start
        (tmp_path / "snapshot.bin").unlink()
    # the same zeros in an earlier record are corruption
    bad = bytearray(full)
    bad[offsets[1] - 3 : offsets[1]] = b"\0\0\0"
    (tmp_path / "active.log").write_bytes(bytes(bad))
    assert_corrupt(tmp_path, f"offset {offsets[0]}")
