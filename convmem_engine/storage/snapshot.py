"""snapshot.bin: the live state at a log offset, so open does not replay the whole log.

Layout (see docs/storage-format.md):

    b"CMSNAP3\\n"                      8-byte magic (format 3; b"CMSNAP2\\n": format 2)
    body: lines of JSON arrays of rows, each line <= ROWS_PER_LINE rows, ending in b"\\n"
          row = the storage codec's message row (codec.message_row), the same as a log
          record's payload: [message_id, session_id, timestamp, role, content, revision,
          updated_at, metadata], metadata = 0 for the default else its positional array
    meta: compact JSON object (generation, log_offset, log_prefix_crc32, last_sequence, counters,
          count, body_length, body_crc32)
    trailer: <u32 meta length> <u32 crc32(meta)> b"CMSE"   (12 bytes, little-endian)

Decoding is a few json.loads calls on large lines (C speed) plus one Message per row built
without the frozen-dataclass __init__ overhead; the cyclic GC is paused while loading.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from convmem_engine.domain.message import Message
from convmem_engine.storage.codec import loads, message_row
from convmem_engine.storage.fs import FileSystem
from convmem_engine.storage.packed import MessageTable
from convmem_engine.storage.record import FORMAT_VERSION, UPGRADABLE_VERSIONS

MAGIC: Final = b"CMSNAP3\n"
# Older formats' magics: their meta is read (it proves how far their log was durable), their
# body never is.
OLD_MAGICS: Final = {b"CMSNAP2\n": 2}
assert set(OLD_MAGICS.values()) == set(UPGRADABLE_VERSIONS)
END_MAGIC: Final = b"CMSE"
TRAILER: Final = struct.Struct("<II4s")
ROWS_PER_LINE: Final = 4096
_CHUNK: Final = 1 << 20
_MAX_META: Final = 1 << 16


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building many long-lived objects (it would rescan them all,
    repeatedly, for nothing: they are all reachable)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class SnapshotError(Exception):
    """The snapshot cannot be used (unreadable, truncated, wrong CRC or shape)."""


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    generation: int
    log_offset: int
    log_prefix_crc32: int
    last_sequence: int
    record_count: int
    deleted_records: int
    update_records: int
    live_bytes: int
    count: int
    body_length: int
    body_crc32: int
    format_version: int = FORMAT_VERSION

    def to_bytes(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":")).encode("ascii")

    @classmethod
    def from_bytes(cls, data: bytes, version: int = FORMAT_VERSION) -> SnapshotMeta:
        d = loads(data.decode("ascii"))
        if not isinstance(d, dict):
            raise SnapshotError("meta is not an object")
        names = [f.name for f in dataclasses.fields(cls)]
        if set(d) != set(names) or not all(type(d[n]) is int for n in names):
            raise SnapshotError("meta fields are missing or not integers")
        meta = cls(**d)
        if meta.format_version != version:
            raise SnapshotError("snapshot format version does not match its magic")
        return meta


def encode_body_lines(messages: Iterable[Message]) -> Iterable[bytes]:
    """The body as lines of JSON arrays (each ends with b"\\n")."""
    batch: list[list[Any]] = []
    for m in messages:
        batch.append(message_row(m))
        if len(batch) >= ROWS_PER_LINE:
            yield _line(batch)
            batch = []
    if batch:
        yield _line(batch)


def _line(batch: list[list[Any]]) -> bytes:
    return json.dumps(batch, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def write_snapshot_file(fs: FileSystem, fd: int, messages: Iterable[Message], **meta: int) -> int:
    """Write a complete snapshot to `fd` (not fsynced). Returns its size. Raises OSError."""
    size = _write_all(fs, fd, MAGIC)
    crc = 0
    body_length = 0
    pending: list[bytes] = []
    pending_len = 0
    for line in encode_body_lines(messages):
        crc = zlib.crc32(line, crc)
        body_length += len(line)
        pending.append(line)
        pending_len += len(line)
        if pending_len >= _CHUNK:
            size += _write_all(fs, fd, b"".join(pending))
            pending, pending_len = [], 0
    if pending:
        size += _write_all(fs, fd, b"".join(pending))
    m = SnapshotMeta(body_length=body_length, body_crc32=crc, **meta).to_bytes()
    size += _write_all(fs, fd, m + TRAILER.pack(len(m), zlib.crc32(m), END_MAGIC))
    return size


def _write_all(fs: FileSystem, fd: int, data: bytes) -> int:
    fs.write_all(fd, data)
    return len(data)


def read_meta(fs: FileSystem, fd: int) -> tuple[SnapshotMeta, int]:
    """The snapshot's meta and the file size. Raises SnapshotError or OSError."""
    size = fs.size(fd)
    if size < len(MAGIC) + TRAILER.size:
        raise SnapshotError("file too short")
    fs.seek(fd, 0)
    magic = _read_exact(fs, fd, len(MAGIC))
    version = FORMAT_VERSION if magic == MAGIC else OLD_MAGICS.get(magic)
    if version is None:
        raise SnapshotError("bad magic")
    fs.seek(fd, size - TRAILER.size)
    meta_len, meta_crc, end = TRAILER.unpack(_read_exact(fs, fd, TRAILER.size))
    if end != END_MAGIC or meta_len > _MAX_META or meta_len > size - len(MAGIC) - TRAILER.size:
        raise SnapshotError("bad trailer")
    fs.seek(fd, size - TRAILER.size - meta_len)
    raw = _read_exact(fs, fd, meta_len)
    if zlib.crc32(raw) != meta_crc:
        raise SnapshotError("meta CRC mismatch")
    try:
        meta = SnapshotMeta.from_bytes(raw, version)
    except SnapshotError:
        raise
    except Exception as e:  # any decoding failure: ValueError, RecursionError, ...
        raise SnapshotError("meta is not valid JSON") from e
    if len(MAGIC) + meta.body_length + meta_len + TRAILER.size != size:
        raise SnapshotError("body length does not match the file size")
    return meta, size


