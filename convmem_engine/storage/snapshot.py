"""snapshot.bin: the live state at a log offset, so open does not replay the whole log.

Layout (see docs/storage-format.md):

    b"CMSNAP6\n"                      8-byte magic: store format 3, binary rows with column
                                      blocks of two columns (written)
                                      b"CMSNAP5\n": format 3, binary rows with column
                                      blocks of one column (read only)
                                      b"CMSNAP4\n": format 3, binary rows (read only)
                                      b"CMSNAP3\n": format 3, JSON rows (read only)
                                      b"CMSNAP2\n": format 2 (only its meta is ever read)
    body (CMSNAP5, CMSNAP4): binary rows <B kind> <u32 a> <u32 b> + a + b bytes: first one
          row per session id, then the messages in creation order: a packed value as it
          is (storage/packed.py), or a message that does not fit the packed layout as its
          codec row in JSON; in CMSNAP6 each run of plain values (no flags) as column blocks
          of up to 4096 messages, their headers a column of 18-byte fields and their contents
          another (packed.HEAD_BLOCK); in CMSNAP5 as column blocks of the values whole
          (packed.COLUMN_BLOCK)
    body (CMSNAP3): lines of JSON arrays of up to 4096 codec rows (codec.message_row)
    meta: compact JSON object (format_version, generation, log_offset, log_prefix_crc32,
          last_sequence, counters, count, body_length, body_crc32)
    trailer: <u32 meta length> <u32 crc32(meta)> b"CMSE"   (12 bytes, little-endian)

Loading a binary body builds no Message and decodes no JSON: each packed value is kept as
the bytes read (after its checks); a column block is loaded a block at a time, at C speed,
and a CMSNAP6 block's values are only built when one of them is first read or changed
(packed._Block).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import queue
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from convmem_engine.storage import packed
from convmem_engine.storage.codec import loads
from convmem_engine.storage.fs import FileSystem
from convmem_engine.storage.packed import MessageTable
from convmem_engine.storage.record import FORMAT_VERSION, UPGRADABLE_VERSIONS

MAGIC: Final = b"CMSNAP6\n"
HEADS: Final = 6  # the body layouts, named by their magic's digit
COLUMNS: Final = 5
BINARY: Final = 4
JSON_LINES: Final = 3
LAYOUT: Final = HEADS  # the layout written (the others only to test that they load)
MAGIC_OF: Final = {HEADS: MAGIC, COLUMNS: b"CMSNAP5\n", BINARY: b"CMSNAP4\n"}
# magic -> (store format version of the state, body layout). An older format's snapshot is
# never loaded: its meta is read (it proves how far its log was durable), its body never is.
MAGICS: Final = {
    MAGIC: (FORMAT_VERSION, HEADS),
    b"CMSNAP5\n": (FORMAT_VERSION, COLUMNS),
    b"CMSNAP4\n": (FORMAT_VERSION, BINARY),
    b"CMSNAP3\n": (FORMAT_VERSION, JSON_LINES),
    b"CMSNAP2\n": (2, 0),
}
assert {v for v, _ in MAGICS.values()} == {FORMAT_VERSION, *UPGRADABLE_VERSIONS}
END_MAGIC: Final = b"CMSE"
TRAILER: Final = struct.Struct("<II4s")
_CHUNK: Final = 1 << 20
_MAX_META: Final = 1 << 16


FREEZE_FROM: Final = 20_000
"""Loads of at least this many messages move what they made out of the collector's scans."""


