"""Issue 10.3: a store of format 2 (the tool's JSON in the log) opens and is upgraded to the
storage codec of format 3; a crash at any step of the upgrade loses nothing; a store of a newer
format is refused with a clear message and left untouched.

The fixture tests/storage/fixtures/store-v2 was written by the format-2 code itself
(fixtures/make_v2_store.py at commit 63ff6c7): a snapshot plus a tail of puts, an update and a
delete after it, Unicode, rich metadata, a NUL in content.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from reliability_log import Tally
from storage_helpers import STEPS, Crash, FaultFS, dir_bytes, make_message

from convmem_engine.domain import CorruptStoreError, NewerFormatError, StoreIOError
from convmem_engine.storage import Store
from convmem_engine.storage import snapshot as snap
from convmem_engine.storage.record import FORMAT_VERSION, HEADER, HEADER_SIZE, MAGIC

FIXTURE = Path(__file__).parent / "fixtures" / "store-v2"


def expected() -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads((FIXTURE / "expected.json").read_text("utf-8"))
    return data


def v2_store(tmp_path: Path, name: str = "store") -> Path:
    d = tmp_path / name
    shutil.copytree(FIXTURE, d)
    (d / "expected.json").unlink()
    os.chmod(d, 0o700)
    return d


def record_versions(log: bytes) -> list[int]:
    out, pos = [], 0
    while pos < len(log):
        magic, version, _t, _f, length, *_ = HEADER.unpack_from(log, pos)
        assert magic == MAGIC
        out.append(version)
        pos += HEADER_SIZE + length
    return out


def test_the_fixture_is_a_format_2_store() -> None:
    log = (FIXTURE / "active.log").read_bytes()
    assert set(record_versions(log)) == {2}
    assert (FIXTURE / "snapshot.bin").read_bytes().startswith(b"CMSNAP2\n")
    assert b'"message_id":' in log  # the tool's JSON objects


def test_a_format_2_store_opens_upgraded_with_every_message(tmp_path: Path) -> None:
    d = v2_store(tmp_path)
    old_log = (d / "active.log").read_bytes()
    with Store.open(d) as s:
        assert [m.to_json() for m in s.messages.values()] == expected()
        st = s.stats()
        assert st.format_version == FORMAT_VERSION == 3
        assert st.snapshot_valid is True
        assert s.check() == []
        old_last = st.last_sequence
    log = (d / "active.log").read_bytes()
    assert set(record_versions(log)) == {3}
    assert b'"message_id":' not in log  # rows of the storage codec, not the tool's JSON
    assert (d / "snapshot.bin").read_bytes().startswith(snap.MAGIC)
    assert sorted(os.listdir(d)) == ["active.log", "lock", "snapshot.bin"]
    # the deleted messages' content was compacted away with the old format
    everything = dir_bytes(d)
    assert b"to be deleted" not in everything and b"NUL \x00 inside" not in everything
    assert log != old_log
    with Store.open(d) as s:  # and it opens as a plain format 3 store
        assert [m.to_json() for m in s.messages.values()] == expected()
        assert s.stats().snapshot_valid is True and s.stats().last_sequence == old_last
        s.put(make_message("after the upgrade", message_id="01K" + "9" * 23))
        assert s.check() == []


def test_a_format_2_store_with_a_torn_tail_is_upgraded(tmp_path: Path) -> None:
    d = v2_store(tmp_path)
    with open(d / "active.log", "ab") as f:
        f.write(b"CMLR\x02\x01\x00")
    with Store.open(d) as s:
        assert s.stats().recovered_tail is True
        assert [m.to_json() for m in s.messages.values()] == expected()
        assert s.check() == []


def test_a_truncated_format_2_log_under_its_snapshot_is_corrupt(tmp_path: Path) -> None:
    d = v2_store(tmp_path)
    log = (d / "active.log").read_bytes()
    meta, _ = _snapshot_meta(d / "snapshot.bin")
    assert HEADER_SIZE < meta.log_offset <= len(log)
    (d / "active.log").write_bytes(log[: meta.log_offset - 10])
    before = dir_bytes(d)
    with pytest.raises(CorruptStoreError, match="missing"):
        Store.open(d)
    assert dir_bytes(d) == before


def _snapshot_meta(path: Path) -> tuple[snap.SnapshotMeta, int]:
    from convmem_engine.storage import FileSystem

    fs = FileSystem()
    fd = fs.open_read(str(path))
    try:
        return snap.read_meta(fs, fd)
    finally:
        fs.close(fd)


def upgrade_steps(tmp_path: Path) -> list[str]:
    fs = FaultFS()
    Store.open(v2_store(tmp_path, "count"), fs=fs).close()
    return fs.steps


@pytest.mark.parametrize("mode", ["crash", "error", "short"])
def test_a_fault_at_every_step_of_the_upgrade_loses_nothing(tmp_path: Path, mode: str) -> None:
    steps = upgrade_steps(tmp_path)
    assert {"replace", "fsync_dir", "open_new"} <= set(steps) <= set(STEPS)
    want = expected()
    with Tally(f"{mode} at every filesystem step of a format upgrade") as tally:
        for k in range(1, len(steps) + 1):
            d = v2_store(tmp_path, f"{mode}-{k}")
            fs = FaultFS(fail_at=k, mode=mode)
            with contextlib.suppress(Crash, StoreIOError):
                Store.open(d, fs=fs).close()
            assert fs.fired
            tally.cases += 1
            with Store.open(d) as s:
                got = [m.to_json() for m in s.messages.values()]
                tally.lost += got != want
                assert got == want, (k, steps[k - 1])
                assert s.stats().format_version == 3
                assert s.check() == [], (k, steps[k - 1])
            assert set(record_versions((d / "active.log").read_bytes())) == {3}
            assert not any(n.endswith(".tmp") for n in os.listdir(d))


def _with_version(data: bytes, pos: int, version: int) -> bytes:
    head = bytearray(data[pos : pos + HEADER_SIZE])
    head[4] = version
    head[24:28] = struct.pack("<I", zlib.crc32(bytes(head[:24])))
    return data[:pos] + bytes(head) + data[pos + HEADER_SIZE :]


def test_a_store_of_a_newer_format_is_refused_untouched(tmp_path: Path) -> None:
    d = tmp_path / "store"
    with Store.open(d) as s:
        s.put(make_message("written by a future version"))
    log = (d / "active.log").read_bytes()
    (d / "active.log").write_bytes(_with_version(log, 0, 4))
    before = dir_bytes(d)
    with pytest.raises(NewerFormatError) as ei:
        Store.open(d)
    msg = str(ei.value)
    assert "newer ConvMem" in msg and "format version 4" in msg and "reads formats up to 3" in msg
    assert ei.value.code == "CORRUPT_STORE"
    assert dir_bytes(d) == before
    with pytest.raises(NewerFormatError):  # the lock was released
        Store.open(d)

    from convmem_app.shell.startup_error import describe

    problem = describe(ei.value, d)
    assert problem.title == "The memory store was written by a newer ConvMem"
    assert "damaged" not in problem.title


def test_a_format_2_record_inside_a_format_3_log_is_corrupt(tmp_path: Path) -> None:
    d = tmp_path / "store"
    with Store.open(d) as s:
        s.put(make_message("one"))
        s.put(make_message("two"))
    (d / "snapshot.bin").unlink()
    log = (d / "active.log").read_bytes()
    (first_len,) = struct.unpack_from("<I", log, 8)
    second = HEADER_SIZE + first_len
    (d / "active.log").write_bytes(_with_version(log, second, 2))
    with pytest.raises(CorruptStoreError, match=f"offset {second}: format version 2 record"):
        Store.open(d)
