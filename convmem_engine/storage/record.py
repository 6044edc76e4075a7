"""The log record codec (format version 2). The byte table lives in docs/storage-format.md.

    offset size field
    0      4    magic          b"CMLR"
    4      1    version        2
    5      1    type           PUT=1, DEL=2, GENERATION=3, UPDATE=4
    6      2    flags          0 (reserved; any other value is corruption)
    8      4    payload length bytes following the header
    12     8    sequence       +1 for every record of a log, across generations
    20     4    payload CRC32  zlib.crc32(payload)
    24     4    header CRC32   zlib.crc32(bytes 0..23)
    28     n    payload

All integers little-endian. PUT/UPDATE payload: compact UTF-8 JSON of `Message.to_json()`;
DEL payload: the message id (ASCII); GENERATION payload: compact JSON {"generation": int}.
The header CRC makes a flipped length or sequence byte detectable as corruption instead of
being mistaken for a torn final record.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from typing import Any, Final

from convmem_engine.domain.message import DEFAULT_METADATA, Message, Metadata

MAGIC: Final = b"CMLR"
FORMAT_VERSION: Final = 2

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

_DEFAULT_METADATA_JSON: Final = DEFAULT_METADATA.to_json()


def encode_record(rtype: int, sequence: int, payload: bytes) -> bytes:
    crc = zlib.crc32(payload)
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, rtype, 0, len(payload), sequence, crc)
    return prefix + struct.pack("<I", zlib.crc32(prefix)) + payload


def header_problem(version: int, rtype: int, flags: int, length: int) -> str:
    """Why a header with a valid CRC cannot be ours, or "" when it is acceptable."""
    if version != FORMAT_VERSION:
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


def encode_message(msg: Message) -> bytes:
    return json.dumps(msg.to_json(), ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def metadata_from_json(data: dict[str, Any]) -> Metadata:
    """Metadata from JSON, sharing the one DEFAULT_METADATA instance when it is the default."""
    if not data or data == _DEFAULT_METADATA_JSON:
        return DEFAULT_METADATA
    return Metadata.from_json(data)


def decode_message(payload: bytes) -> Message:
    """Raises ValueError/KeyError/TypeError on a payload that is not a Message."""
    d = json.loads(payload)
    if not isinstance(d, dict):
        raise ValueError("payload is not a JSON object")
    ts = int(d["timestamp"])
    updated = int(d["updated_at"])
    return Message(
        message_id=_str(d["message_id"]),
        session_id=sys.intern(_str(d["session_id"])),
        timestamp=ts,
        role=sys.intern(_str(d["role"])),
        content=_str(d["content"]),
        revision=int(d["revision"]),
        updated_at=ts if updated == ts else updated,
        metadata=metadata_from_json(d.get("metadata") or {}),
    )


def _str(v: object) -> str:
    if not isinstance(v, str):
        raise TypeError("expected a string")
    return v


def encode_generation(generation: int) -> bytes:
    return json.dumps({"generation": generation}, separators=(",", ":")).encode("ascii")


def decode_generation(payload: bytes) -> int:
    d = json.loads(payload)
    if not isinstance(d, dict) or not isinstance(d.get("generation"), int):
        raise ValueError("GENERATION payload has no integer generation")
    gen: int = d["generation"]
    return gen


def record_size(payload_len: int) -> int:
    return HEADER_SIZE + payload_len
