"""The column blocks of a CMSNAP5 snapshot body (storage/packed.py; CMSNAP6's blocks are in
test_storage_heads.py): a run of plain values is written as one block (the ids, then the
values, each part split at 0xFF, which UTF-8 never holds) and loaded with a handful of C-level
operations, checking every value as a packed row of CMSNAP4 is checked. Round trips against
the older layouts; each check refuses its crafted block (CRCs recomputed) whole, and the store
then replays its log; an older snapshot is rewritten at close with the derived files' tag
still valid."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import (
    RICH_METADATA,
    binary_rows_snapshot,
    make_message,
    resign_snapshot,
    snapshot_body,
)
from test_packed_review import fields
from test_storage_derived import FORMAT, NAME, payload, read_payload
from test_storage_packed import _load, _snapshot_of

from convmem_engine.domain import DEFAULT_METADATA, ROLES, Message
from convmem_engine.storage import FileSystem, Store, packed
from convmem_engine.storage import snapshot as snap
from convmem_engine.storage.packed import MessageTable


@given(limit=st.integers(0, 1 << 33), number=st.integers(0, (1 << 32) - 1))
@settings(max_examples=500)
def test_below_is_the_comparison(limit: int, number: int) -> None:
    near = min(max(limit - 1, 0), (1 << 32) - 1)
    pattern = re.compile(b"(?s)" + packed.below(limit))
    for n in (number, near, min(limit, (1 << 32) - 1)):
        assert bool(pattern.fullmatch(n.to_bytes(4, "little"))) == (n < limit)


UTF8_EDGES = [
    b"\xc0\xaf", b"\xc1\xbf", b"\xc2\x80", b"\xdf\xbf", b"\xe0\x9f\xbf", b"\xe0\xa0\x80",
    b"\xed\x9f\xbf", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xee\x80\x80", b"\xef\xbf\xbf",
    b"\xf0\x8f\xbf\xbf", b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80",
    b"\xf5\x80\x80\x80", b"\x80", b"\xbf", b"\xc3", b"\xe2\x82", b"\x7f", b"\x00",
]  # fmt: skip


@given(
    data=st.one_of(
        st.text().map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.binary(max_size=12),
        st.lists(st.sampled_from(UTF8_EDGES), max_size=4).map(b"".join),
    )
)
@settings(max_examples=1000)
def test_the_utf8_pattern_is_the_decoder(data: bytes) -> None:
    data = data.replace(b"\xff", b"")
    try:
        data.decode("utf-8")
        valid = True
    except UnicodeDecodeError:
        valid = False
    assert bool(re.fullmatch(packed.UTF8_TEXT, data)) == valid


@st.composite
def message_lists(draw: st.DrawFn) -> list[Message]:
    """Messages of every shape, with runs of plain ones long enough for column blocks."""
    out: list[Message] = []
    for group in range(draw(st.integers(0, 5))):
        if draw(st.booleans()):
            sid, ts, role, content, rev, upd, md = draw(fields())
            mid = f"{group}:{draw(st.text(max_size=4))}"
            out.append(Message(mid, sid, ts, role, content, rev, upd, md))
            continue
        n = draw(st.sampled_from([1, packed._MIN_BLOCK - 1, packed._MIN_BLOCK, 40]))
        words = st.text(max_size=30)
        for i in range(n):
            mid = f"{group}.{i}" + draw(st.sampled_from(["", "é", "\x00", "☃", "\n"]))
            session = draw(st.sampled_from(["s", "t", "セ", ""]))
            role = draw(st.sampled_from(ROLES))
            ts = draw(st.integers(-(1 << 63), (1 << 63) - 1))
            rev = draw(st.integers(0, (1 << 32) - 1))
            out.append(Message(mid, session, ts, role, draw(words), rev, ts, DEFAULT_METADATA))
    return out


def _state(table: MessageTable) -> tuple[object, ...]:
    return (
        list(table.stored_items()),
        table._sessions,
        table._session_numbers,
        # (not its containers' bytes: the parts it is held in depend on the layout loaded)
        dataclasses.replace(table.memory(), table_bytes=0),
    )


@given(msgs=message_lists(), deleted=st.sets(st.integers(0, 200), max_size=5))
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_round_trip_equals_the_older_layout(
    tmp_path: Path, msgs: list[Message], deleted: set[int]
) -> None:
    """Written in column blocks and in the older binary rows, reopened: the same messages in
    the same order, the same session table, the same memory counts (and those a fresh count)."""
    table = MessageTable()
    for m in msgs:
        table.set(m)
    for i, mid in enumerate(list(table.keys())):
        if i in deleted:
            table.pop(mid)
    table.prune_sessions()  # placeholders "" for the sessions of the deleted
    expected = list(table.values())
    loaded = []
    for layout in (snap.HEADS, snap.COLUMNS, snap.BINARY):
        path = tmp_path / f"{layout}.bin"
        path.unlink(missing_ok=True)
        fs = FileSystem()
        fd = fs.open_new(str(path))
        try:
            snap.write_snapshot_file(fs, fd, table, layout, count=len(table), **META)
        finally:
            fs.close(fd)
        t = _load(path)
        assert list(t.values()) == expected
        assert list(t.history_rows()) == [
            (m.message_id, m.session_id, m.metadata) for m in expected
        ]
        assert list(t.with_metadata()) == [m for m in expected if m.metadata != DEFAULT_METADATA]
        others = t._others
        assert t.memory() == MessageTable.recount(t) == t.memory() and t._others == others
        loaded.append(_state(t))
    assert loaded[0] == loaded[1] == loaded[2]


META = dict.fromkeys(
    (
        "generation",
        "log_offset",
        "log_prefix_crc32",
        "last_sequence",
        "record_count",
        "deleted_records",
        "update_records",
        "live_bytes",
    ),
    1,
)


def _session(sid: bytes) -> bytes:
    return packed.ROW.pack(packed.SESSION_ROW, len(sid), 0) + sid


def _head(ts: int = 1, session: int = 0, role: int = 0, flags: int = 0, rev: int = 1) -> bytes:
    return packed.HEAD.pack(ts, session, role, flags, rev)


def _block(ids: list[bytes], values: list[bytes], end: bytes = b"\xff") -> bytes:
    id_blob = b"\xff".join(ids)
    value_blob = b"\xff".join(values) + end
    return (
        packed.ROW.pack(packed.COLUMN_BLOCK, len(id_blob), len(value_blob)) + id_blob + value_blob
    )


N = packed._MIN_BLOCK
IDS = [b"m%02d" % i for i in range(N)]
GOOD = [_head(ts=i, role=i % 3) + b"text %d \xc3\xa9" % i for i in range(N)]


def _with(i: int, value: bytes) -> list[bytes]:
    return [*GOOD[:i], value, *GOOD[i + 1 :]]


CRAFTED = {
    "content not UTF-8": _block(IDS, _with(3, _head() + b"bad \xc3")),
    "content overlong": _block(IDS, _with(3, _head() + b"\xc0\xaf")),
    "content a surrogate": _block(IDS, _with(0, _head() + b"\xed\xa0\x80")),
    "content holds the separator": _block(IDS, _with(3, _head() + b"a\xff" + _head() + b"b")),
    "id not UTF-8": _block([*IDS[:5], b"\xc3", *IDS[6:]], GOOD),
    "id a surrogate": _block([*IDS[:5], b"\xed\xb3\xbf", *IDS[6:]], GOOD),
    "session out of range": _block(IDS, _with(7, _head(session=2) + b"x")),
    "session far out of range": _block(IDS, _with(7, _head(session=1 << 31) + b"x")),
    "unknown role": _block(IDS, _with(N - 1, _head(role=len(ROLES)) + b"x")),
    "flags in a block": _block(IDS, _with(2, _head(flags=packed.UPDATED) + b"\0" * 8)),
    "unknown flags": _block(IDS, _with(2, _head(flags=4) + b"x")),
    "value shorter than its header": _block(IDS, _with(9, b"\x00" * 10)),
    "fewer ids than values": _block(IDS[:-1], GOOD),
    "more ids than values": _block([*IDS, b"m99"], GOOD),
    "last value not ended": _block(IDS, GOOD, end=b""),
    "empty block": packed.ROW.pack(packed.COLUMN_BLOCK, 0, 0),
    "block cut short": _block(IDS, GOOD)[:-7],
    "a duplicate session id": _session(b"t") + _block(IDS, GOOD),
    "a duplicate message id": _block([*IDS[:-1], IDS[0]], GOOD),
}


def _sessions(*sids: bytes) -> bytes:
    blob = b"\xff".join(sids)
    return packed.ROW.pack(packed.SESSION_BLOCK, len(blob), 0) + blob


CRAFTED_SESSIONS = {
    "a session id twice in a block": _sessions(b"s", b"t", b"s") + _block(IDS, GOOD),
    "a session id of a row before": _session(b"s") + _sessions(b"t", b"s") + _block(IDS, GOOD),
    "a session id of a block before": _sessions(b"s") + _sessions(b"t", b"s"),
    "a session id not UTF-8": _sessions(b"s", b"t\xc3") + _block(IDS, GOOD),
    "a session id a surrogate": _sessions(b"s", b"\xed\xb3\xbf") + _block(IDS, GOOD),
    "a session block with a value": packed.ROW.pack(packed.SESSION_BLOCK, 1, 1) + b"sx",
    "too few sessions for the values": _sessions(b"s") + _block(IDS, _with(1, _head(session=1))),
}
GOOD_SESSIONS = {
    "two blocks": _sessions(b"s") + _sessions(b"t") + _block(IDS, GOOD),
    "placeholders": _sessions(b"", b"s", b"") + _sessions(b"", b"t") + _block(IDS, GOOD),
    "rows and a block": _session(b"s") + _sessions(b"", b"t") + _block(IDS, GOOD),
}


@pytest.mark.parametrize("case", sorted(CRAFTED_SESSIONS))
def test_a_crafted_session_block_is_refused(tmp_path: Path, case: str) -> None:
    path = _snapshot_of(tmp_path, [make_message(f"m{i}") for i in range(N)])
    data = path.read_bytes()
    path.write_bytes(resign_snapshot(data, CRAFTED_SESSIONS[case]))
    with pytest.raises(snap.SnapshotError):
        _load(path)


@pytest.mark.parametrize("case", sorted(GOOD_SESSIONS))
def test_session_blocks_number_as_session_rows(tmp_path: Path, case: str) -> None:
    path = _snapshot_of(tmp_path, [make_message(f"m{i}") for i in range(N)])
    data = path.read_bytes()
    path.write_bytes(resign_snapshot(data, GOOD_SESSIONS[case]))
    table = _load(path)
    named = [s for s in table._sessions if s]
    assert named == ["s", "t"]
    assert table._session_numbers == {
        "s": table._sessions.index("s"),
        "t": table._sessions.index("t"),
        **({"": table._sessions.index("")} if "" in table._sessions else {}),
    }
    assert [m.session_id for m in table.values()] == [table._sessions[0]] * N
    assert table.memory() == MessageTable.recount(table)


def _crafted_body(rows: bytes) -> bytes:
    return _session(b"s") + _session(b"t") + rows


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_column_block_is_refused(tmp_path: Path, case: str) -> None:
    path = _snapshot_of(tmp_path, [make_message(f"m{i}") for i in range(N)])
    data = path.read_bytes()
    path.write_bytes(resign_snapshot(data, _crafted_body(CRAFTED[case])))
    with pytest.raises(snap.SnapshotError):
        _load(path)
    path.write_bytes(resign_snapshot(data, _crafted_body(_block(IDS, GOOD))))
    table = _load(path)  # the same frame, well formed
    assert [m.content for m in table.values()] == [f"text {i} é" for i in range(N)]
    assert [m.role for m in table.values()] == [ROLES[i % 3] for i in range(N)]
    assert table.memory() == MessageTable.recount(table)


def test_a_column_block_in_an_older_layout_is_refused(tmp_path: Path) -> None:
    path = _snapshot_of(tmp_path, [make_message(f"m{i}") for i in range(N)], snap.BINARY)
    data = path.read_bytes()
    path.write_bytes(resign_snapshot(data, _crafted_body(_block(IDS, GOOD))))
    with pytest.raises(snap.SnapshotError):
        _load(path)


def _store_with_blocks(d: Path) -> list[tuple[str, Message]]:
    with Store.open(d) as s:
        for i in range(3 * N):
            s.put(make_message(f"plain {i}", session=f"s{i % 4}"))
        s.put(make_message("rich", metadata=RICH_METADATA))
        s.put(Message("01JX", "s1", 5, "tool", "kept whole", 1, 5, DEFAULT_METADATA))
        for i in range(N):
            s.put(make_message(f"plain again {i} ü"))
        assert s.write_derived(NAME, FORMAT, lambda: payload(2, b"idx"))
        return list(s.messages.items())


def _first_block_heads(body: bytes) -> int:
    """Where the header column of the body's first HEAD_BLOCK starts."""
    pos = 0
    while True:
        kind, a, b = packed.ROW.unpack_from(body, pos)
        if kind == packed.HEAD_BLOCK:
            return pos + packed.ROW_SIZE + a
        pos += packed.ROW_SIZE + a + b


