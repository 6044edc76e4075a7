"""The column blocks of a CMSNAP6 snapshot body (packed.HEAD_BLOCK): the headers of a run of
plain values as one column of 18-byte fields, their contents as another split at 0xFF. Each
block is checked whole when loaded (each check refuses its crafted block, CRCs recomputed)
and held as it was read until one of its messages is read or changed or a reader goes
through them all (packed._Block): every reader sees the same messages as from the older
layouts, in the same order, before and after, and a block written again before it is opened
is written byte for byte as it was read. The table's parts are found by their id ranges when
those are in order and apart (a store's ULIDs), else by looking in each."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from storage_helpers import RICH_METADATA, make_message, resign_snapshot, snapshot_body
from test_storage_columns import IDS, N, _crafted_body, _head, _session
from test_storage_packed import _load, _snapshot_of

from convmem_engine.domain import DEFAULT_METADATA, ROLES, Message
from convmem_engine.storage import Store, packed
from convmem_engine.storage import snapshot as snap
from convmem_engine.storage.packed import MessageTable

TEXTS = [b"text %d \xc3\xa9" % i for i in range(N)]
HEADS = [_head(ts=i, role=i % 3) for i in range(N)]


def _block(ids: list[bytes], heads: list[bytes], texts: list[bytes], end: bytes = b"\xff") -> bytes:
    id_blob = b"\xff".join(ids)
    rest = b"".join(heads) + b"\xff".join(texts) + end
    return packed.ROW.pack(packed.HEAD_BLOCK, len(id_blob), len(rest)) + id_blob + rest


def _with(items: list[bytes], i: int, value: bytes) -> list[bytes]:
    return [*items[:i], value, *items[i + 1 :]]


GOOD = _block(IDS, HEADS, TEXTS)
CRAFTED = {
    "content not UTF-8": _block(IDS, HEADS, _with(TEXTS, 3, b"bad \xc3")),
    "content overlong": _block(IDS, HEADS, _with(TEXTS, 3, b"\xc0\xaf")),
    "content a surrogate": _block(IDS, HEADS, _with(TEXTS, 0, b"\xed\xa0\x80")),
    "content holds the separator": _block(IDS, HEADS, _with(TEXTS, 3, b"a\xffb")),
    "id not UTF-8": _block([*IDS[:5], b"\xc3", *IDS[6:]], HEADS, TEXTS),
    "session out of range": _block(IDS, _with(HEADS, 7, _head(session=2)), TEXTS),
    "session far out of range": _block(IDS, _with(HEADS, 7, _head(session=1 << 31)), TEXTS),
    "unknown role": _block(IDS, _with(HEADS, N - 1, _head(role=len(ROLES))), TEXTS),
    "flags in a block": _block(IDS, _with(HEADS, 2, _head(flags=packed.UPDATED)), TEXTS),
    "unknown flags": _block(IDS, _with(HEADS, 2, _head(flags=4)), TEXTS),
    "a header short": _block(IDS, _with(HEADS, 9, b"\x00" * 10), TEXTS),
    "fewer ids than values": _block(IDS[:-1], HEADS, TEXTS),
    "more ids than values": _block([*IDS, b"m99"], HEADS, TEXTS),
    "fewer contents than headers": _block(IDS, HEADS, TEXTS[:-1]),
    "last content not ended": _block(IDS, HEADS, TEXTS, end=b""),
    "empty block": packed.ROW.pack(packed.HEAD_BLOCK, 0, 0),
    "block cut short": GOOD[:-7],
    "a duplicate session id": _session(b"t") + GOOD,
    "a duplicate message id": _block([*IDS[:-1], IDS[0]], HEADS, TEXTS),
    "a message id in two blocks": GOOD
    + _block([b"z%02d" % i for i in range(N - 1)] + [IDS[4]], HEADS, TEXTS),
    "a CMSNAP5 block": packed.ROW.pack(packed.COLUMN_BLOCK, 0, 0),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_block_is_refused(tmp_path: Path, case: str) -> None:
    path = _snapshot_of(tmp_path, [make_message(f"m{i}") for i in range(N)], snap.HEADS)
    data = path.read_bytes()
    path.write_bytes(resign_snapshot(data, _crafted_body(CRAFTED[case])))
    with pytest.raises(snap.SnapshotError):
        _load(path)
    path.write_bytes(resign_snapshot(data, _crafted_body(GOOD)))
    table = _load(path)  # the same frame, well formed
    assert [m.content for m in table.values()] == [f"text {i} é" for i in range(N)]
    assert [m.role for m in table.values()] == [ROLES[i % 3] for i in range(N)]
    assert table.memory() == MessageTable.recount(table)


def test_a_block_in_an_older_layout_is_refused(tmp_path: Path) -> None:
    path = _snapshot_of(tmp_path, [make_message(f"m{i}") for i in range(N)], snap.COLUMNS)
    data = path.read_bytes()
    path.write_bytes(resign_snapshot(data, _crafted_body(GOOD)))
    with pytest.raises(snap.SnapshotError):
        _load(path)


def _messages(n: int, first: int = 0, sessions: int = 7) -> list[Message]:
    """Plain messages (column blocks), a rich one and a kept one in the middle."""
    out = [make_message(f"plain {i} ü", session=f"s{i % sessions}") for i in range(n // 2)]
    out.append(make_message("rich", metadata=RICH_METADATA))
    mid = make_message().message_id  # (ids in creation order, as a store's)
    out.append(Message(mid, "s1", 5, "tool", "kept whole", 1, 5, DEFAULT_METADATA))
    out += [make_message(f"plain {i} ü", session=f"s{i % sessions}") for i in range(n // 2, n)]
    return out


@pytest.mark.parametrize("ordered", [True, False])
def test_pending_blocks_read_as_opened_ones(tmp_path: Path, ordered: bool) -> None:
    """Every reader of a freshly loaded table (blocks pending) sees what the same table with
    every block opened shows, and what the messages were; changes to a pending block's
    messages open it first. With ids out of order the parts are looked in one by one."""
    msgs = _messages(3 * packed.BLOCK_ROWS + 50)
    if not ordered:
        msgs.reverse()
    path = _snapshot_of(tmp_path, msgs, snap.HEADS)
    ids = [m.message_id for m in msgs]
    fresh = _load(path)
    assert (fresh._lows is not None) == ordered
    assert len(fresh._pending) == 4 and all(b.ids for b, _ in fresh._pending)  # none opened
    assert len(fresh) == len(msgs) and list(fresh.keys()) == ids
    assert fresh.history_columns() is None  # (the rich message)
    assert list(fresh.history_rows()) == [(m.message_id, m.session_id, m.metadata) for m in msgs]
    rich = [m for m in msgs if m.metadata != DEFAULT_METADATA]
    assert len(rich) == 1 and list(_load(path).with_metadata()) == rich
    table = _load(path)
    probe = ids[5]  # in a block
    assert table.max_id() == max(ids)
    assert probe in table and "nope" not in table and 5 not in table
    assert table.get(probe) == msgs[5] and table.get("nope") is None
    assert sum(1 for b, _ in table._pending if b.ids is None) == 1  # that block only
    assert list(table.values()) == msgs
    assert table.memory() == MessageTable.recount(table) == fresh.memory()
    changed = _load(path)
    m = msgs[-7]
    new = Message(m.message_id, m.session_id, m.timestamp, m.role, "new", 2, 9, m.metadata)
    changed.set(new)
    assert changed.pop(ids[1]) == msgs[1]
    changed.set(make_message("last"))
    assert list(changed.keys()) == [
        *ids[:1],
        *ids[2:],
        changed.get(list(changed.keys())[-1]).message_id,
    ]  # type: ignore[union-attr]
    assert changed.get(m.message_id) == new
    assert changed.memory() == MessageTable.recount(changed)


def test_history_columns_read_the_pending_blocks(tmp_path: Path) -> None:
    msgs = [make_message(f"p{i}", session=f"s{i // 300}") for i in range(2 * packed.BLOCK_ROWS)]
    path = _snapshot_of(tmp_path, msgs, snap.HEADS)
    fresh = _load(path)
    columns = fresh.history_columns()
    assert columns is not None and fresh._pending and all(b.ids for b, _ in fresh._pending)
    keys, numbers, sessions = columns
    assert [(k, sessions[n]) for k, n in zip(keys, numbers, strict=True)] == [
        (m.message_id, m.session_id) for m in msgs
    ]
    fresh.set(make_message("one more", session="s0"))  # changed: read from the values
    keys, numbers, sessions = fresh.history_columns()  # type: ignore[misc]
    assert [sessions[n] for n in numbers][-2:] == [msgs[-1].session_id, "s0"]


def test_a_pending_block_is_written_as_it_was_read(tmp_path: Path) -> None:
    msgs = _messages(2 * packed.BLOCK_ROWS + 20)
    path = _snapshot_of(tmp_path, msgs, snap.HEADS)
    body = snapshot_body(path.read_bytes())
    table = _load(path)
    assert b"".join(table.binary_rows(1 << 20, heads=True)) == body  # nothing opened
    assert table._pending and all(b.ids for b, _ in table._pending)
    table.get(msgs[3].message_id)  # the first block opened: written again from its values
    assert b"".join(table.binary_rows(1 << 20, heads=True)) == body
    assert b"".join(table.binary_rows(77, heads=True)) == body  # small pieces


def test_readers_open_a_block_once(tmp_path: Path) -> None:
    msgs = [make_message(f"p{i}") for i in range(packed.BLOCK_ROWS)]
    table = _load(_snapshot_of(tmp_path, msgs, snap.HEADS))
    start = threading.Barrier(8)
    seen: list[list[Message | None]] = []

    def read() -> None:
        start.wait()
        seen.append([table.get(m.message_id) for m in msgs[::97]])

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [msgs[::97]] * 8
    assert list(table.values()) == msgs and table.memory() == MessageTable.recount(table)


def test_a_store_reopens_from_pending_blocks(tmp_path: Path) -> None:
    """A store: written, closed, reopened (blocks pending), written to and compacted, closed
    and reopened again: the same messages all along, its check clean."""
    with Store.open(tmp_path) as s:
        for m in _messages(packed.BLOCK_ROWS + 100):
            s.put(m)
        state = list(s.messages.items())
    assert (tmp_path / "snapshot.bin").read_bytes().startswith(b"CMSNAP6\n")
    with Store.open(tmp_path) as s:
        assert s.stats().snapshot_valid and list(s.messages.items()) == state
        assert s.check() == []
        first = state[0][0]
        s.delete(first)
        extra = make_message("after")
        s.put(extra)
        state = [*state[1:], (extra.message_id, extra)]
        assert list(s.messages.items()) == state
        s.compact()
        assert list(s.messages.items()) == state and s.check() == []
    with Store.open(tmp_path) as s:
        assert list(s.messages.items()) == state and s.check() == []


def test_opening_blocks_releases_their_buffers() -> None:
    """`release` (the service's malloc_trim) runs every RELEASE_EVERY blocks opened and once
    they are all opened: their freed buffers go back to the system."""
    n = (packed.RELEASE_EVERY + 3) * 20
    msgs = [make_message(f"p{i}") for i in range(n)]
    table = MessageTable()
    for m in msgs:
        table.set(m)
    rows = b"".join(table.binary_rows(1 << 20, heads=True))
    loaded = MessageTable()
    assert loaded.load_binary(rows, 0, columns=True, heads=True) == len(rows)
    blocks = len(loaded._pending)
    calls: list[int] = []
    loaded.release = lambda: calls.append(1)
    loaded.get(msgs[0].message_id)
    assert calls == []
    assert list(loaded.values()) == msgs
    assert blocks == 1 and calls == [1]
    many = MessageTable()
    for i in range(0, n, 20):  # a block per run of 20 (a message with metadata between two)
        for m in msgs[i : i + 20]:
            many.set(m)
        many.set(make_message("rich", metadata=RICH_METADATA))
    rows = b"".join(many.binary_rows(1 << 20, heads=True))
    loaded = MessageTable()
    loaded.load_binary(rows, 0, columns=True, heads=True)
    assert len(loaded._pending) == packed.RELEASE_EVERY + 3
    loaded.release = lambda: calls.append(2)
    assert len(list(loaded.values())) == len(many)
    assert calls == [1, 2, 2]  # after RELEASE_EVERY blocks, then after the rest


def test_a_snapshot_leaves_pending_blocks_pending(tmp_path: Path) -> None:
    """`frozen` (the background search build's snapshot) holds a pending block's bytes as they
    are instead of opening it (a bytes object per message for the rest of the process's
    life): every block stays pending, and the snapshot still gives the messages as they were
    when it was taken, iterated or taken, whatever the table's writers do to them after."""
    msgs = _messages(3 * packed.BLOCK_ROWS + 50)
    table = _load(_snapshot_of(tmp_path, msgs, snap.HEADS))
    assert len(table._pending) == 4
    frozen = table.frozen()
    again = table.frozen()
    assert all(b.ids for b, _ in table._pending)  # none opened
    assert list(frozen) == msgs and len(frozen) == len(msgs)
    assert all(b.ids for b, _ in table._pending)  # not by reading the snapshot either
    changed = Message(msgs[3].message_id, "s9", 1, "user", "changed", 2, 2, DEFAULT_METADATA)
    table.set(changed)  # opens that block in the table
    assert table.pop(msgs[-2].message_id) == msgs[-2]
    table.set(make_message("after the snapshot"))
    assert sum(1 for b, _ in table._pending if b.ids is None) >= 1
    assert list(frozen) == msgs  # as it was taken
    keys, taken = again.take()
    assert keys == [m.message_id for m in msgs] and list(taken) == msgs
    assert len(again) == 0 and list(again) == []
    assert table.get(msgs[3].message_id) == changed


def test_a_snapshot_of_opened_and_pending_parts_is_in_order(tmp_path: Path) -> None:
    """Parts of every kind in one snapshot: opened blocks, pending ones, runs of rows (a rich
    and a kept message between the blocks) and the tail of new writes, in the table's order."""
    msgs = _messages(2 * packed.BLOCK_ROWS + 7)
    table = _load(_snapshot_of(tmp_path, msgs, snap.HEADS))
    assert table.get(msgs[0].message_id) == msgs[0]  # the first block opened
    late = [make_message(f"late {i}") for i in range(5)]
    for m in late:
        table.set(m)
    assert [b.ids is None for b, _ in table._pending].count(True) == 1
    keys, taken = table.frozen().take()
    assert list(taken) == [*msgs, *late]
    assert keys == [m.message_id for m in [*msgs, *late]]
    assert [b.ids is None for b, _ in table._pending].count(True) == 1
