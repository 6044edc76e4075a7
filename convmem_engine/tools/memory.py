"""The seven memory tools of seed 000, declared once: description, parameters, annotations,
handler. Their input schemas are generated from the parameters (`ToolSpec`), and so is
docs/tools.md (`scripts/gen_tools_doc.py`).

Every bound comes from `convmem_engine.domain.limits`; the checks are the domain's
(`convmem_engine.domain.validation`). Each handler runs one MemoryService operation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from convmem_engine.domain import limits as L
from convmem_engine.domain import validation as v
from convmem_engine.domain.message import (
    DEFAULT_IMPORTANCE,
    MEMORY_KINDS,
    MEMORY_TIERS,
    RELATION_TYPES,
    ROLES,
)
from convmem_engine.service import cursors
from convmem_engine.tools.spec import (
    Annotations,
    Choice,
    Integer,
    JsonText,
    Param,
    Text,
    ToolSpec,
    Ulid,
)

if TYPE_CHECKING:
    from convmem_engine.service import MemoryService

_BUDGET_MIB: Final = L.RESPONSE_BUDGET_BYTES // L.MIB

INSTRUCTIONS: Final = f"""\
ConvMem is a durable, local memory for conversations. Everything you write is on disk before the
call returns and stays until it is deleted; nothing leaves this machine.

How to use it well:
- Store what will matter later, not every turn: decisions, facts about the user or project,
  preferences, procedures that worked, summaries of long exchanges. Use write_message with one
  stable session_id per conversation or project, and set metadata_json: memory_kind
  (conversation, episode, semantic, procedure, preference, summary), importance 0-100 (default
  50), tags, a short summary, and relations to the messages a memory came from.
- Before answering from memory, search: search_messages finds words and phrases in content,
  summary and tags (substring matching, any language). Narrow with filters_json
  (kinds/tiers/tags), session_id and min_importance; ask for context_size 1-3 to see neighbours.
- To look around a hit, use read_messages with view "context" (neighbours in its session and its
  relations). Use view "history" to replay one session in order and view "sessions" to see which
  sessions exist. Page with the returned nextCursor until it is absent.
- Results stop early to stay under about {_BUDGET_MIB} MiB. Read a long message in
  pieces with view "content": pass content_offset = next_content_offset and expected_revision =
  the revision you first saw, until complete is true.
- Correct memories with update_message rather than writing duplicates; pass expected_revision to
  avoid overwriting a change you have not seen (CONFLICT means re-read, then retry). Consolidate:
  write a summary message with source_message_ids and a derived_from relation, then lower the
  tier or delete what it replaces.
- delete_message hides a message at once; rebuild_index then removes deleted text from disk.
  Delete only when asked or when a memory is wrong; never rebuild without need.
- Every result is JSON text. On failure isError is true and error.code is one of
  VALIDATION_ERROR, NOT_FOUND, CONFLICT, BUSY, IO_ERROR, CORRUPT_STORE, INTERNAL_ERROR;
  error.message names the parameter and the rule. Fix the call instead of repeating it.