@pytest.mark.parametrize("case", ["content not UTF-8", "session out of range", "unknown role"])
def test_a_store_with_a_crafted_block_replays_its_log(tmp_path: Path, case: str) -> None:
    state = _store_with_blocks(tmp_path)
    data = (tmp_path / "snapshot.bin").read_bytes()
    body = snapshot_body(data)
    start = body.index(b"plain 3")  # inside the first block's contents
    head = _first_block_heads(body) + 3 * packed.HEAD_SIZE  # the header of "plain 3"
    bad = {
        "content not UTF-8": body[:start] + b"\xc3" + body[start + 1 :],
        "session out of range": body[: head + 10] + b"\xff\xff" + body[head + 12 :],
        "unknown role": body[: head + 12] + b"\x07" + body[head + 13 :],
    }[case]
    assert len(bad) == len(body)
    (tmp_path / "snapshot.bin").write_bytes(resign_snapshot(data, bad))
    with Store.open(tmp_path) as s:
        assert s.stats().snapshot_valid is False
        assert s.take_open_changes() is None  # the full replay
        assert list(s.messages.items()) == state
        assert read_payload(s) is None  # a derived file is only for the snapshot loaded
    with Store.open(tmp_path) as s:  # the close wrote a good snapshot again
        assert s.stats().snapshot_valid is True and s.check() == []
        assert list(s.messages.items()) == state


