"""Derived files: state rebuilt from the store's messages, kept on disk so an open can load it
instead (the search index: `search.idx`). See docs/storage-format.md.

A derived file belongs to one snapshot: it describes the live messages at that snapshot's
log position (generation, log offset, prefix CRC-32, last sequence). The store hands it out
only when it loaded exactly that snapshot at open; the caller then applies the log tail's
changes on top (`Store.take_open_changes`). Anything else (another snapshot, a damaged or
truncated file, a foreign format) is never used: the owner rebuilds from the messages.

Layout:

    b"CMDRV1\\n\\0"                        8-byte magic
    payload: the owner's bytes (for search.idx: convmem_engine/index/search_file.py)
    meta: compact JSON object of integers (DerivedMeta)
    trailer: <u32 meta length> <u32 crc32(meta)> <u32 crc32(magic + payload + meta)> b"CMDE"

Written like the snapshot: a user-only temporary file created without following links,
fsynced, renamed over the old one, directory fsynced; all through the FileSystem seam.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from convmem_engine.storage.codec import loads
from convmem_engine.storage.fs import FileSystem

MAGIC: Final = b"CMDRV1\n\0"
END_MAGIC: Final = b"CMDE"
TRAILER: Final = struct.Struct("<III4s")
SUFFIX: Final = ".idx"
"""Every derived file's name ends with this (compaction removes them all: they name the old
generation)."""
TMP_SUFFIX: Final = ".tmp"
_MAX_META: Final = 1 << 12


class DerivedError(Exception):
    """The derived file cannot be used (missing pieces, wrong CRC, another snapshot's)."""


@dataclass(frozen=True, slots=True)
class SnapshotTag:
    """The log position a snapshot (and the derived files written with it) describes."""

    generation: int
    log_offset: int
    log_prefix_crc32: int
    last_sequence: int


@dataclass(frozen=True, slots=True)
class DerivedMeta:
    generation: int
    log_offset: int
    log_prefix_crc32: int
    last_sequence: int
    payload_format: int
    payload_length: int

    @property
    def tag(self) -> SnapshotTag:
        return SnapshotTag(
            self.generation, self.log_offset, self.log_prefix_crc32, self.last_sequence
        )

    def to_bytes(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":")).encode("ascii")

    @classmethod
    def from_bytes(cls, data: bytes) -> DerivedMeta:
        try:
            d = loads(data.decode("ascii"))
        except Exception as e:  # any decoding failure
            raise DerivedError("meta is not valid JSON") from e
        names = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(d, dict) or set(d) != set(names):
            raise DerivedError("meta fields are missing")
        if not all(type(d[n]) is int and d[n] >= 0 for n in names):
            raise DerivedError("meta fields are not non-negative integers")
        return cls(**d)


def write_derived(
    fs: FileSystem,
    data_dir: str,
    name: str,
    tag: SnapshotTag,
    payload_format: int,
    chunks: Iterable[bytes],
) -> int:
    """Atomically replace `data_dir/name` with `chunks` tagged for `tag`; returns the size.
    Raises OSError (the old file, if any, is then untouched; the temporary one removed) or
    whatever iterating `chunks` raises."""
    path = os.path.join(data_dir, name)
    tmp = path + TMP_SUFFIX
    fd = fs.open_new(tmp)
    try:
        fs.write_all(fd, MAGIC)
        crc = zlib.crc32(MAGIC)
        length = 0
        for chunk in chunks:
            if chunk:
                fs.write_all(fd, chunk)
                crc = zlib.crc32(chunk, crc)
                length += len(chunk)
        meta = DerivedMeta(
            tag.generation,
            tag.log_offset,
            tag.log_prefix_crc32,
            tag.last_sequence,
            payload_format,
            length,
        ).to_bytes()
        crc = zlib.crc32(meta, crc)
        fs.write_all(fd, meta + TRAILER.pack(len(meta), zlib.crc32(meta), crc, END_MAGIC))
        fs.fsync(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            fs.close(fd)
        with contextlib.suppress(OSError):
            fs.unlink(tmp)
        raise
    fs.close(fd)
    try:
        fs.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            fs.unlink(tmp)
        raise
    fs.fsync_dir(data_dir)
    return len(MAGIC) + length + len(meta) + TRAILER.size


def _read_exact(fs: FileSystem, fd: int, n: int) -> bytes:
    try:
        return fs.read_exact(fd, n)
    except EOFError:
        raise DerivedError("unexpected end of file") from None


class DerivedReader:
    """The payload of an open derived file, read front to back with `read(n)`; `finish()`
    proves every byte read was the file's (CRC-32) and the payload is used up."""

    def __init__(self, fs: FileSystem, fd: int) -> None:
        self._fs = fs
        self.fd = fd
        size = fs.size(fd)
        if size < len(MAGIC) + TRAILER.size:
            raise DerivedError("file too short")
        fs.seek(fd, size - TRAILER.size)
        meta_len, meta_crc, file_crc, end = TRAILER.unpack(_read_exact(fs, fd, TRAILER.size))
        if end != END_MAGIC or meta_len > _MAX_META or meta_len > size - len(MAGIC) - TRAILER.size:
            raise DerivedError("bad trailer")
        fs.seek(fd, size - TRAILER.size - meta_len)
        raw = _read_exact(fs, fd, meta_len)
        if zlib.crc32(raw) != meta_crc:
            raise DerivedError("meta CRC mismatch")
        self.meta = DerivedMeta.from_bytes(raw)
        if len(MAGIC) + self.meta.payload_length + meta_len + TRAILER.size != size:
            raise DerivedError("payload length does not match the file size")
        self._raw_meta = raw
        self._file_crc = file_crc
        fs.seek(fd, 0)
        if _read_exact(fs, fd, len(MAGIC)) != MAGIC:
            raise DerivedError("bad magic")
        self._crc = zlib.crc32(MAGIC)
        self._left = self.meta.payload_length

    def read(self, n: int) -> bytes:
        """Exactly the next `n` payload bytes (ValueError past the payload's end)."""
        if n < 0 or n > self._left:
            raise ValueError("read past the end of the payload")
        if n == 0:
            return b""
        data = _read_exact(self._fs, self.fd, n)
        self._left -= n
        self._crc = zlib.crc32(data, self._crc)
        return data

    def finish(self) -> None:
        """Raise DerivedError unless the whole payload was read and the file's CRC matches."""
        if self._left:
            raise DerivedError("payload not used up")
        if zlib.crc32(self._raw_meta, self._crc) != self._file_crc:
            raise DerivedError("CRC mismatch")


def read_meta(fs: FileSystem, path: str) -> DerivedMeta | None:
    """The meta of the derived file at `path`; None when it is missing or unreadable."""
    try:
        fd = fs.open_read(path)
    except OSError:
        return None
    try:
        return DerivedReader(fs, fd).meta
    except (DerivedError, OSError):
        return None
    finally:
        with contextlib.suppress(OSError):
            fs.close(fd)
