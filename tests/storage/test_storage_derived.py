"""Derived files (storage/derived.py; the search index's search.idx): written atomically with a
snapshot, handed out only for the snapshot loaded at open, never through a symlink.

Power loss at every filesystem step of `Store.write_derived` (with each tail model of
PowerLossFS): after the cut the store opens and passes its self-check, and no derived file is
handed out (the old one names the old snapshot; the new one is not durable before its last
step): never a mix, never a file the reader accepts wrongly.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from storage_helpers import TAILS, Crash, FaultFS, PowerLossFS, make_message

from convmem_engine.domain import StoreIOError
from convmem_engine.storage import Store
from convmem_engine.storage.derived import DerivedError

NAME = "test.idx"
FORMAT = 7


def payload(n: int, tag: bytes) -> list[bytes]:
    return [tag * 5000 for _ in range(n)]


def read_payload(store: Store) -> bytes | None:
    reader = store.open_derived(NAME, FORMAT)
    if reader is None:
        return None
    try:
        data = reader.read(reader.meta.payload_length)
        reader.finish()
        return data
    finally:
        store.close_derived(reader)


def base_store(d: Path) -> None:
    """A store with a snapshot and the derived file written for it (payload b"old")."""
    with Store.open(d) as s:
        for i in range(5):
            s.put(make_message(f"derived {i}"))
        assert s.write_derived(NAME, FORMAT, lambda: payload(3, b"old"))


def test_round_trip_and_the_tail_changes(tmp_path: Path) -> None:
    d = tmp_path / "store"
    base_store(d)
    s = Store.open(d)
    changes = s.take_open_changes()
    assert changes == {}  # nothing after the snapshot
    assert s.take_open_changes() is None  # once
    assert read_payload(s) == b"old" * 15000
    # After more writes, the same file stays usable for the next open only with its snapshot:
    # a write_derived writes a new snapshot first, and tags the new file with it.
    first = list(s.messages.values())
    m = make_message("derived later")
    s.put(m)
    s.delete(first[0].message_id)
    s._abandon()  # died: the tail is replayed at the next open
    s = Store.open(d)
    assert s.take_open_changes() == {m.message_id: None, first[0].message_id: first[0]}
    assert read_payload(s) == b"old" * 15000
    assert s.write_derived(NAME, FORMAT, lambda: payload(1, b"new"))
    assert not s.write_derived(NAME, FORMAT, lambda: payload(1, b"x"), keep_current=True)
    s.close()
    with Store.open(d) as s:
        assert read_payload(s) == b"new" * 5000
        assert s.open_derived(NAME, FORMAT + 1) is None  # another format: not used, removed
        assert not (d / NAME).exists()


def test_a_full_replay_hands_out_no_derived_file(tmp_path: Path) -> None:
    d = tmp_path / "store"
    base_store(d)
    (d / "snapshot.bin").unlink()
    with Store.open(d) as s:
        assert s.take_open_changes() is None
        assert read_payload(s) is None
        assert not (d / NAME).exists()


def test_names_must_be_plain_and_end_in_idx(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store") as s:
        for bad in ("x.bin", "../x.idx", "a/b.idx", "snapshot.bin"):
            with pytest.raises(ValueError):
                s.write_derived(bad, FORMAT, lambda: [b""])
            with pytest.raises(ValueError):
                s.open_derived(bad, FORMAT)


def test_a_failed_write_leaves_the_old_file_and_the_store_usable(tmp_path: Path) -> None:
    d = tmp_path / "store"
    base_store(d)
    fs = FaultFS()
    s = Store.open(d, fs=fs)
    s.put(make_message("derived more"))
    start = len(fs.steps)
    fs.fail_at = start + 4  # a write of the new derived file
    with pytest.raises(StoreIOError):
        s.write_derived(NAME, FORMAT, lambda: payload(3, b"new"))
    assert not (d / (NAME + ".tmp")).exists()
    s.put(make_message("derived still writable"))
    s.close()
    with Store.open(d) as s:
        assert read_payload(s) is None  # the old file named an older snapshot: removed


@pytest.mark.parametrize("tail", TAILS)
def test_power_loss_at_every_step_of_writing_a_derived_file(tmp_path: Path, tail: str) -> None:
    template = tmp_path / "template"
    base_store(template)
    with Store.open(template) as s:
        s.put(make_message("derived after the file"))  # the next write needs a new snapshot
    # Count the steps of one write_derived.
    probe = tmp_path / "probe"
    shutil.copytree(template, probe)
    fs = PowerLossFS(probe)
    s = Store.open(probe, fs=fs)
    start = len(fs.steps)
    s.write_derived(NAME, FORMAT, lambda: payload(3, b"new"))
    steps = len(fs.steps) - start
    s.close()
    assert steps >= 8
    with Store.open(probe) as s:
        assert read_payload(s) == b"new" * 15000  # all steps done: the new file
    outcomes = set()
    for k in range(1, steps + 1):
        d = tmp_path / f"cut{k}"
        shutil.copytree(template, d)
        fs = PowerLossFS(d, tail=tail, seed=k)
        s = Store.open(d, fs=fs)
        fs.fail_at = len(fs.steps) + k
        with pytest.raises(Crash):
            s.write_derived(NAME, FORMAT, lambda: payload(3, b"new"))
        fs.power_cut()
        with Store.open(d) as reopened:
            assert reopened.check() == []
            got = read_payload(reopened)
            assert got is None
            outcomes.add(got)
        assert not (d / (NAME + ".tmp")).exists()
        shutil.rmtree(d)
    # A cut before any step leaves the old file (tagged with the old snapshot: not used) or no
    # file; the new one counts only once its rename is durable (the last step).
    assert outcomes == {None}


@pytest.mark.skipif(os.name == "nt", reason="symlinks need privileges on Windows")
def test_symlinks_at_the_derived_names_are_never_followed(tmp_path: Path) -> None:
    d = tmp_path / "store"
    base_store(d)
    victim = tmp_path / "victim"
    victim.write_bytes((d / NAME).read_bytes())
    (d / NAME).unlink()
    os.symlink(victim, d / NAME)
    os.symlink(victim, d / (NAME + ".tmp"))
    with Store.open(d) as s:
        assert not (d / (NAME + ".tmp")).exists()  # open removes leftovers (the link itself)
        assert read_payload(s) is None
        s.put(make_message("derived moved on"))
        os.symlink(victim, d / (NAME + ".tmp"))
        assert s.write_derived(NAME, FORMAT, lambda: payload(1, b"new"))
    assert victim.read_bytes().count(b"old") == 15000
    assert not (d / NAME).is_symlink()
    assert os.stat(d / NAME).st_mode & 0o777 == 0o600


def test_damaged_meta_is_refused(tmp_path: Path) -> None:
    from convmem_engine.storage.derived import DerivedMeta

    for raw in (b"{}", b"[1]", b'{"generation":-1}', b"\xff", b"nan"):
        with pytest.raises(DerivedError):
            DerivedMeta.from_bytes(raw)
