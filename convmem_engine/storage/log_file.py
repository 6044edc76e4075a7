"""Reading the append-only log: a streaming scanner that tells a torn tail from corruption.

Classification, from a record's start offset `pos` to the end of the file:

- fewer than HEADER_SIZE bytes left, or a valid header whose payload runs past the end, or
  a damaged record (wrong magic, header CRC or payload CRC) from which the file is zeros to
  its end, the zeros starting inside that record (a file whose size reached the disk but
  whose last data blocks did not, as XFS or ext4 `data=writeback` leave after a power loss;
  our payloads never end in NUL): an *incomplete tail*. Nothing after it was ever
  acknowledged, because a record is acknowledged only after everything before it is fsynced.
- any other damaged header or payload (non-zero garbage, a bad record followed by anything
  but zeros, the last record's too), a known-bad version/type/flags/length, or a sequence
  that is not exactly previous + 1: *corruption* (`CorruptStoreError` naming the file and
  offset). The scanner never modifies the file.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from convmem_engine.domain.errors import CorruptStoreError
from convmem_engine.storage.fs import FileSystem
from convmem_engine.storage.record import (
    FORMAT_VERSION,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    header_problem,
)

_CHUNK = 1 << 20


@dataclass(slots=True)
class ScanResult:
    end: int = 0  # offset just after the last complete record
    crc: int = 0  # zlib.crc32 of the log bytes [0, end)
    records: int = 0  # complete records read
    incomplete_tail: bool = False
    file_size: int = 0


class LogScanner:
    """Iterate the complete records of a log from `start`; corruption raises CorruptStoreError."""

    def __init__(
        self,
        fs: FileSystem,
        fd: int,
        name: str,
        start: int,
        prev_seq: int | None,
        crc: int = 0,
        version: int = FORMAT_VERSION,
    ) -> None:
        self._fs = fs
        self._version = version
        self._fd = fd
        self._name = name
        self._start = start
        self._prev_seq = prev_seq
        self.result = ScanResult(end=start, crc=crc, file_size=fs.size(fd))

    def _corrupt(self, offset: int, why: str) -> CorruptStoreError:
        return CorruptStoreError(f"{self._name}: corrupt record at offset {offset}: {why}")

    def _zeros_from(self) -> int:
        """The offset where the file's final run of zero bytes starts (file size if none)."""
        fs, fd = self._fs, self._fd
        end = self.result.file_size
        while end > 0:
            start = max(0, end - _CHUNK)
            fs.seek(fd, start)
            chunk = fs.read(fd, end - start)
            if len(chunk) != end - start:  # the file changed under us: no zero run assumed
                return self.result.file_size
            stripped = chunk.rstrip(b"\0")
            if stripped:
                return start + len(stripped)
            end = start
        return 0

    def _zero_filled(self, offset: int, record_end: int) -> bool:
        """Is the damage of the record at [offset, record_end) explained by zero fill: the
        file is zeros from a point inside the record (or its start) to its end?"""
        return self._zeros_from() < record_end

    def records(self) -> Iterator[tuple[int, int, int, bytes]]:
        """Yield (offset, type, sequence, payload) for each complete, verified record."""
        fs, fd = self._fs, self._fd
        size = self.result.file_size
        fs.seek(fd, self._start)
        buf = b""
        buf_start = self._start  # file offset of buf[0]
        pos = 0  # index into buf
        prev = self._prev_seq
        unpack = HEADER.unpack_from
        crc32 = zlib.crc32
        while True:
            offset = buf_start + pos
            if offset >= size:
                break
            need = HEADER_SIZE
            if len(buf) - pos < need:
                buf, buf_start, pos = self._refill(buf, buf_start, pos, need)
                if len(buf) - pos < need:
                    # fewer than a header's bytes left: a torn header (or zero fill)
                    self.result.incomplete_tail = True
                    break
            magic, version, rtype, flags, length, seq, pcrc, hcrc = unpack(buf, pos)
            if magic != MAGIC or crc32(buf[pos : pos + 24]) != hcrc:
                if self._zero_filled(offset, offset + HEADER_SIZE):
                    self.result.incomplete_tail = True
                    break
                why = "bad magic" if magic != MAGIC else "header CRC mismatch"
                raise self._corrupt(offset, why)
            problem = header_problem(version, rtype, flags, length, self._version)
            if problem:
                raise self._corrupt(offset, problem)
            if offset + HEADER_SIZE + length > size:
                self.result.incomplete_tail = True
                break
            if prev is not None and seq != prev + 1:
                raise self._corrupt(offset, "non-monotonic sequence")
            need = HEADER_SIZE + length
            if len(buf) - pos < need:
                buf, buf_start, pos = self._refill(buf, buf_start, pos, need)
                if len(buf) - pos < need:  # the file shrank under us
                    self.result.incomplete_tail = True
                    break
            payload = buf[pos + HEADER_SIZE : pos + need]
            if crc32(payload) != pcrc:
                if payload[-1] == 0 and self._zero_filled(offset, offset + need):
                    # Zero-filled from inside this record to the end of the file: data blocks
                    # never written before a power loss (a payload we write never ends in NUL).
                    self.result.incomplete_tail = True
                    break
                raise self._corrupt(offset, "payload CRC mismatch")
            prev = seq
            res = self.result
            res.crc = crc32(buf[pos : pos + need], res.crc)
            res.records += 1
            pos += need
            res.end = buf_start + pos
            yield offset, rtype, seq, payload

    def _refill(self, buf: bytes, buf_start: int, pos: int, need: int) -> tuple[bytes, int, int]:
        rest = buf[pos:]
        new_start = buf_start + pos
        parts = [rest]
        have = len(rest)
        want = max(need, _CHUNK)
        self._fs.seek(self._fd, new_start + have)
        while have < want:
            chunk = self._fs.read(self._fd, want - have)
            if not chunk:
                break
            parts.append(chunk)
            have += len(chunk)
        return b"".join(parts), new_start, 0