def test_an_older_binary_snapshot_is_rewritten_at_close_and_keeps_the_derived_file(
    tmp_path: Path,
) -> None:
    """A store closed by the version before the column blocks (CMSNAP4), its search.idx-like
    derived file written with that snapshot: it opens from the snapshot, hands out the derived
    file, and the close writes the same state in the new layout (the log untouched): the
    derived file's tag still names it, at this open and the next."""
    state = _store_with_blocks(tmp_path)
    columns = (tmp_path / "snapshot.bin").read_bytes()
    assert columns.startswith(snap.MAGIC)
    older = binary_rows_snapshot(columns)
    assert older.startswith(b"CMSNAP4\n") and len(older) > len(columns)
    (tmp_path / "snapshot.bin").write_bytes(older)
    log = (tmp_path / "active.log").read_bytes()
    with Store.open(tmp_path) as s:
        assert s.stats().snapshot_valid is True and s.take_open_changes() == {}
        assert list(s.messages.items()) == state
        assert read_payload(s) == b"idx" * 10000
    assert (tmp_path / "active.log").read_bytes() == log
    assert (tmp_path / "snapshot.bin").read_bytes() == columns
    with Store.open(tmp_path) as s:
        assert s.take_open_changes() == {} and list(s.messages.items()) == state
        assert read_payload(s) == b"idx" * 10000
        assert s.check() == []


