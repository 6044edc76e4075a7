"""`get_system_health`: the store's counters, the indexes' state and the memory estimate in the
tool reference's shape. Pure assembly; the caller holds the service's read lock."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from convmem_engine.domain.message import Message
from convmem_engine.service.index_set import IndexSet
from convmem_engine.storage import StoreStats


def memory_estimate(stats: StoreStats, indexes: IndexSet, *, walk: bool = False) -> dict[str, int]:
    """The project's main allocations, by `sys.getsizeof` of the objects (docs/semantics.md):
    the store's counts of its live messages and each index's containers. Constant time: the
    store and every index keep their byte counts up to date on every change, so nothing is
    walked here. `walk=True` walks every index's objects instead (the reference the tests
    compare with; the store's counts are checked against a fresh count by its `check`)."""
    mem = stats.memory
    store_entries = mem.entry_bytes + mem.table_bytes
    search_bytes = indexes.search_index_bytes(walk=walk)
    if walk:
        history_bytes = indexes.history.memory_bytes_fresh()
        relation_bytes = indexes.relations.memory_bytes_fresh()
    else:
        history_bytes = indexes.history.memory_bytes()
        relation_bytes = indexes.relations.memory_bytes()
    return {
        "total_bytes": store_entries
        + mem.body_bytes
        + mem.metadata_bytes
        + search_bytes
        + history_bytes
        + relation_bytes,
        "store_entries_bytes": store_entries,
        "body_bytes": mem.body_bytes,
        "metadata_bytes": mem.metadata_bytes,
        "search_index_bytes": search_bytes,
        "history_index_bytes": history_bytes,
        "relation_index_bytes": relation_bytes,
    }


def health_report(
    stats: StoreStats, messages: Mapping[str, Message], indexes: IndexSet
) -> dict[str, Any]:
    """The result of get_system_health: DEGRADED while any failure is kept (the store's last
    error, a failed index update, a failed background search build)."""
    last_error = "; ".join(e for e in (stats.last_error, *indexes.errors) if e)
    return {
        "status": "DEGRADED" if last_error else "OK",
        "format_version": stats.format_version,
        "log_size": stats.log_size,
        "snapshot_size": stats.snapshot_size,
        "active_messages": len(messages),
        "session_count": indexes.history.session_count(),
        "deleted_messages": stats.deleted_messages,
        "last_sequence": stats.last_sequence,
        "update_records": stats.update_records,
        "dead_bytes": stats.dead_bytes,
        "memory_estimate": memory_estimate(stats, indexes),
        "io": stats.io.to_json(),
        "recovered_tail": stats.recovered_tail,
        "snapshot_valid": stats.snapshot_valid,
        "last_error": last_error,
    }