@contextlib.contextmanager
def gc_paused(freeze: bool = False) -> Iterator[None]:
    """Pause the cyclic GC while building many long-lived objects (it would rescan them all,
    repeatedly, for nothing: they are all reachable). With `freeze`, what is alive when it
    ends goes to the collector's permanent generation (`gc.freeze`, a list splice): else the
    first collection after it walks every container made meanwhile (a million messages'
    parts and blocks: 30-40 ms CPU, on whichever thread allocates next)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
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
    layout: int = LAYOUT  # from the magic, not in the meta's JSON

    def to_bytes(self) -> bytes:
        d = dataclasses.asdict(self)
        del d["layout"]
        return json.dumps(d, separators=(",", ":")).encode("ascii")

    @classmethod
    def from_bytes(
        cls, data: bytes, version: int = FORMAT_VERSION, layout: int = LAYOUT
    ) -> SnapshotMeta:
        d = loads(data.decode("ascii"))
        if not isinstance(d, dict):
            raise SnapshotError("meta is not an object")
        names = [f.name for f in dataclasses.fields(cls) if f.name != "layout"]
        if set(d) != set(names) or not all(type(d[n]) is int for n in names):
            raise SnapshotError("meta fields are missing or not integers")
        meta = cls(**d, layout=layout)
        if meta.format_version != version:
            raise SnapshotError("snapshot format version does not match its magic")
        return meta


def write_snapshot_file(
    fs: FileSystem, fd: int, messages: MessageTable, layout: int = LAYOUT, **meta: int
) -> int:
    """Write a complete snapshot of `messages` to `fd` (not fsynced) in `layout` (LAYOUT;
    the others only to test that older snapshots load). Returns its size. Raises OSError."""
    size = _write_all(fs, fd, MAGIC_OF[layout])
    crc = 0
    body_length = 0
    pieces = messages.binary_rows(_CHUNK, columns=layout >= COLUMNS, heads=layout == HEADS)
    for piece in pieces:
        crc = zlib.crc32(piece, crc)
        body_length += len(piece)
        size += _write_all(fs, fd, piece)
    m = SnapshotMeta(body_length=body_length, body_crc32=crc, layout=layout, **meta).to_bytes()
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
    if magic not in MAGICS:
        raise SnapshotError("bad magic")
    version, layout = MAGICS[magic]
    fs.seek(fd, size - TRAILER.size)
    meta_len, meta_crc, end = TRAILER.unpack(_read_exact(fs, fd, TRAILER.size))
    if end != END_MAGIC or meta_len > _MAX_META or meta_len > size - len(MAGIC) - TRAILER.size:
        raise SnapshotError("bad trailer")
    fs.seek(fd, size - TRAILER.size - meta_len)
    raw = _read_exact(fs, fd, meta_len)
    if zlib.crc32(raw) != meta_crc:
        raise SnapshotError("meta CRC mismatch")
    try:
        meta = SnapshotMeta.from_bytes(raw, version, layout)
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
    out = MessageTable()
    try:
        with gc_paused(freeze=meta.count >= FREEZE_FROM):
            if meta.layout == JSON_LINES:
                _check_body_crc(fs, fd, meta)
                _read_rows(fs, fd, meta, out)
            else:  # the binary rows count what they add
                _read_binary_rows(fs, fd, meta, out)
        out.check_unique()
        if len(out) != meta.count:
            raise SnapshotError("row count mismatch")
        if meta.layout == JSON_LINES:
            out.recount()
    except SnapshotError:
        raise
    except OSError:
        raise
    except Exception as e:  # any decoding failure: OverflowError, RecursionError, ...
        raise SnapshotError(f"body is not valid snapshot rows ({type(e).__name__})") from e
    return out


def _pieces(fs: FileSystem, fd: int, remaining: int) -> Iterator[bytes]:
    """The next `remaining` bytes of `fd` in 4 MiB pieces; SnapshotError when they end early."""
    while remaining > 0:
        chunk = fs.read(fd, min(_CHUNK * 4, remaining))
        if not chunk:
            raise SnapshotError("unexpected end of body")
        remaining -= len(chunk)
        yield chunk


def _body_chunks(fs: FileSystem, fd: int, meta: SnapshotMeta) -> Iterator[bytes]:
    """The body in 4 MiB pieces; SnapshotError when it ends early or, once read, when its
    CRC does not match."""
    fs.seek(fd, len(MAGIC))
    crc = 0
    for chunk in _pieces(fs, fd, meta.body_length):
        crc = zlib.crc32(chunk, crc)
        yield chunk
    if crc != meta.body_crc32:
        raise SnapshotError("body CRC mismatch")


def _check_body_crc(fs: FileSystem, fd: int, meta: SnapshotMeta) -> None:
    """A first pass over the body: its CRC must match before anything is decoded (damaged
    bytes could otherwise reach the JSON decoder: Infinity, deep nesting, huge numbers)."""
    for _ in _body_chunks(fs, fd, meta):
        pass


def _read_rows(fs: FileSystem, fd: int, meta: SnapshotMeta, out: MessageTable) -> None:
    tail = b""
    load_rows = out.load_rows
    for chunk in _body_chunks(fs, fd, meta):
        data = tail + chunk if tail else chunk
        last_nl = data.rfind(b"\n")
        if last_nl < 0:
            tail = data
            continue
        tail = data[last_nl + 1 :]
        for line in data[:last_nl].split(b"\n"):
            load_rows(loads(line.decode("utf-8")))
    if tail:
        raise SnapshotError("body CRC mismatch")


def _read_binary_rows(fs: FileSystem, fd: int, meta: SnapshotMeta, out: MessageTable) -> None:
    """The CMSNAP6, CMSNAP5 or CMSNAP4 body: read and its CRC computed by a thread (the reads
    and zlib let go of the GIL: on another core), in 4 MiB pieces that the rows are checked
    and loaded from as they come; nothing is kept unless the CRC matches, and no JSON (a
    metadata row, a message kept whole) is decoded before it is known to. A row cut by a
    piece's end is completed from the next (a row longer than a piece makes the buffer grow
    to hold it)."""
    reader = _BodyReader(fs, fd, meta)

    def verified() -> None:
        if reader.crc() != meta.body_crc32:
            raise SnapshotError("body CRC mismatch")

    rest = b""  # the start of a row cut by a piece's end
    columns = meta.layout >= COLUMNS
    heads = meta.layout == HEADS
    load = out.load_binary
    try:
        for chunk in reader.chunks():
            pos = 0
            if rest:  # completed from this piece: only that row is copied
                if len(rest) < packed.ROW_SIZE:
                    pos = min(packed.ROW_SIZE - len(rest), len(chunk))
                    rest += chunk[:pos]
                    if len(rest) < packed.ROW_SIZE:
                        continue
                _kind, a, b = packed.ROW.unpack_from(rest)
                need = packed.ROW_SIZE + a + b - len(rest)
                if need > len(chunk) - pos:
                    rest += chunk[pos:]
                    continue
                row = rest + chunk[pos : pos + need]
                if load(row, 0, columns, heads, verified) != len(row):
                    raise SnapshotError("a row cut short")
                pos += need
            used = load(chunk, pos, columns, heads, verified)
            rest = chunk[used:]
    except Exception:
        verified()  # a damaged body says so, whatever its rows made of it
        raise
    verified()
    if rest:
        raise SnapshotError("a row cut short")


class _BodyReader:
    """The body's pieces, read (and their CRC computed) ahead by a thread of its own."""

    def __init__(self, fs: FileSystem, fd: int, meta: SnapshotMeta) -> None:
        self._pieces: queue.SimpleQueue[bytes | BaseException | None] = queue.SimpleQueue()
        fs.seek(fd, len(MAGIC))
        self._crc = CrcThread(lambda: self._read(fs, fd, meta.body_length))

    def _read(self, fs: FileSystem, fd: int, remaining: int) -> int:
        crc = 0
        try:
            for chunk in _pieces(fs, fd, remaining):
                crc = zlib.crc32(chunk, crc)
                self._pieces.put(chunk)
        except BaseException as e:
            self._pieces.put(e)
            raise
        self._pieces.put(None)
        return crc

    def chunks(self) -> Iterator[bytes]:
        while True:
            piece = self._pieces.get()
            if piece is None:
                return
            if isinstance(piece, BaseException):
                raise piece
            yield piece

    def crc(self) -> int:
        """The body's CRC, once it is all read (raises what the reading raised)."""
        return self._crc.result()


class CrcThread:
    """`compute()` (a CRC of bytes already read, or a file's: zlib and the reads let go of the
    GIL) on a thread of its own; `result()` waits for it (and raises what it raised)."""

    def __init__(self, compute: Callable[[], int]) -> None:
        self._compute = compute
        self._value = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="convmem-crc", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._compute()
        except BaseException as e:  # handed to result()
            self._error = e

    def result(self) -> int:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