def _read_exact(fs: FileSystem, fd: int, n: int) -> bytes:
    try:
        return fs.read_exact(fd, n)
    except EOFError:
        raise SnapshotError("unexpected end of file") from None


def read_body(fs: FileSystem, fd: int, meta: SnapshotMeta) -> MessageTable:
    """Decode the body into a MessageTable, in snapshot order. Raises SnapshotError
    (or OSError); never decodes bytes that fail the body CRC, nor an older format's body."""
    if meta.format_version != FORMAT_VERSION:
        raise SnapshotError(f"a format {meta.format_version} snapshot is never loaded")
    _check_body_crc(fs, fd, meta)
    out = MessageTable()
    try:
        with gc_paused():
            _read_rows(fs, fd, meta, out)
    except SnapshotError:
        raise
    except OSError:
        raise
    except Exception as e:  # any decoding failure: OverflowError, RecursionError, ...
        raise SnapshotError(f"body is not valid snapshot rows ({type(e).__name__})") from e
    return out


def _check_body_crc(fs: FileSystem, fd: int, meta: SnapshotMeta) -> None:
    """A first pass over the body: its CRC must match before anything is decoded (damaged
    bytes could otherwise reach the JSON decoder: Infinity, deep nesting, huge numbers)."""
    fs.seek(fd, len(MAGIC))
    remaining = meta.body_length
    crc = 0
    while remaining > 0:
        chunk = fs.read(fd, min(_CHUNK * 4, remaining))
        if not chunk:
            raise SnapshotError("unexpected end of body")
        remaining -= len(chunk)
        crc = zlib.crc32(chunk, crc)
    if crc != meta.body_crc32:
        raise SnapshotError("body CRC mismatch")


def _read_rows(fs: FileSystem, fd: int, meta: SnapshotMeta, out: MessageTable) -> None:
    fs.seek(fd, len(MAGIC))
    remaining = meta.body_length
    crc = 0
    tail = b""
    load_rows = out.load_rows
    while remaining > 0:
        chunk = fs.read(fd, min(_CHUNK * 4, remaining))
        if not chunk:
            raise SnapshotError("unexpected end of body")
        remaining -= len(chunk)
        crc = zlib.crc32(chunk, crc)
        data = tail + chunk if tail else chunk
        last_nl = data.rfind(b"\n")
        if last_nl < 0:
            tail = data
            continue
        tail = data[last_nl + 1 :]
        for line in data[:last_nl].split(b"\n"):
            load_rows(loads(line.decode("utf-8")))
    if tail or crc != meta.body_crc32:
        raise SnapshotError("body CRC mismatch")
    if len(out) != meta.count:
        raise SnapshotError("row count mismatch")
    out.recount()