def test_column_blocks_hold_the_plain_runs(tmp_path: Path) -> None:
    """What the writer chooses: runs of at least _MIN_BLOCK plain values as blocks of at most
    BLOCK_ROWS, shorter runs and the rest as rows."""
    msgs = [make_message(f"p{i}") for i in range(packed.BLOCK_ROWS + 5)]
    msgs.append(make_message("rich", metadata=RICH_METADATA))
    msgs += [make_message(f"q{i}") for i in range(N - 1)]
    body = snapshot_body(_snapshot_of(tmp_path, msgs).read_bytes())
    kinds: list[object] = []
    pos = 0
    while pos < len(body):
        kind, a, b = packed.ROW.unpack_from(body, pos)
        ids = body[pos + packed.ROW_SIZE : pos + packed.ROW_SIZE + a]
        kinds.append((kind, ids.count(b"\xff") + 1) if kind == packed.COLUMN_BLOCK else kind)
        pos += packed.ROW_SIZE + a + b
    assert kinds == [
        packed.SESSION_BLOCK,
        (packed.COLUMN_BLOCK, packed.BLOCK_ROWS),
        *[packed.PACKED_ROW] * 5,
        packed.PACKED_ROW,
        *[packed.PACKED_ROW] * (N - 1),
    ]
    assert list(_load(tmp_path / "s.bin").values()) == msgs
