"""The self-check (for tests and tools): the store against its files (and its memory counts),
and every index against a fresh build from the live messages (and its byte count against a
walk of its objects: health's memory estimate is those counts). The caller holds the service's
read lock and has waited for a background search build."""

from __future__ import annotations

from convmem_engine.index.history_index import HistoryIndex
from convmem_engine.index.relation_index import RelationIndex
from convmem_engine.service.index_set import IndexSet
from convmem_engine.storage import Store


def self_check(store: Store, indexes: IndexSet) -> list[str]:
    """Every inconsistency found, as one line each; [] when all agree."""
    problems = list(store.check())
    problems.extend(indexes.search_index.check(store.messages))
    messages = list(store.messages.values())
    fresh_history = HistoryIndex()
    fresh_history.build(messages)
    for sid in {m.session_id for m in messages}:
        a = indexes.history.session(sid)
        b = fresh_history.session(sid)
        if a is None or b is None or a.ids != b.ids or a.kind_counts != b.kind_counts:
            problems.append("history index: session differs from a fresh build")
            break
    if indexes.history.session_count() != fresh_history.session_count():
        problems.append("history index: session count differs from a fresh build")
    fresh_relations = RelationIndex()
    fresh_relations.build(messages)
    if not fresh_relations.same_as(indexes.relations):
        problems.append("relation index: differs from a fresh build")
    for name, index in (("history", indexes.history), ("relation", indexes.relations)):
        kept, walked = index.memory_bytes(), index.memory_bytes_fresh()
        if kept != walked:
            problems.append(
                f"{name} index: its byte count {kept} differs from a fresh count {walked}"
            )
    return problems
