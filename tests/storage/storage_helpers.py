"""Helpers for the storage tests: message factory and a fault-injecting FileSystem."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable
from typing import IO, Any

from convmem_engine.domain import Message, Metadata, Relation
from convmem_engine.storage import FileSystem

_counter = [0]


def make_message(
    content: str = "hello",
    session: str = "s1",
    *,
    revision: int = 1,
    message_id: str | None = None,
    metadata: Metadata | None = None,
) -> Message:
    _counter[0] += 1
    n = _counter[0]
    mid = message_id or f"01J{n:023d}"
    ts = 1_720_843_200_000 + n
    return Message(
        message_id=mid,
        session_id=session,
        timestamp=ts,
        role="user" if n % 2 else "assistant",
        content=content,
        revision=revision,
        updated_at=ts,
        metadata=metadata if metadata is not None else Metadata(),
    )


RICH_METADATA = Metadata(
    tool_call_id="call-1",
    tags=("a", "ユニコード"),
    memory_tier="long",
    memory_kind="semantic",
    importance=90,
    summary="sum",
    relations=(Relation("depends_on", "01J" + "0" * 23),),
    source_message_ids=("01J" + "1" * 23,),
)


class Crash(BaseException):
    """The simulated death of the process: raised by FaultFS; nothing after it runs."""


# The operations that change something on disk (or a descriptor): the steps of a write.
STEPS = (
    "open_append",
    "open_new",
    "write",
    "fsync",
    "truncate",
    "close",
    "replace",
    "unlink",
    "fsync_dir",
    "mkdir",
)


class FaultFS(FileSystem):
    """A FileSystem that fails or "crashes" at the N-th step (counting only STEPS calls).

    mode "error": that call raises OSError(EIO) without doing anything.
    mode "short": a write writes half of its bytes and reports that, and the write after it
    raises ENOSPC, as a filling disk does (other ops: "error").
    mode "crash": that call raises Crash without doing anything; every descriptor and the lock
    file are closed (as the OS does for a dead process) and every later call raises Crash.
    """

    def __init__(self, fail_at: int | None = None, mode: str = "error", only: str | None = None):
        super().__init__()
        self.fail_at = fail_at
        self.mode = mode
        self.only = only  # count only this operation when set
        self.steps: list[str] = []
        self._step_lock = threading.Lock()
        self.crashed = False
        self.fired = False
        self._enospc_next = False
        self._fds: set[int] = set()
        self._lock_files: list[IO[Any]] = []

    def _step(self, op: str) -> str | None:
        """Record a step; return the fault to inject now (or None)."""
        if self.crashed:
            raise Crash(op)
        if self.only is not None and op != self.only:
            return None
        with self._step_lock:  # concurrent writers: exactly one call is step N
            self.steps.append(op)
            n = len(self.steps)
        if self.fail_at is not None and n == self.fail_at:
            self.fired = True
            if self.mode == "crash":
                self.crash()
                raise Crash(op)
            return self.mode
        return None

    def crash(self) -> None:
        self.crashed = True
        for fd in list(self._fds):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        for f in self._lock_files:
            f.close()

    @staticmethod
    def _eio(op: str) -> OSError:
        return OSError(errno.EIO, f"injected failure in {op}")

    def _guard(self, op: str, real: Callable[[], Any]) -> Any:
        if self._step(op) is not None:
            raise self._eio(op)
        return real()

    def open_append(self, path: str) -> int:
        fd: int = self._guard("open_append", lambda: super(FaultFS, self).open_append(path))
        self._fds.add(fd)
        return fd

    def open_new(self, path: str) -> int:
        fd: int = self._guard("open_new", lambda: super(FaultFS, self).open_new(path))
        self._fds.add(fd)
        return fd

    def open_read(self, path: str) -> int:
        if self.crashed:
            raise Crash("open_read")
        fd = super().open_read(path)
        self._fds.add(fd)
        return fd

    def write(self, fd: int, data: bytes | memoryview) -> int:
        fault = self._step("write")
        if self._enospc_next:
            self._enospc_next = False
            raise OSError(errno.ENOSPC, "injected: no space left on device")
        if fault == "short":
            self._enospc_next = True
            return super().write(
                fd, bytes(data)[: max(len(data) // 2, 1)] if len(data) > 1 else b""
            )
        if fault is not None:
            raise self._eio("write")
        return super().write(fd, data)

    def fsync(self, fd: int) -> None:
        self._guard("fsync", lambda: super(FaultFS, self).fsync(fd))

    def truncate(self, fd: int, size: int) -> None:
        self._guard("truncate", lambda: super(FaultFS, self).truncate(fd, size))

    def close(self, fd: int) -> None:
        self._fds.discard(fd)
        self._guard("close", lambda: super(FaultFS, self).close(fd))

    def replace(self, src: str, dst: str) -> None:
        self._guard("replace", lambda: super(FaultFS, self).replace(src, dst))

    def unlink(self, path: str) -> None:
        self._guard("unlink", lambda: super(FaultFS, self).unlink(path))

    def fsync_dir(self, path: str) -> None:
        self._guard("fsync_dir", lambda: super(FaultFS, self).fsync_dir(path))

    def mkdir(self, path: str) -> None:
        self._guard("mkdir", lambda: super(FaultFS, self).mkdir(path))

    def open_lock_file(self, path: str) -> IO[Any]:
        if self.crashed:
            raise Crash("open_lock_file")
        f = super().open_lock_file(path)
        self._lock_files.append(f)
        return f


def dir_bytes(path: str | os.PathLike[str]) -> bytes:
    """Every byte of every file in the data dir (for "deleted content exists nowhere")."""
    out = []
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            out.append(f.read())
    return b"".join(out)


def resign_snapshot(data: bytes, body: bytes) -> bytes:
    """`data` (a snapshot file) with its body replaced by `body` and every CRC made to match:
    what a crafted (not a damaged) snapshot looks like to the loader."""
    import json
    import zlib

    from convmem_engine.storage import snapshot as snap

    meta_len, _crc, _end = snap.TRAILER.unpack(data[-snap.TRAILER.size :])
    meta = json.loads(data[-snap.TRAILER.size - meta_len : -snap.TRAILER.size])
    meta["body_length"] = len(body)
    meta["body_crc32"] = zlib.crc32(body)
    raw = json.dumps(meta, separators=(",", ":")).encode("ascii")
    head = data[: len(snap.MAGIC)]
    return head + body + raw + snap.TRAILER.pack(len(raw), zlib.crc32(raw), snap.END_MAGIC)


def json_rows_snapshot(data: bytes, messages: list[Message]) -> bytes:
    """`data` (a snapshot file of `messages`) rewritten with the JSON-rows body (CMSNAP3) that
    snapshots had before the binary rows, its CRCs matching: a store's snapshot from then."""
    import json

    from convmem_engine.storage import snapshot as snap
    from convmem_engine.storage.codec import message_row

    rows = [message_row(m) for m in messages]
    body = json.dumps(rows, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
    return resign_snapshot(b"CMSNAP3\n" + data[len(snap.MAGIC) :], body)


def binary_rows_snapshot(data: bytes) -> bytes:
    """`data` (a snapshot file) rewritten with the binary rows without column blocks (CMSNAP4)
    that snapshots had before them, its CRCs matching: a store's snapshot from then."""
    from convmem_engine.storage import snapshot as snap
    from convmem_engine.storage.packed import MessageTable

    meta_len, _crc, _end = snap.TRAILER.unpack(data[-snap.TRAILER.size :])
    meta = snap.SnapshotMeta.from_bytes(data[-snap.TRAILER.size - meta_len : -snap.TRAILER.size])
    layout = snap.MAGICS[data[: len(snap.MAGIC)]][1]
    table = MessageTable()
    body = snapshot_body(data)
    heads = layout == snap.HEADS
    assert table.load_binary(body, 0, columns=True, heads=heads) == meta.body_length
    body = b"".join(table.binary_rows(1 << 20, columns=False))
    return resign_snapshot(snap.MAGIC_OF[snap.BINARY] + data[len(snap.MAGIC) :], body)


def snapshot_body(data: bytes) -> bytes:
    from convmem_engine.storage import snapshot as snap

    meta_len, _crc, _end = snap.TRAILER.unpack(data[-snap.TRAILER.size :])
    return data[len(snap.MAGIC) : -snap.TRAILER.size - meta_len]


# -- power loss -------------------------------------------------------------------------------

UNTRACKED = ("lock", "lock.pid")  # the lock files hold no data: not modelled
TAILS = ("none", "partial", "zeros")  # after these the store always opens
REORDERED = "blocks"  # after this one it may refuse (CORRUPT_STORE): reordering within a file
BLOCK = 4096


class _Inode:
    """One file's contents as a power loss would leave them."""

    __slots__ = ("durable", "final", "path")

    def __init__(self, path: str | None, durable: bytes = b"") -> None:
        self.path = path  # its current name (None once it has none)
        self.durable = durable  # the contents an fsync covered (read just before the fsync)
        self.final = b""  # the contents when it lost its last name

    def current(self) -> bytes:
        if self.path is None:
            return self.final
        try:
            with open(self.path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return self.final


class PowerLossFS(FaultFS):
    """FaultFS plus a model of what survives a power cut (the seam sees every step).

    - A file keeps only what its last fsync covered (the contents are read just before the
      fsync: what the real fsync covers at least). `tail` adds what a real disk may also keep
      of the unsynced rest: "partial" a prefix of it, "zeros" the whole size with the data
      only up to a 4 KiB block boundary and zeros after it (XFS, ext4 data=writeback),
      "blocks" the whole size with each 4 KiB block of the rest holding its new data or
      zeros, each block chosen by the seeded rng apart from the others (the block holding the
      synced end keeps its synced bytes): the disk wrote some later blocks of the rest and
      not earlier ones (reordering within a file).
    - The cut notes in `unsynced` each file it found longer than its last fsync covered (the
      synced length, the length) and, with "blocks", in `holes` each file in which a zeroed
      block lies before a kept one, i.e. the reordering showed (its synced length).
    - A directory keeps the names (creates, renames, unlinks) as of its last fsync_dir; a
      directory created since its parent's last fsync_dir vanishes with all it holds.

    The cut: mode "crash" at step `fail_at` raises Crash (the step does not happen) and every
    later call raises Crash too; then `power_cut()` closes what the dead process had open and
    rewrites the data dir to the modelled state. Start from a quiet data dir (its files are
    taken as durable). Not modelled: a disk that lies about flushes, a lost block that reads
    as stale bytes (an earlier use of the disk block) rather than zeros, reordering at a grain
    finer than 4 KiB, the lock files (no data).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        fail_at: int | None = None,
        *,
        tail: str = "none",
        seed: int = 0,
    ) -> None:
        super().__init__(fail_at, "crash")
        import random

        assert tail in (*TAILS, REORDERED)
        self.tail = tail
        self.unsynced: dict[str, tuple[int, int]] = {}  # set by the cut (see above)
        self.holes: dict[str, int] = {}
        self.rng = random.Random(seed)
        self.root = os.path.abspath(root)
        self._mlock = threading.RLock()
        self._names: dict[str, dict[str, _Inode]] = {}
        self._durable: dict[str, dict[str, _Inode]] = {}
        self._fd_inode: dict[int, _Inode] = {}
        self._new_dirs: set[str] = set()  # created, not yet durable in their parent
        if os.path.isdir(self.root):
            names = {}
            for name in os.listdir(self.root):
                if name not in UNTRACKED:
                    p = os.path.join(self.root, name)
                    with open(p, "rb") as f:
                        names[name] = _Inode(p, f.read())
            self._names[self.root] = names
            self._durable[self.root] = dict(names)

    def crash(self) -> None:
        self.crashed = True  # descriptors are closed by power_cut, after the threads stopped

    def _dir_names(self, path: str) -> tuple[dict[str, _Inode], str]:
        d, name = os.path.split(os.path.abspath(path))
        if d not in self._names:
            self._names[d] = {}
            self._durable[d] = {}
        return self._names[d], name

    # -- the steps ------------------------------------------------------------------------

    def mkdir(self, path: str) -> None:
        self._guard("mkdir", lambda: FileSystem.mkdir(self, path))
        with self._mlock:
            p = os.path.abspath(path)
            self._new_dirs.add(p)
            self._names.setdefault(p, {})
            self._durable.setdefault(p, {})

    def open_new(self, path: str) -> int:
        with self._mlock:
            names, name = self._dir_names(path)
            old = names.get(name)
            old_data = old.current() if old is not None else b""
            fd = super().open_new(path)  # FileSystem.open_new unlinks what has the name
            if old is not None:
                names.pop(name)
                old.final, old.path = old_data, None
            ino = _Inode(os.path.abspath(path))
            names[name] = ino
            self._fd_inode[fd] = ino
            return fd

    def open_append(self, path: str) -> int:
        with self._mlock:
            fd = super().open_append(path)
            names, name = self._dir_names(path)
            ino = names.get(name)
            if ino is None:
                ino = names[name] = _Inode(os.path.abspath(path))
            self._fd_inode[fd] = ino
            return fd

    def fsync(self, fd: int) -> None:
        with self._mlock:
            ino = self._fd_inode.get(fd)
            data = ino.current() if ino is not None else b""
        super().fsync(fd)  # outside the model lock: group commit overlaps writes with it
        if ino is not None:
            with self._mlock:
                if len(data) >= len(ino.durable) or not ino.durable.startswith(data):
                    ino.durable = data

    def close(self, fd: int) -> None:
        with self._mlock:
            self._fd_inode.pop(fd, None)
        super().close(fd)

    def replace(self, src: str, dst: str) -> None:
        with self._mlock:
            names, dname = self._dir_names(dst)
            snames, sname = self._dir_names(src)
            old = names.get(dname)
            old_data = old.current() if old is not None else b""
            super().replace(src, dst)
            if old is not None:
                names.pop(dname)
                old.final, old.path = old_data, None
            ino = snames.pop(sname, None) or _Inode(None)
            ino.path = os.path.abspath(dst)
            names[dname] = ino

    def unlink(self, path: str) -> None:
        with self._mlock:
            names, name = self._dir_names(path)
            ino = names.get(name)
            data = ino.current() if ino is not None else b""
            super().unlink(path)
            if ino is not None:
                names.pop(name)
                ino.final, ino.path = data, None

    def fsync_dir(self, path: str) -> None:
        super().fsync_dir(path)
        with self._mlock:
            p = os.path.abspath(path)
            if p in self._names:
                self._durable[p] = dict(self._names[p])
            for d in list(self._new_dirs):
                if os.path.dirname(d) == p:
                    self._new_dirs.discard(d)

    # -- the cut --------------------------------------------------------------------------

    def _image(self, path: str, ino: _Inode) -> bytes:
        durable, cur = ino.durable, ino.current()
        if len(cur) <= len(durable) or not cur.startswith(durable):
            return durable
        self.unsynced[path] = (len(durable), len(cur))
        if self.tail == "none":
            return durable
        if self.tail == "partial":
            return cur[: self.rng.randint(len(durable), len(cur))]
        if self.tail == REORDERED:
            # the size reached the disk; each block of the rest its new data or zeros
            image = bytearray(cur)
            zeroed = False
            for start in range(len(durable) - len(durable) % BLOCK, len(cur), BLOCK):
                lo, hi = max(start, len(durable)), min(start + BLOCK, len(cur))
                if self.rng.random() < 0.5:
                    image[lo:hi] = bytes(hi - lo)
                    zeroed = True
                elif zeroed:
                    self.holes[path] = len(durable)
            return bytes(image)
        # "zeros": the size reached the disk, the data only up to a block boundary
        blocks = [b for b in range(0, len(cur) + 1, 4096) if b >= len(durable)] + [len(durable)]
        keep = self.rng.choice(blocks)
        return cur[:keep] + b"\0" * (len(cur) - keep)

    def _vanished(self, d: str) -> bool:
        return any(d == n or d.startswith(n + os.sep) for n in self._new_dirs)

    def power_cut(self) -> None:
        """The machine loses power now: close what the process had open, then leave on disk
        only what the model says survives."""
        import shutil

        self.crashed = True
        FaultFS.crash(self)
        with self._mlock:
            images = {
                d: {
                    name: self._image(os.path.join(d, name), ino)
                    for name, ino in self._durable[d].items()
                }
                for d in self._names
                if not self._vanished(d)
            }
            for d in sorted(self._new_dirs, key=len):
                shutil.rmtree(d, ignore_errors=True)
            for d, files in images.items():
                if not os.path.isdir(d):
                    continue
                for name in os.listdir(d):
                    if name not in UNTRACKED and os.path.isfile(os.path.join(d, name)):
                        os.unlink(os.path.join(d, name))
                for name, data in files.items():
                    fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT, 0o600)
                    try:
                        os.write(fd, data)
                    finally:
                        os.close(fd)
