"""Helpers for the storage tests: message factory and a fault-injecting FileSystem."""

from __future__ import annotations

import contextlib
import errno
import os
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
        self.steps.append(op)
        if self.fail_at is not None and len(self.steps) == self.fail_at:
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


def snapshot_body(data: bytes) -> bytes:
    from convmem_engine.storage import snapshot as snap

    meta_len, _crc, _end = snap.TRAILER.unpack(data[-snap.TRAILER.size :])
    return data[len(snap.MAGIC) : -snap.TRAILER.size - meta_len]
