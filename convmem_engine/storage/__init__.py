"""Durable storage: CRC32 append-only log, snapshot, recovery, compaction, the data-dir lock.

See docs/storage-format.md for the bytes on disk and contracts.md for the API.
"""

from convmem_engine.storage.fs import FileSystem, IOCounters
from convmem_engine.storage.store import CompactionResult, Store, StoreStats

__all__ = ["CompactionResult", "FileSystem", "IOCounters", "Store", "StoreStats"]
