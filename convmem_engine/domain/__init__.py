"""Domain values and errors: Message, Metadata, Relation, the enums and the error tree. No I/O."""

from convmem_engine.domain import limits, validation
from convmem_engine.domain.errors import (
    ERROR_CODES,
    BusyError,
    ConflictError,
    ConvMemError,
    CorruptStoreError,
    InternalError,
    NewerFormatError,
    NotFoundError,
    StoreIOError,
    UnsafeDataDirError,
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
from convmem_engine.domain.validation import MetadataPatch, SearchFilters

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
    "MetadataPatch",
    "NewerFormatError",
    "NotFoundError",
    "Relation",
    "SearchFilters",
    "StoreIOError",
    "UnsafeDataDirError",
    "ValidationError",
    "limits",
    "validation",
]
