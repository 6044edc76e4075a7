"""Opaque paging cursors: urlsafe base64 of a small JSON object.

A cursor holds the view it belongs to, a hash binding it to the session (history view), and
the position: the last id returned (a message ULID for history, the session's ordering key for
sessions). It is never an offset, so pages stay exact while other clients write and delete:
ids after the position are read afresh on each call (no duplicates, no skips).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from typing import Final

from convmem_engine.domain.errors import ValidationError
from convmem_engine.domain.validation import ULID_RE, utf8_len

CURSOR_MAX_CHARS: Final = 256
_VERSION: Final = 1
_B64: Final = re.compile(r"[A-Za-z0-9_-]+")


def _scope_hash(scope: str) -> str:
    return hashlib.blake2b(scope.encode("utf-8"), digest_size=8).hexdigest()


def encode(view: str, scope: str, position: str) -> str:
    payload = {"v": _VERSION, "view": view, "scope": _scope_hash(scope), "after": position}
    raw = json.dumps(payload, separators=(",", ":")).encode("ascii")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _not_a_cursor(field: str) -> ValidationError:
    return ValidationError(f"{field}: must be a nextCursor returned by read_messages")


def check_argument(cursor: object, field: str = "cursor") -> str:
    """A cursor argument's form: a string of 1 to CURSOR_MAX_CHARS characters of valid text
    (what the tool's schema says). What it holds is checked where it is read (`decode`)."""
    if not isinstance(cursor, str):
        raise ValidationError(f"{field}: must be a string")
    if not cursor or len(cursor) > CURSOR_MAX_CHARS:
        raise _not_a_cursor(field)
    utf8_len(cursor, field)  # valid text (no lone surrogate), like every string argument
    return cursor


def decode(cursor: object, view: str, scope: str, field: str = "cursor") -> str:
    """The position stored in `cursor`; VALIDATION_ERROR unless it came from `view`/`scope`."""
    bad = _not_a_cursor(field)
    cursor = check_argument(cursor, field)
    if _B64.fullmatch(cursor) is None:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw.decode("ascii"))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise bad from None
    if not isinstance(data, dict) or data.get("v") != _VERSION:
        raise bad
    position = data.get("after")
    if not isinstance(position, str) or ULID_RE.fullmatch(position) is None:
        raise bad
    if data.get("view") != view:
        raise ValidationError(f"{field}: belongs to another view than {view}")
    if data.get("scope") != _scope_hash(scope):
        raise ValidationError(f"{field}: belongs to another session_id")
    return position
