"""The four `read_messages` views, built from the store's live messages and the indexes.

Pure reads: callers hold the service's read lock; nothing here writes or counts I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from convmem_engine.domain import limits
from convmem_engine.domain.errors import ConflictError, NotFoundError, ValidationError
from convmem_engine.domain.message import Message
from convmem_engine.index.history_index import HistoryIndex
from convmem_engine.index.relation_index import RelationIndex
from convmem_engine.service import cursors
from convmem_engine.service.budget import Budget, json_bytes, message_bound, text_bound

_CURSOR_RESERVE: Final = len(',"nextCursor":""') + cursors.CURSOR_MAX_CHARS


@dataclass(frozen=True, slots=True)
class ReadState:
    messages: Mapping[str, Message]
    history: HistoryIndex
    relations: RelationIndex
    budget: int = limits.RESPONSE_BUDGET_BYTES


def _not_found(message_id: str) -> NotFoundError:
    del message_id  # never echoed
    return NotFoundError("message_id: no live message with this id")


# -- history ---------------------------------------------------------------------------------


def history(state: ReadState, session_id: str, limit: int, cursor: str | None) -> dict[str, Any]:
    after = None if cursor is None else cursors.decode(cursor, "history", session_id)
    ids, more = state.history.ids_after(session_id, after, limit)
    budget = Budget(len('{"history":[]}') + _CURSOR_RESERVE, state.budget)
    items: list[dict[str, Any]] = []
    for mid in ids:
        msg = state.messages[mid]
        item = msg.to_json()
        if not budget.take(item, message_bound(msg)):
            more = True
            break
        items.append(item)
    result: dict[str, Any] = {"history": items}
    if more and items:
        result["nextCursor"] = cursors.encode("history", session_id, items[-1]["message_id"])
    return result


# -- content ---------------------------------------------------------------------------------


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def content(
    state: ReadState,
    message_id: str,
    offset: int,
    limit: int,
    expected_revision: int | None,
) -> dict[str, Any]:
    msg = state.messages.get(message_id)
    if msg is None:
        raise _not_found(message_id)
    if expected_revision is not None and expected_revision != msg.revision:
        raise ConflictError("expected_revision: does not match the message's current revision")
    data = msg.content.encode("utf-8")
    total = len(data)
    if offset > total:
        raise ValidationError("content_offset: must not be past the end of the content")
    if offset < total and _is_continuation(data[offset]):
        raise ValidationError("content_offset: must be on a UTF-8 code point boundary")
    end = min(offset + limit, total)
    if end < total and _is_continuation(data[end]):
        shortened = end
        while _is_continuation(data[shortened]):
            shortened -= 1
        if shortened > offset:
            end = shortened  # the usual case: stop at the previous boundary
        else:
            # The limit is smaller than the one code point at `offset`: return it whole
            # (at most 3 bytes over the limit).
            end += 1
            while end < total and _is_continuation(data[end]):
                end += 1
    return {
        "content_range": {
            "message_id": msg.message_id,
            "revision": msg.revision,
            "total_bytes": total,
            "content_offset": offset,
            "next_content_offset": end,
            "complete": end == total,
            "content": data[offset:end].decode("utf-8"),
        }
    }


# -- context ---------------------------------------------------------------------------------


def context(
    state: ReadState,
    message_id: str,
    before: int,
    after: int,
    relation_depth: int,
    relation_types: frozenset[str],
) -> dict[str, Any]:
    msg = state.messages.get(message_id)
    if msg is None:
        raise _not_found(message_id)
    cap = limits.CONTEXT_MAX_MESSAGES
    root = msg.to_json()
    session = {
        "session_id": msg.session_id,
        "message_count": state.history.message_count(msg.session_id),
    }
    # Fixed parts first, then each entry while the budget and the 50-message cap allow.
    budget = Budget(
        json_bytes(
            {
                "message": root,
                "chronological_context": {"before": [], "after": []},
                "relations": [],
                "session": session,
                "truncated": False,
            }
        )
        + 1,  # slack for the separator accounting below
        state.budget,
    )
    budget.count = 1  # the message itself (counts toward the cap); entries need a separator
    truncated = False
    before_ids, after_ids = state.history.neighbours(msg.session_id, message_id, before, after)
    taken_before: list[dict[str, Any]] = []
    taken_after: list[dict[str, Any]] = []
    # Nearest first, alternating, so a cut keeps the closest neighbours on both sides.
    order: list[tuple[list[dict[str, Any]], str]] = []
    for i in range(max(len(before_ids), len(after_ids))):
        if i < len(before_ids):
            order.append((taken_before, before_ids[-1 - i]))
        if i < len(after_ids):
            order.append((taken_after, after_ids[i]))
    for target_list, mid in order:
        neighbour = state.messages[mid]
        item = neighbour.to_json()
        if budget.count >= cap or not budget.take(item, message_bound(neighbour)):
            truncated = True
            break
        target_list.append(item)
    taken_before.sort(key=lambda m: str(m["message_id"]))
    relations: list[dict[str, Any]] = []
    visited = {message_id}
    frontier = [msg]
    for depth in range(1, relation_depth + 1):
        if truncated:
            break
        next_frontier: list[Message] = []
        for node in frontier:
            edges: list[tuple[str, str, str]] = [
                (rel.type, "outgoing", rel.message_id)
                for rel in node.metadata.relations
                if rel.type in relation_types
            ]
            edges.extend(
                (rel_type, "incoming", source)
                for source, rel_type in state.relations.incoming(node.message_id)
                if rel_type in relation_types
            )
            for rel_type, direction, other in edges:
                if other in visited:
                    continue
                visited.add(other)
                target = state.messages.get(other)
                entry: dict[str, Any]
                bound = 256
                if target is None:
                    entry = {
                        "type": rel_type,
                        "direction": direction,
                        "depth": depth,
                        "message_id": other,
                        "status": "deleted",
                    }
                else:
                    entry = {
                        "type": rel_type,
                        "direction": direction,
                        "depth": depth,
                        "message": target.to_json(),
                    }
                    bound += message_bound(target)
                if budget.count >= cap or not budget.take(entry, bound):
                    truncated = True
                    break
                relations.append(entry)
                if target is not None:
                    next_frontier.append(target)
            if truncated:
                break
        frontier = next_frontier
    return {
        "message": root,
        "chronological_context": {"before": taken_before, "after": taken_after},
        "relations": relations,
        "session": session,
        "truncated": truncated,
    }


# -- sessions --------------------------------------------------------------------------------


def representative_summary(state: ReadState, session_id: str) -> str:
    """The latest `metadata.summary` in the session; else the content of its latest
    `summary`-kind message; else the content of its latest message. Never shortened."""
    sess = state.history.session(session_id)
    assert sess is not None and sess.ids
    if sess.summary_ids:
        summary = state.messages[sess.summary_ids[-1]].metadata.summary
        assert summary is not None
        return summary
    if sess.kind_summary_ids:
        return state.messages[sess.kind_summary_ids[-1]].content
    return state.messages[sess.ids[-1]].content


def session_entry(state: ReadState, session_id: str) -> dict[str, Any]:
    sess = state.history.session(session_id)
    assert sess is not None and sess.ids
    return {
        "session_id": session_id,
        "message_count": len(sess.ids),
        "kind_counts": sess.kind_count_map(),
        "representative_summary": representative_summary(state, session_id),
        "started_at": state.messages[sess.ids[0]].timestamp,
        "last_message_at": state.messages[sess.ids[-1]].timestamp,
    }


def sessions(state: ReadState, limit: int, cursor: str | None) -> dict[str, Any]:
    after = None if cursor is None else cursors.decode(cursor, "sessions", "")
    session_ids, more = state.history.sessions_after(after, limit)
    budget = Budget(len('{"sessions":[]}') + _CURSOR_RESERVE, state.budget)
    items: list[dict[str, Any]] = []
    last_key = ""
    for sid in session_ids:
        item = session_entry(state, sid)
        bound = text_bound(sid) + text_bound(str(item["representative_summary"])) + 512
        if not budget.take(item, bound):
            more = True
            break
        items.append(item)
        sess = state.history.session(sid)
        assert sess is not None
        last_key = sess.ids[0]
    result: dict[str, Any] = {"sessions": items}
    if more and items:
        result["nextCursor"] = cursors.encode("sessions", "", last_key)
    return result
