"""Review of the packed in-memory table and the binary snapshot rows (issue 13), against a
plain model: messages with every field at its edges (int64 timestamps and beyond, updated_at
apart from timestamp, revisions past uint32, roles outside ROLES, non-ASCII ids and sessions,
empty content, metadata with every part set) go through puts, updates, deletes, clean closes
(CMSNAP4 written), crashes, compactions and an older store's JSON-rows snapshot (CMSNAP3), and
come back exactly, with the store's self-check (log, snapshot, memory counts) clean."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule
from storage_helpers import json_rows_snapshot

from convmem_engine.domain import DEFAULT_METADATA, Message, Metadata, Relation
from convmem_engine.domain.message import MEMORY_KINDS, MEMORY_TIERS, RELATION_TYPES, ROLES
from convmem_engine.storage import Store
from convmem_engine.storage import snapshot as snap
from convmem_engine.storage.packed import MessageTable

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12)
edge_ints = st.sampled_from([I64_MIN, I64_MAX, 0, -1, I64_MAX + 1, I64_MIN - 1, 1 << 64])
times = st.one_of(st.integers(I64_MIN, I64_MAX), edge_ints)
revisions = st.one_of(
    st.integers(0, (1 << 32) - 1), st.sampled_from([0, (1 << 32) - 1, 1 << 32, -1, 1 << 70])
)
# Not "": the tools refuse an empty session id, and the table uses "" for a session number a
# compaction freed (see test_an_empty_session_id_keeps_the_memory_counts_right below).
sessions = st.one_of(st.sampled_from(["s", "セッション", "s\n2", "\x00"]), text.filter(bool))
metadata = st.one_of(
    st.just(DEFAULT_METADATA),
    st.just(Metadata()),  # equal to the default, another object
    st.builds(
        Metadata,
        tool_call_id=st.one_of(st.none(), text),
        tags=st.lists(text, max_size=3).map(tuple),
        memory_tier=st.one_of(st.sampled_from(MEMORY_TIERS), text),
        memory_kind=st.one_of(st.sampled_from(MEMORY_KINDS), text),
        importance=st.one_of(st.integers(0, 100), edge_ints),
        summary=st.one_of(st.none(), text),
        relations=st.lists(
            st.builds(Relation, st.sampled_from(RELATION_TYPES), text), max_size=2
        ).map(tuple),
        source_message_ids=st.lists(text, max_size=2).map(tuple),
    ),
)


@st.composite
def fields(draw: st.DrawFn) -> tuple[str, int, str, str, int, int, Metadata]:
    ts = draw(times)
    upd = draw(st.one_of(st.just(ts), times))
    role = draw(st.sampled_from((*ROLES, "tool", "")))
    return (
        draw(sessions),
        ts,
        role,
        draw(st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)),
        draw(revisions),
        upd,
        draw(metadata),
    )


class PackedStoreMachine(RuleBasedStateMachine):
    ids = Bundle("ids")

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="review-packed-"))
        self.store = Store.open(self.dir)
        self.model: dict[str, Message] = {}
        self.n = 0

    def teardown(self) -> None:
        try:
            try:
                assert self.store.check() == []
            finally:
                # closed even when the check fails: an open store left to the garbage
                # collector reports its unclosed lock file in whichever later test collects it
                self.store.close()
            with Store.open(self.dir) as s:  # the last snapshot, read back
                assert list(s.messages.items()) == list(self.model.items())
                assert s.check() == []
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    @rule(target=ids, prefix=text, f=fields())
    def put(self, prefix: str, f: tuple[str, int, str, str, int, int, Metadata]) -> str:
        self.n += 1
        mid = f"{prefix}#{self.n}"
        sid, ts, role, content, rev, upd, md = f
        m = Message(mid, sid, ts, role, content, rev, upd, md)
        self.store.put(m)
        self.model[mid] = m
        return mid

    @rule(mid=ids, f=fields())
    def update(self, mid: str, f: tuple[str, int, str, str, int, int, Metadata]) -> None:
        if mid not in self.model:
            return
        sid, ts, role, content, rev, upd, md = f
        m = Message(mid, sid, ts, role, content, rev, upd, md)
        self.store.update(m)
        self.model[mid] = m

    @rule(mid=consumes(ids))
    def delete(self, mid: str) -> None:
        if mid in self.model:
            self.store.delete(mid)
            del self.model[mid]

    @rule()
    def close_and_reopen(self) -> None:
        self.store.close()
        # binary, unless the last snapshot was an old JSON-rows one and the log did not move
        assert (self.dir / "snapshot.bin").read_bytes()[:8] in (snap.MAGIC, b"CMSNAP3\n")
        self.store = Store.open(self.dir)
        assert self.store.stats().snapshot_valid
        assert self.store.take_open_changes() == {}  # loaded from the snapshot

    @rule()
    def crash_and_reopen(self) -> None:
        self.store._abandon()
        self.store = Store.open(self.dir)

    @rule()
    def compact(self) -> None:
        assert self.store.compact().messages == len(self.model)

    @rule()
    def reopen_from_a_json_rows_snapshot(self) -> None:
        """As a store last closed by the JSON-rows code (CMSNAP3), of the same state."""
        self.store.close()
        path = self.dir / "snapshot.bin"
        path.write_bytes(json_rows_snapshot(path.read_bytes(), list(self.model.values())))
        self.store = Store.open(self.dir)
        assert self.store.stats().snapshot_valid
        assert self.store.take_open_changes() == {}

    @invariant()
    def same_as_model(self) -> None:
        assert list(self.store.messages.items()) == list(self.model.items())
        assert [self.store.get(k) for k in self.model] == list(self.model.values())
        assert list(self.store.messages.frozen()) == list(self.model.values())
        memory = self.store.stats().memory
        assert memory.entries == len(self.model)
        assert memory == self.store._messages.memory()
        table = self.store._messages
        assert list(table.history_rows()) == [
            (m.message_id, m.session_id, m.metadata) for m in self.model.values()
        ]
        assert list(table.with_metadata()) == [
            m for m in self.model.values() if m.metadata != DEFAULT_METADATA
        ]
        others = table._others
        # the counts kept by every change equal a fresh count
        fresh = MessageTable.recount(self.store._messages)
        assert table._others == others
        assert (memory.entry_bytes, memory.body_bytes, memory.metadata_bytes) == (
            fresh.entry_bytes,
            fresh.body_bytes,
            fresh.metadata_bytes,
        )

    @invariant()
    def self_check(self) -> None:
        assert self.store.check() == []


PackedStoreMachine.TestCase.settings = settings(
    max_examples=15,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
test_packed_store_against_a_model = PackedStoreMachine.TestCase


class LongPackedStoreMachine(PackedStoreMachine):
    """The same, many more and longer runs (slow suite)."""


LongPackedStoreMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
test_many_packed_store_runs = pytest.mark.slow(LongPackedStoreMachine.TestCase)


@given(f=fields(), mid=text)
@settings(max_examples=300, deadline=None)
def test_pack_unpack_is_exact(f: tuple[str, int, str, str, int, int, Metadata], mid: str) -> None:
    sid, ts, role, content, rev, upd, md = f
    m = Message(mid, sid, ts, role, content, rev, upd, md)
    table = MessageTable()
    table.set(m)
    back = table.get(mid)
    assert back == m
    assert back is not None and type(back.timestamp) is int and type(back.updated_at) is int


def test_an_upgrade_drops_deleted_messages_session_ids(tmp_path: Path) -> None:
    """A format 2 store whose log deletes the only message of a session: after the upgrade
    (a compaction in all but name) that session id is in no file, as after a compaction."""
    import json
    import os

    from storage_helpers import dir_bytes

    from convmem_engine.storage.record import DEL, HEADER, HEADER_SIZE, PUT, encode_record

    d = tmp_path / "store"
    shutil.copytree(Path(__file__).parent / "fixtures" / "store-v2", d)
    (d / "expected.json").unlink()
    os.chmod(d, 0o700)
    log = (d / "active.log").read_bytes()
    pos = seq = 0
    while pos < len(log):
        seq = HEADER.unpack_from(log, pos)[5]
        pos += HEADER_SIZE + HEADER.unpack_from(log, pos)[4]
    mid = "01J00000000000000000000099"
    secret = "session-of-a-deleted-message"
    row = {
        "message_id": mid,
        "session_id": secret,
        "timestamp": 1720843200099,
        "role": "user",
        "content": "gone",
        "revision": 1,
        "updated_at": 1720843200099,
        "metadata": {
            "tags": [],
            "memory_tier": "short",
            "memory_kind": "conversation",
            "importance": 50,
            "relations": [],
            "source_message_ids": [],
        },
    }
    tail = encode_record(PUT, seq + 1, json.dumps(row).encode(), version=2)
    tail += encode_record(DEL, seq + 2, mid.encode(), version=2)
    (d / "active.log").write_bytes(log + tail)
    with Store.open(d) as s:
        assert mid not in s.messages and len(s.messages) == 5
        assert s.check() == []
    assert secret.encode() not in dir_bytes(d)


@pytest.mark.parametrize("layout", ["binary", "json-rows"])
@pytest.mark.parametrize("every", [pytest.param(1, marks=pytest.mark.slow), 17])
def test_every_bit_flip_and_cut_of_a_snapshot_falls_back_to_the_log(
    tmp_path: Path, every: int, layout: str
) -> None:
    """Exhaustively (the slow suite; by default every 17th case), for a small CMSNAP4
    snapshot and for the same state as an older store's JSON-rows CMSNAP3: a bit flipped (the
    lowest or the highest) at each byte, and the file cut at each length, is never used (the
    log is replayed, snapshot_valid false) and the state is exactly the log's; the close then
    writes a good binary snapshot again."""
    from storage_helpers import RICH_METADATA, make_message

    base = tmp_path / "base"
    with Store.open(base) as s:
        msgs = [
            make_message("plain", session="a"),
            make_message("ünï ☃", session="b", metadata=RICH_METADATA),
            Message("01JX", "a", 5, "tool", "kept whole", 1, 5, DEFAULT_METADATA),
        ]
        for m in msgs:
            s.put(m)
        s.update(Message(msgs[0].message_id, "a", msgs[0].timestamp, "user", "new", 2, 9))
        state = list(s.messages.items())
    good = (base / "snapshot.bin").read_bytes()
    assert good.startswith(snap.MAGIC)
    if layout != "binary":
        good = json_rows_snapshot(good, [m for _, m in state])
        (base / "snapshot.bin").write_bytes(good)
        with Store.open(base) as s:  # the unaltered one is used
            assert s.take_open_changes() == {} and list(s.messages.items()) == state
    log = (base / "active.log").read_bytes()
    variants = [good[:n] for n in range(len(good))]
    variants += [
        good[:i] + bytes([good[i] ^ (1 << bit)]) + good[i + 1 :]
        for i in range(len(good))
        for bit in (0, 7)
    ]
    d = tmp_path / "d"
    for bad in variants[::every]:
        d.mkdir(mode=0o700)
        (d / "active.log").write_bytes(log)
        (d / "snapshot.bin").write_bytes(bad)
        with Store.open(d) as s:
            assert list(s.messages.items()) == state
            assert s.stats().snapshot_valid is False
        assert (d / "snapshot.bin").read_bytes()[:8] == snap.MAGIC
        with Store.open(d) as s:
            assert s.stats().snapshot_valid is True and s.take_open_changes() == {}
            assert list(s.messages.items()) == state
        shutil.rmtree(d)


def test_an_empty_session_id_keeps_the_memory_counts_right(tmp_path: Path) -> None:
    """The store itself accepts a session id "" (the tools do not)."""
    with Store.open(tmp_path) as s:
        s.put(Message("a", "", 1, "user", "x", 1, 1))
        assert s.check() == []
    with Store.open(tmp_path) as s:
        s.put(Message("b", "", 2, "user", "y", 1, 2))
        assert s.check() == []
        assert [m.session_id for m in s.messages.values()] == ["", ""]
        sessions = list(s._messages._sessions)
        assert sessions == [""]  # one number for both writes
    # reopened and written again: the number of "" is reused, the session table stays as it is
    for i in range(3):
        with Store.open(tmp_path) as s:
            s.put(Message(f"c{i}", "", 3 + i, "user", "z", 1, 3 + i))
            assert s._messages._sessions == sessions
            assert s.check() == []
    # a number freed by a compaction is "" too: a later "" write may take it; nothing else does
    with Store.open(tmp_path) as s:
        s.put(Message("d", "other", 9, "user", "w", 1, 9))
        s.delete("d")
        s.compact()
        assert s._messages._sessions == ["", ""]
    with Store.open(tmp_path) as s:
        s.put(Message("e", "", 10, "user", "v", 1, 10))
        s.put(Message("f", "other", 11, "user", "u", 1, 11))
        assert s._messages._sessions == ["", "", "other"]
        assert [m.session_id for m in s.messages.values()] == ["", "", "", "", "", "", "other"]
        assert s.check() == []