"""


_METADATA_FIELDS: Final = (
    f"tool_call_id (string, at most {L.TOOL_CALL_ID_MAX_BYTES} bytes); "
    f"tags (array of at most {L.TAGS_MAX_ITEMS} non-empty strings, {L.TAG_MAX_BYTES} bytes each); "
    f"memory_tier ({' | '.join(MEMORY_TIERS)}, default short); "
    f"memory_kind ({' | '.join(MEMORY_KINDS)}, default conversation); "
    f"importance (integer {L.IMPORTANCE_MIN}-{L.IMPORTANCE_MAX}, default {DEFAULT_IMPORTANCE}); "
    f"summary (string, at most {L.SUMMARY_MAX_BYTES} bytes; empty means unset); "
    f"relations (at most {L.RELATIONS_MAX_ITEMS} objects "
    f'{{"type": {" | ".join(RELATION_TYPES)}, "message_id": ULID}}); '
    f"source_message_ids (at most {L.SOURCE_IDS_MAX_ITEMS} ULIDs)"
)

# -- the parameters several tools share ------------------------------------------------------

_SESSION_ID: Final = Text(L.SESSION_ID_MAX_BYTES, min_bytes=1)
_EXPECTED_REVISION: Final = Integer(L.EXPECTED_REVISION_MIN)
_CONTENT: Final = Text(L.CONTENT_MAX_BYTES, min_bytes=1)
_CURSOR: Final = Text(cursors.CURSOR_MAX_CHARS, min_bytes=1, custom_check=cursors.check_argument)
"""Opaque: only its form is checked here; `read_messages` decodes what it holds."""

# -- handlers: one MemoryService operation each ------------------------------------------------


def _renamed(args: dict[str, Any], json_name: str, name: str) -> dict[str, Any]:
    """The checked arguments with the JSON-string argument under the name of its parsed value."""
    if json_name in args:
        args[name] = args.pop(json_name)
    return args


def _write_message(service: MemoryService, args: dict[str, Any]) -> dict[str, Any]:
    return service.write_message(**_renamed(args, "metadata_json", "metadata"))


def _update_message(service: MemoryService, args: dict[str, Any]) -> dict[str, Any]:
    return service.update_message(**_renamed(args, "metadata_json", "metadata"))


def _read_messages(service: MemoryService, args: dict[str, Any]) -> dict[str, Any]:
    return service.read_messages(**_renamed(args, "relation_types_json", "relation_types"))


def _search_messages(service: MemoryService, args: dict[str, Any]) -> dict[str, Any]:
    return service.search_messages(**_renamed(args, "filters_json", "filters"))


def _delete_message(service: MemoryService, args: dict[str, Any]) -> dict[str, Any]:
    return service.delete_message(**args)


def _rebuild_index(service: MemoryService, args: dict[str, Any]) -> dict[str, Any]:
    return service.rebuild_index()


def _get_system_health(service: MemoryService, args: dict[str, Any]) -> dict[str, Any]:
    return service.get_system_health()


# -- the seven tools ---------------------------------------------------------------------------

WRITE_MESSAGE: Final = ToolSpec(
    name="write_message",
    title="Write a memory",
    description=(
        "Store a new message in long-term memory. It is written to disk (fsync) before this "
        "returns, and the result carries the stored message with its new message_id (a "
        f"{L.ULID_LENGTH}-char ULID), timestamp and revision 1.\n"
        "Use it for anything worth recalling in a later conversation: decisions, facts, "
        "preferences, procedures, summaries. Keep one session_id per conversation or project.\n"
        f"Limits: session_id 1-{L.SESSION_ID_MAX_BYTES} UTF-8 bytes; content 1 byte to "
        f"{L.CONTENT_MAX_BYTES // L.MIB} MiB of UTF-8 text.\n"
        "metadata_json is a JSON object encoded as a string, e.g. "
        '"{\\"memory_kind\\":\\"semantic\\",\\"importance\\":80,\\"tags\\":[\\"project\\"]}". '
        f"Fields: {_METADATA_FIELDS}."
    ),
    params=(
        Param(
            "session_id",
            _SESSION_ID,
            "The conversation or project this message belongs to "
            f"(1-{L.SESSION_ID_MAX_BYTES} UTF-8 bytes).",
            required=True,
        ),
        Param("role", Choice(ROLES), "Who said it: user, assistant or system.", required=True),
        Param(
            "content",
            _CONTENT,
            f"The message text (1 byte to {L.CONTENT_MAX_BYTES // L.MIB} MiB of UTF-8).",
            required=True,
        ),
        Param(
            "metadata_json",
            JsonText(v.metadata_json),
            "Optional metadata: a JSON object as a string (default {}). " + _METADATA_FIELDS,
        ),
    ),
    annotations=Annotations(read_only=False, destructive=False, idempotent=False),
    handler=_write_message,
)

UPDATE_MESSAGE: Final = ToolSpec(
    name="update_message",
    title="Update a memory",
    description=(
        "Change the content and/or metadata of an existing message; its message_id, session, "
        "role and creation time stay. Give at least one of content and metadata_json. "
        "metadata_json holds only the fields to change; fields it omits keep their values. "
        "Updating to identical values is a no-op (changed: false, revision unchanged). "
        "Otherwise revision goes up by one and the change is on disk before this returns.\n"
        "Pass expected_revision (the revision you last read) to make the update conditional: "
        "if someone changed the message since, you get CONFLICT and nothing is written; re-read "
        "and decide again. Unknown or deleted message_id gives NOT_FOUND.\n"
        f"Limits: content at most {L.CONTENT_MAX_BYTES // L.MIB} MiB. "
        f"Metadata fields: {_METADATA_FIELDS}."
    ),
    params=(
        Param(
            "message_id",
            Ulid(),
            f"The message to change ({L.ULID_LENGTH}-character ULID).",
            required=True,
        ),
        Param(
            "content",
            _CONTENT,
            f"New content (1 byte to {L.CONTENT_MAX_BYTES // L.MIB} MiB of UTF-8).",
        ),
        Param(
            "metadata_json",
            JsonText(v.metadata_json),
            "Metadata fields to change: a JSON object as a string. " + _METADATA_FIELDS,
        ),
        Param(
            "expected_revision",
            _EXPECTED_REVISION,
            "Only update if the message is still at this revision (else CONFLICT).",
        ),
    ),
    annotations=Annotations(read_only=False, destructive=True, idempotent=True),
    handler=_update_message,
)

READ_MESSAGES: Final = ToolSpec(
    name="read_messages",
    title="Read memories",
    description=(
        "Read stored messages. Choose a view (default history):\n"
        "- history: the live messages of one session in creation order. Needs session_id. "
        f"Returns {{history: [...], nextCursor?}}; limit {L.READ_LIMIT_MIN}-{L.READ_LIMIT_MAX} "
        f"(default {L.READ_LIMIT_DEFAULT}).\n"
        "- sessions: every session with message_count, kind_counts, representative_summary, "
        "started_at and last_message_at, in a stable order. Returns {sessions: [...], "
        "nextCursor?}.\n"
        "- context: one message (message_id) with before/after neighbours from its session "
        f"(0-{L.CONTEXT_NEIGHBOURS_MAX} each, default {L.CONTEXT_NEIGHBOURS_DEFAULT}) and its "
        f"relations up to relation_depth (0-{L.RELATION_DEPTH_MAX}, default "
        f"{L.RELATION_DEPTH_DEFAULT}), optionally only relation_types_json (a JSON array as a "
        f'string, e.g. "[\\"derived_from\\"]"). At most {L.CONTEXT_MAX_MESSAGES} messages; '
        "truncated tells you when more exist.\n"
        "- content: a byte range of one message's content (message_id), for content too long "
        f"for one result. content_limit {L.CONTENT_LIMIT_MIN}-{L.CONTENT_LIMIT_MAX} bytes "
        f"(default {L.CONTENT_LIMIT_DEFAULT}). While complete is false, call again with "
        "content_offset = next_content_offset and expected_revision = the revision from the "
        "first piece (CONFLICT means it changed meanwhile: start again).\n"
        "Paging: when a result has nextCursor, pass it back as cursor with the same other "
        "arguments to get the next page; no nextCursor means you have everything. Results stop "
        f"early to stay under about {L.RESPONSE_BUDGET_BYTES // L.MIB} MiB. "
        "Unknown or deleted message_id gives NOT_FOUND. Reading never changes anything."
    ),
    params=(
        Param(
            "view",
            Choice(v.VIEWS),
            "Which view to read: history, content, context or sessions.",
            default="history",
        ),
        Param(
            "limit",
            Integer(L.READ_LIMIT_MIN, L.READ_LIMIT_MAX),
            "history and sessions: most items in one page.",
            default=L.READ_LIMIT_DEFAULT,
        ),
        Param(
            "cursor",
            _CURSOR,
            "history and sessions: the nextCursor of the previous page "
            "(opaque; pass it back unchanged).",
        ),
        Param("session_id", _SESSION_ID, "history: the session to read (required for history)."),
        Param(
            "message_id",
            Ulid(),
            "content and context: the message to read (required for those views).",
        ),
        Param(
            "content_offset",
            Integer(0),
            "content: UTF-8 byte offset to start at (0, the end, or a character boundary).",
            default=0,
        ),
        Param(
            "content_limit",
            Integer(L.CONTENT_LIMIT_MIN, L.CONTENT_LIMIT_MAX),
            "content: target piece size in bytes.",
            default=L.CONTENT_LIMIT_DEFAULT,
        ),
        Param(
            "expected_revision",
            _EXPECTED_REVISION,
            "content: fail with CONFLICT unless the message is at this revision.",
        ),
        Param(
            "before",
            Integer(0, L.CONTEXT_NEIGHBOURS_MAX),
            "context: neighbours before the message in its session.",
            default=L.CONTEXT_NEIGHBOURS_DEFAULT,
        ),
        Param(
            "after",
            Integer(0, L.CONTEXT_NEIGHBOURS_MAX),
            "context: neighbours after the message in its session.",
            default=L.CONTEXT_NEIGHBOURS_DEFAULT,
        ),
        Param(
            "relation_depth",
            Integer(0, L.RELATION_DEPTH_MAX),
            "context: how many relation hops to follow.",
            default=L.RELATION_DEPTH_DEFAULT,
        ),
        Param(
            "relation_types_json",
            JsonText(v.relation_types_json),
            "context: only follow these relation types; a JSON array as a string of "
            f"{', '.join(RELATION_TYPES)} (default: all).",
        ),
    ),
    annotations=Annotations(read_only=True, destructive=False, idempotent=True),
    handler=_read_messages,
)

SEARCH_MESSAGES: Final = ToolSpec(
    name="search_messages",
    title="Search memories",
    description=(
        "Find stored messages whose content, summary or tags contain the query (substring "
        "matching that works for any language, including Japanese and Chinese). Results come "
        "best first, each a full message plus score, score_breakdown, matched_fields and "
        "relation_count; with context_size > 0 also context_preview (neighbours in its "
        "session). Searching changes nothing.\n"
        f"query is 1-{L.QUERY_MAX_BYTES} UTF-8 bytes. Narrow with session_id, min_importance "
        f"({L.IMPORTANCE_MIN}-{L.IMPORTANCE_MAX}) and filters_json, a JSON object as a string: "
        f'{{"kinds": [...], "tiers": [...], "tags": [...]}}, e.g. '
        '"{\\"kinds\\":[\\"semantic\\",\\"preference\\"],\\"tags\\":[\\"project\\"]}". '
        "Any listed kind and any listed tier may match; all listed tags must be present. "
        f"Kinds: {', '.join(MEMORY_KINDS)}. Tiers: {', '.join(MEMORY_TIERS)}.\n"
        f"limit {L.SEARCH_LIMIT_MIN}-{L.SEARCH_LIMIT_MAX} (default {L.SEARCH_LIMIT_DEFAULT}); "
        f"context_size 0-{L.SEARCH_CONTEXT_MAX}. Fewer results than limit can come back when "
        f"the result would exceed about {L.RESPONSE_BUDGET_BYTES // L.MIB} MiB. To read a hit "
        'in full or around it, use read_messages (view "context" or "content").'
    ),
    params=(
        Param(
            "query",
            Text(L.QUERY_MAX_BYTES, min_bytes=1),
            f"Text to look for (1-{L.QUERY_MAX_BYTES} UTF-8 bytes).",
            required=True,
        ),
        Param("session_id", _SESSION_ID, "Only search this session (default: all sessions)."),
        Param(
            "filters_json",
            JsonText(v.filters_json),
            'Filters: a JSON object as a string with optional "kinds", "tiers" and '
            '"tags" arrays (default {}).',
        ),
        Param(
            "min_importance",
            Integer(L.IMPORTANCE_MIN, L.IMPORTANCE_MAX),
            "Only messages with at least this importance.",
            default=L.IMPORTANCE_MIN,
        ),
        Param(
            "context_size",
            Integer(0, L.SEARCH_CONTEXT_MAX),
            "Neighbours before and after each result to include as context_preview.",
            default=0,
        ),
        Param(
            "limit",
            Integer(L.SEARCH_LIMIT_MIN, L.SEARCH_LIMIT_MAX),
            "Most results to return.",
            default=L.SEARCH_LIMIT_DEFAULT,
        ),
    ),
    annotations=Annotations(read_only=True, destructive=False, idempotent=True),
    handler=_search_messages,
)

DELETE_MESSAGE: Final = ToolSpec(
    name="delete_message",
    title="Delete a memory",
    description=(
        "Delete one message: from now on no read or search returns it. Returns "
        '{"status": "OK"} when it was deleted and {"status": "NOT_FOUND"} (a normal result, '
        "not an error) when there was nothing to delete: unknown id, already deleted, or the "
        "session_id guard did not match. Pass session_id to delete only if the message "
        "belongs to that session. The text stays in the log file until rebuild_index "
        "compacts it away. Delete only when the user asks or a memory is wrong; to demote a "
        'memory instead, update its memory_tier (e.g. "discard").'
    ),
    params=(
        Param(
            "message_id",
            Ulid(),
            f"The message to delete ({L.ULID_LENGTH}-character ULID).",
            required=True,
        ),
        Param("session_id", _SESSION_ID, "Only delete if the message belongs to this session."),
    ),
    annotations=Annotations(read_only=False, destructive=True, idempotent=True),
    handler=_delete_message,
)

REBUILD_INDEX: Final = ToolSpec(
    name="rebuild_index",
    title="Compact and rebuild",
    description=(
        "Compact the store: rewrite the log with only live messages (physically removing the "
        "text of deleted messages and old revisions), write a fresh snapshot and rebuild the "
        "in-memory indexes. Atomic: a crash leaves the old or the new state, never a mix. "
        "Other requests wait until it finishes, which can take a while on a large store. "
        "Returns messages_indexed, records_removed, bytes_before and bytes_after. Use it after "
        "deleting sensitive content or when get_system_health shows many dead_bytes; there is "
        "no need to run it routinely. Takes no arguments."
    ),
    params=(),
    annotations=Annotations(read_only=False, destructive=True, idempotent=True),
    handler=_rebuild_index,
)

GET_SYSTEM_HEALTH: Final = ToolSpec(
    name="get_system_health",
    title="Memory health",
    description=(
        "Report the state of the store: status (OK, or DEGRADED when last_error is set), "
        "format_version, log and snapshot sizes, active_messages, session_count, "
        "deleted_messages, last_sequence, update_records, dead_bytes, a memory_estimate "
        "breakdown, I/O counters, recovered_tail, snapshot_valid and last_error. Read-only; "
        "takes no arguments. Use it to diagnose errors or to decide whether rebuild_index is "
        "worth running."
    ),
    params=(),
    annotations=Annotations(read_only=True, destructive=False, idempotent=True),
    handler=_get_system_health,
)

MEMORY_TOOLS: Final[tuple[ToolSpec[MemoryService], ...]] = (
    WRITE_MESSAGE,
    UPDATE_MESSAGE,
    READ_MESSAGES,
    SEARCH_MESSAGES,
    DELETE_MESSAGE,
    REBUILD_INDEX,
    GET_SYSTEM_HEALTH,
)
