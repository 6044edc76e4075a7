"""The log record framing (format version 3). The byte table lives in docs/storage-format.md.

    offset size field
    0      4    magic          b"CMLR"
    4      1    version        3 (2: the previous format, read only to upgrade it)
    5      1    type           PUT=1, DEL=2, GENERATION=3, UPDATE=4
    6      2    flags          0 (reserved; any other value is corruption)
    8      4    payload length bytes following the header
    12     8    sequence       +1 for every record of a log, across generations
    20     4    payload CRC32  zlib.crc32(payload)
    24     4    header CRC32   zlib.crc32(bytes 0..23)
    28     n    payload

All integers little-endian. PUT/UPDATE payload: the storage codec's message row
(`codec.encode_message`, format 3; format 2 stored `Message.to_json()`); DEL payload: the
message id (UTF-8); GENERATION payload: compact JSON {"generation": int}.
The header CRC makes a flipped length or sequence byte detectable as corruption instead of
being mistaken for a torn final record.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Final

MAGIC: Final = b"CMLR"
FORMAT_VERSION: Final = 3
# Stores of these older versions are opened and upgraded (rewritten in FORMAT_VERSION).
UPGRADABLE_VERSIONS: Final = (2,)

PUT: Final = 1
DEL: Final = 2
GENERATION: Final = 3
UPDATE: Final = 4
RECORD_TYPES: Final = {PUT: "PUT", DEL: "DEL", GENERATION: "GENERATION", UPDATE: "UPDATE"}

HEADER: Final = struct.Struct("<4sBBHIQII")
HEADER_SIZE: Final = HEADER.size  # 28
_PREFIX: Final = struct.Struct("<4sBBHIQI")  # the 24 bytes the header CRC covers

# Content and metadata are limited to 1 MiB each by the domain; JSON escaping can grow text
# up to six times. Anything larger than this cannot have been written by us.
MAX_PAYLOAD: Final = 16 * 1024 * 1024


def encode_record(
    rtype: int, sequence: int, payload: bytes, version: int = FORMAT_VERSION
) -> bytes:
    crc = zlib.crc32(payload)
    prefix = _PREFIX.pack(MAGIC, version, rtype, 0, len(payload), sequence, crc)
    return prefix + struct.pack("<I", zlib.crc32(prefix)) + payload


def header_problem(
    version: int, rtype: int, flags: int, length: int, expected: int = FORMAT_VERSION
) -> str:
    """Why a header with a valid CRC cannot be ours, or "" when it is acceptable. Every record
    of a log has the version of the log's first record (`expected`)."""
    if version != expected:
        if version in (FORMAT_VERSION, *UPGRADABLE_VERSIONS):
            return f"format version {version} record in a format {expected} log"
        return f"unknown format version {version}"
    if rtype not in RECORD_TYPES:
        return f"unknown record type {rtype}"
    if flags != 0:
        return "reserved flags must be 0"
    if length > MAX_PAYLOAD:
        return f"impossible payload length (limit {MAX_PAYLOAD})"
    if length == 0:
        return "impossible payload length 0"
    return ""


# -- payloads ---------------------------------------------------------------------------------
# PUT/UPDATE payloads are the storage codec's message rows (convmem_engine/storage/codec.py);
# format 2 payloads are read only to upgrade a store (convmem_engine/storage/legacy.py).


def encode_generation(generation: int) -> bytes:
    return json.dumps({"generation": generation}, separators=(",", ":")).encode("ascii")


def decode_generation(payload: bytes) -> int:
    d = json.loads(payload)
    if not isinstance(d, dict) or not isinstance(d.get("generation"), int):
        raise ValueError("GENERATION payload has no integer generation")
    gen: int = d["generation"]
    return gen
