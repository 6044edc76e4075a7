"""`convmem repair` (convmem_engine/transfer/repair.py): a store refused after a power cut opens
again with every record before the damage; anything it cannot repair is left as it was."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from convmem_engine.domain.errors import BusyError, CorruptStoreError
from convmem_engine.storage import Store
from convmem_engine.storage.store import LOG_NAME, SNAPSHOT_NAME
from convmem_engine.transfer import (
    RepairError,
    damaged_log_offset,
    looks_like_a_power_cut,
    repair_store,
)
from tests.crashed_store import BLOCK, UNTRACKED, crashed_store, zero_block_before_the_end
from tests.transfer.test_transfer_cli import convmem


def digest(folder: Path) -> dict[str, str]:
    """Every file of a data dir but the lock files (a refused open may remove lock.pid)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in UNTRACKED
    }


def ids_in(data: Path) -> list[str]:
    store = Store.open(data)
    try:
        return [m.message_id for m in store.messages.values()]
    finally:
        store.close()


def test_a_store_refused_after_a_power_cut_opens_again_with_every_acknowledged_write(
    tmp_path: Path,
) -> None:
    data, acked = crashed_store(tmp_path, synced=60, unsynced=40)
    (data / "agent.yaml").write_text("enabled: false\n")  # the data dir's other files stay
    hole = zero_block_before_the_end(data, blocks_from_end=2)
    with pytest.raises(CorruptStoreError, match=r"active\.log: corrupt record at offset \d+"):
        Store.open(data)
    before = digest(data)
    size = (data / LOG_NAME).stat().st_size
    report = repair_store(data, now_ms=lambda: 1_764_600_000_000)
    assert report.offset is not None and report.offset <= hole
    assert report.cut_bytes == size - report.offset
    assert (data / LOG_NAME).stat().st_size == report.offset  # cut exactly there
    kept = ids_in(data)
    assert kept[: len(acked)] == acked  # every acknowledged write, in order
    assert report.messages == len(kept)
    assert (data / "agent.yaml").read_text() == "enabled: false\n"
    aside = Path(report.aside or "")
    assert aside.name == "data.before-repair-20251201T144000000Z"
    assert digest(aside) == {n: h for n, h in before.items() if n in (LOG_NAME, SNAPSHOT_NAME)}
    if os.name == "posix":
        assert stat.S_IMODE(aside.stat().st_mode) == 0o700
        assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in aside.iterdir())
    again = repair_store(data)  # now it opens: nothing to repair
    assert again.offset is None and again.messages == len(kept)


def test_a_healthy_store_is_left_as_it_is(tmp_path: Path) -> None:
    data, acked = crashed_store(tmp_path, synced=10, unsynced=0)
    assert ids_in(data) == acked  # recovered once, as any start does
    before = digest(data)
    report = repair_store(data)
    assert report.offset is None and report.aside is None and report.messages == len(acked)
    assert digest(data) == before
    assert not list(tmp_path.glob("data.before-repair-*"))


def assert_refused_unchanged(data: Path, match: str) -> None:
    """repair_store refuses with `match`, leaving the data dir's files as they were and no
    copy aside nor working folder next to it."""
    before = digest(data)
    with pytest.raises(RepairError, match=match):
        repair_store(data)
    assert digest(data) == before
    assert not list(data.parent.glob(f"{data.name}.before-repair-*"))
    assert not list(data.parent.glob(".convmem-repair-*"))


def test_a_refusal_that_names_no_record_of_the_log_is_not_repaired(tmp_path: Path) -> None:
    """A log that ends before what its snapshot proves durable lost acknowledged records: no
    cut brings them back, so repair refuses and changes nothing."""
    data, _ = crashed_store(tmp_path, synced=20, unsynced=0)
    Store.open(data).close()  # a snapshot of the whole log
    log = data / LOG_NAME
    os.truncate(log, log.stat().st_size // 2)
    with pytest.raises(CorruptStoreError, match="records that were already durable"):
        Store.open(data)
    assert_refused_unchanged(data, r"not in a record of active\.log.*nothing was changed")


def test_damage_inside_what_the_snapshot_covers_is_not_cut(tmp_path: Path) -> None:
    """Cutting the log before the offset the snapshot says was durable would not open either
    (the snapshot covers more of the log than is left): refused, nothing changed."""
    data, _ = crashed_store(tmp_path, synced=60, unsynced=0)
    store = Store.open(data)
    store.close()  # a snapshot of the whole log: every record in it acknowledged
    log = data / LOG_NAME
    with open(log, "r+b") as f:
        f.seek(log.stat().st_size // 2)
        f.write(b"\0" * BLOCK)
    with pytest.raises(CorruptStoreError, match=r"active\.log: corrupt record at offset"):
        Store.open(data)
    assert_refused_unchanged(data, r"does not open either.*nothing was changed")


def test_a_store_in_use_is_not_touched(tmp_path: Path) -> None:
    data, acked = crashed_store(tmp_path, synced=10, unsynced=0)
    holder = Store.open(data)  # the app runs on it
    try:
        with pytest.raises(BusyError):
            repair_store(data)
    finally:
        holder.close()
    assert not list(tmp_path.glob("data.before-repair-*"))
    assert ids_in(data) == acked


def test_the_repair_command(tmp_path: Path) -> None:
    data, acked = crashed_store(tmp_path, synced=40, unsynced=30)
    zero_block_before_the_end(data, blocks_from_end=2)

    done = convmem("repair", "--data-dir", data)
    assert done.returncode == 0, done.stderr
    assert "repaired: active.log cut at offset" in done.stdout
    assert "the damaged files are kept at" in done.stdout
    assert ids_in(data)[: len(acked)] == acked
    again = convmem("repair", "--data-dir", data)
    assert again.returncode == 0 and "nothing to repair" in again.stdout
    missing = convmem("repair", "--data-dir", tmp_path / "nothing-here")
    assert missing.returncode == 1 and "not a ConvMem data dir" in missing.stderr


def test_a_power_cuts_zeros_are_told_from_a_flipped_byte(tmp_path: Path) -> None:
    """The app offers its Repair button only when the damage looks like a power cut's."""
    cut, _ = crashed_store(tmp_path / "cut", synced=40, unsynced=30)
    zero_block_before_the_end(cut, blocks_from_end=2)
    with pytest.raises(CorruptStoreError) as refused:
        Store.open(cut)
    offset = damaged_log_offset(refused.value)
    assert offset is not None and looks_like_a_power_cut(cut, offset)

    flipped, _ = crashed_store(tmp_path / "flipped", synced=40, unsynced=0)
    log = flipped / LOG_NAME
    raw = bytearray(log.read_bytes())
    raw[len(raw) - 500] ^= 0xFF
    log.write_bytes(bytes(raw))
    with pytest.raises(CorruptStoreError) as refused:
        Store.open(flipped)
    offset = damaged_log_offset(refused.value)
    assert offset is not None and not looks_like_a_power_cut(flipped, offset)
