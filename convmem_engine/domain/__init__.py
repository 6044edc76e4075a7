"""Domain values and errors: Message, Metadata, Relation, the enums and the error tree. No I/O."""

from convmem_engine.domain.errors import (
    ERROR_CODES,
    BusyError,
    ConflictError,
    ConvMemError,
    CorruptStoreError,
    InternalError,
    NotFoundError,
    StoreIOError,
    ValidationError,
)
from convmem_engine.domain.message import (
    DEFAULT_METADATA,
    MEMORY_KINDS,
    MEMORY_TIERS,
    RELATION_TYPES,
    ROLES,
    Message,
    Metadata,
    Relation,
)

__all__ = [
    "DEFAULT_METADATA",
    "ERROR_CODES",
    "MEMORY_KINDS",
    "MEMORY_TIERS",
    "RELATION_TYPES",
    "ROLES",
    "BusyError",
    "ConflictError",
    "ConvMemError",
    "CorruptStoreError",
    "InternalError",
    "Message",
    "Metadata",
    "NotFoundError",
    "Relation",
    "StoreIOError",
    "ValidationError",
]
