"""A data dir as a power cut leaves it on a disk that reorders the unsynced tail's blocks: for
`convmem repair`'s tests (tests/transfer) and the app's (tests/app)."""

from __future__ import annotations

import shutil
from pathlib import Path

from convmem_engine.domain import Message
from convmem_engine.service.ids import UlidSource
from convmem_engine.storage import Store
from convmem_engine.storage.store import LOG_NAME

BLOCK = 4096
UNTRACKED = ("lock", "lock.pid")


def crashed_store(tmp_path: Path, synced: int, unsynced: int) -> tuple[Path, list[str]]:
    """A data dir as a power cut leaves it: `synced` acknowledged writes (the first half closed
    into a snapshot), then `unsynced` more written and never synced, with the files copied
    before any close. Returns the copy and the acknowledged ids."""
    live = tmp_path / "live"
    clock = iter(range(1_700_000_000_000, 1_800_000_000_000, 10))
    ids = UlidSource(lambda: next(clock))
    acked: list[str] = []

    def put(store: Store, i: int) -> int:
        mid, ts = ids.next()
        acked.append(mid)
        return store.write_put(Message(mid, f"s{i % 3}", ts, "user", f"message {i} " + "x" * 300))

    store = Store.open(live)
    for i in range(synced // 2):
        store.sync(put(store, i))
    store.close()  # a snapshot covers the first half
    store = Store.open(live)
    for i in range(synced // 2, synced):
        store.sync(put(store, i))
    for i in range(synced, synced + unsynced):
        put(store, i)
    del acked[synced:]  # written, never synced: not acknowledged
    cut = tmp_path / "data"
    shutil.copytree(live, cut, ignore=shutil.ignore_patterns(*UNTRACKED))
    store.close()
    return cut, acked


def zero_block_before_the_end(data: Path, blocks_from_end: int) -> int:
    """A later block of the unsynced tail kept, an earlier one zeroed (reordering)."""
    log = data / LOG_NAME
    size = log.stat().st_size
    hole = (size // BLOCK - blocks_from_end) * BLOCK
    with open(log, "r+b") as f:
        f.seek(hole)
        f.write(b"\0" * BLOCK)
    return hole
