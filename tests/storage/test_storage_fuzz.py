"""Fuzzing the record decoder and the snapshot loader with mutated bytes (hypothesis).

- A log with mutated bytes (flips, overwrites, zero runs, insertions, deletions, cuts) either
  opens holding exactly the state after some prefix of its records (a torn tail was cut off),
  or is refused with CORRUPT_STORE. Never another exception, never an invented or altered
  message: a CRC32 collision would be needed.
- A record whose payload is mutated and whose CRCs are recomputed (crafted, not damaged) reaches
  the decoder itself: the open gives CORRUPT_STORE or a consistent store, never a traceback.
- A snapshot with mutated bytes is never used (or is byte-identical): the open replays the
  intact log and holds exactly its state. A crafted one (body mutated, CRCs recomputed) never
  stops the open either.

A fast subset runs by default; `-m slow` runs the large counts.
"""

from __future__ import annotations

import struct
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_log import Tally
from storage_helpers import RICH_METADATA, make_message, resign_snapshot, snapshot_body

from convmem_engine.domain import CorruptStoreError, Message, Metadata
from convmem_engine.storage import Store
from convmem_engine.storage.record import HEADER_SIZE

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def edited(m: Message) -> Message:
    return Message(
        m.message_id,
        m.session_id,
        m.timestamp,
        m.role,
        m.content + "!",
        m.revision + 1,
        m.updated_at + 1,
        m.metadata,
    )


