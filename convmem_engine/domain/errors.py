"""The one exception tree of the engine; each error carries the tool reference's error code.

Messages name the field and the constraint that failed and never repeat the input value.
"""

from __future__ import annotations

from typing import ClassVar


class ConvMemError(Exception):
    """Root of every error the engine reports to a caller."""

    code: ClassVar[str] = "INTERNAL_ERROR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_json(self) -> dict[str, object]:
        return {"status": "ERROR", "error": {"code": self.code, "message": self.message}}


class ValidationError(ConvMemError):
    """A parameter, JSON string or value range is invalid."""

    code = "VALIDATION_ERROR"


class NotFoundError(ConvMemError):
    """The target message or context does not exist (or is deleted)."""

    code = "NOT_FOUND"


class ConflictError(ConvMemError):
    """`expected_revision` does not match the current revision."""

    code = "CONFLICT"


class BusyError(ConvMemError):
    """A resource is in use (for example the data-dir lock is held by another process)."""

    code = "BUSY"


class StoreIOError(ConvMemError):
    """Writing, flushing, truncating or replacing a file failed."""

    code = "IO_ERROR"


class UnsafeDataDirError(StoreIOError):
    """The data dir is owned by another user or writable by others: refused, never used."""


class CorruptStoreError(ConvMemError):
    """Persisted data failed an integrity check; nothing was skipped or repaired."""

    code = "CORRUPT_STORE"


class NewerFormatError(CorruptStoreError):
    """The store was written by a newer version (a format this one cannot read): refused,
    nothing changed. Reported as CORRUPT_STORE (the store cannot be opened as it is)."""


class InternalError(ConvMemError):
    """Allocation failure or an impossible internal state."""

    code = "INTERNAL_ERROR"


ERROR_CODES: tuple[str, ...] = (
    "VALIDATION_ERROR",
    "NOT_FOUND",
    "CONFLICT",
    "BUSY",
    "IO_ERROR",
    "CORRUPT_STORE",
    "INTERNAL_ERROR",
)