class Base:
    """One store with history; the state after every record of its log."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "base"
        msgs = [
            make_message("plain"),
            make_message("ünïcödé ☃ " * 20, metadata=RICH_METADATA),
            make_message("x" * 5000),
            make_message("tags", metadata=Metadata(tags=("a", "b"), importance=3)),
        ]
        self.states: list[dict[str, Message]] = [{}]  # after the GENERATION record
        with Store.open(self.dir) as s:
            for m in msgs:
                s.put(m)
                self.states.append(dict(s.messages))
            s.update(edited(msgs[1]))
            self.states.append(dict(s.messages))
            s.delete(msgs[0].message_id)
            self.states.append(dict(s.messages))
            self.final = dict(s.messages)
        self.log = (self.dir / "active.log").read_bytes()
        self.snapshot = (self.dir / "snapshot.bin").read_bytes()
        self.bounds = [0]
        pos = 0
        while pos < len(self.log):
            (length,) = struct.unpack_from("<I", self.log, pos + 8)
            pos += HEADER_SIZE + length
            self.bounds.append(pos)

    def store_with(self, log: bytes, snapshot: bytes | None, where: str) -> Path:
        d = Path(where) / "store"
        d.mkdir(mode=0o700)
        (d / "active.log").write_bytes(log)
        if snapshot is not None:
            (d / "snapshot.bin").write_bytes(snapshot)
        return d


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    return Base(tmp_path_factory.mktemp("fuzz"))


# A mutation: (kind, position as a fraction of the length, length, byte)
mutations = st.lists(
    st.tuples(
        st.sampled_from(["flip", "set", "zeros", "insert", "delete", "cut"]),
        st.floats(0, 1, allow_nan=False),
        st.integers(1, 64),
        st.integers(0, 255),
    ),
    min_size=1,
    max_size=4,
)


def mutate(data: bytes, muts: list[tuple[str, float, int, int]], start: int = 0) -> bytes:
    b = bytearray(data)
    for kind, where, n, byte in muts:
        if len(b) <= start:
            break
        i = start + int(where * (len(b) - start - 1))
        if kind == "flip":
            b[i] ^= byte or 1
        elif kind == "set":
            b[i : i + n] = bytes([byte]) * len(b[i : i + n])
        elif kind == "zeros":
            b[i : i + n] = bytes(len(b[i : i + n]))
        elif kind == "insert":
            b[i:i] = bytes([byte]) * n
        elif kind == "delete":
            del b[i : i + n]
        else:
            del b[i:]
    return bytes(b)


def run(tally: Tally, body: Callable[[], None]) -> None:
    with tally:
        body()


def check_log(base: Base, log: bytes, tally: Tally) -> None:
    with tempfile.TemporaryDirectory(prefix="storage-fuzz-") as where:
        d = base.store_with(log, None, where)
        tally.cases += 1
        try:
            s = Store.open(d)
        except CorruptStoreError:
            return
        except BaseException:
            tally.crashed += 1
            raise
        try:
            got = dict(s.messages)
            if got not in base.states:
                tally.changed += 1
            assert got in base.states  # a prefix of the history, never an altered one
            assert list(got) == list(base.states[base.states.index(got)])
            assert s.check() == []
        finally:
            s.close()


def _log_fuzz(base: Base, tally: Tally, settings_: settings) -> None:
    @settings_
    @given(muts=mutations)
    def fuzz(muts: list[tuple[str, float, int, int]]) -> None:
        check_log(base, mutate(base.log, muts), tally)

    run(tally, fuzz)


def test_mutated_logs_open_as_a_prefix_or_refuse(base: Base) -> None:
    _log_fuzz(base, Tally("log with mutated bytes (hypothesis)"), FAST)


@pytest.mark.slow
def test_many_mutated_logs_open_as_a_prefix_or_refuse(base: Base) -> None:
    _log_fuzz(base, Tally("log with mutated bytes (hypothesis)"), SLOW)


def _crafted_record_fuzz(base: Base, tally: Tally, settings_: settings) -> None:
    @settings_
    @given(record=st.integers(1, 6), muts=mutations)
    def fuzz(record: int, muts: list[tuple[str, float, int, int]]) -> None:
        start, end = base.bounds[record], base.bounds[record + 1]
        payload = mutate(base.log[start + HEADER_SIZE : end], muts) or b"x"
        head = bytearray(base.log[start : start + HEADER_SIZE])
        head[8:12] = struct.pack("<I", len(payload))
        head[20:24] = struct.pack("<I", zlib.crc32(payload))
        head[24:28] = struct.pack("<I", zlib.crc32(bytes(head[:24])))
        log = base.log[:start] + bytes(head) + payload + base.log[end:]
        with tempfile.TemporaryDirectory(prefix="storage-fuzz-") as where:
            d = base.store_with(log, None, where)
            tally.cases += 1
            try:
                s = Store.open(d)
            except CorruptStoreError:
                return
            except BaseException:
                tally.crashed += 1
                raise
            try:
                assert s.check() == []
            finally:
                s.close()

    run(tally, fuzz)


def test_crafted_record_payloads_reach_the_decoder_safely(base: Base) -> None:
    _crafted_record_fuzz(base, Tally("record payload mutated, CRCs recomputed (hypothesis)"), FAST)


@pytest.mark.slow
def test_many_crafted_record_payloads(base: Base) -> None:
    _crafted_record_fuzz(base, Tally("record payload mutated, CRCs recomputed (hypothesis)"), SLOW)


def _snapshot_fuzz(base: Base, tally: Tally, settings_: settings, crafted: bool) -> None:
    @settings_
    @given(muts=mutations)
    def fuzz(muts: list[tuple[str, float, int, int]]) -> None:
        if crafted:
            body = mutate(snapshot_body(base.snapshot), muts)
            snapshot = resign_snapshot(base.snapshot, body)
        else:
            snapshot = mutate(base.snapshot, muts)
        with tempfile.TemporaryDirectory(prefix="storage-fuzz-") as where:
            d = base.store_with(base.log, snapshot, where)
            tally.cases += 1
            try:
                s = Store.open(d)
            except BaseException:
                tally.crashed += 1
                raise
            try:
                if crafted:
                    return  # a valid-CRC snapshot of other rows is trusted: no crash is the bar
                if snapshot != base.snapshot:
                    assert s.stats().snapshot_valid is False
                got = dict(s.messages)
                if got != base.final or list(got) != list(base.final):
                    tally.changed += 1
                assert got == base.final and list(got) == list(base.final)
            finally:
                s.close()

    run(tally, fuzz)


def test_mutated_snapshots_fall_back_to_the_log(base: Base) -> None:
    _snapshot_fuzz(base, Tally("snapshot with mutated bytes (hypothesis)"), FAST, False)


def test_crafted_snapshot_bodies_never_stop_the_open(base: Base) -> None:
    _snapshot_fuzz(base, Tally("snapshot body mutated, CRCs recomputed (hypothesis)"), FAST, True)


@pytest.mark.slow
def test_many_mutated_snapshots(base: Base) -> None:
    _snapshot_fuzz(base, Tally("snapshot with mutated bytes (hypothesis)"), SLOW, False)
    _snapshot_fuzz(base, Tally("snapshot body mutated, CRCs recomputed (hypothesis)"), SLOW, True)
