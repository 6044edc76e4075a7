"""MemoryService: the seven memory operations of seed 000 over one store and its indexes.

Each method takes the operation's arguments as typed keyword arguments, already checked (the
tool registry, `convmem_engine.tools`, checks what a caller sends against each tool's declared
parameters; JSON strings arrive parsed: `MetadataPatch`, `SearchFilters`, relation types), and
returns the tool's JSON-ready result dict, or raises the `ConvMemError` subclass carrying the
seed's error code. The rules between arguments (which view needs which argument) and against
the stored state (revisions, relation targets, cursors, content offsets) are checked here.

Concurrency: a readers/writer lock. Reads share it. A write, holding the lock alone, checks the
current state, appends its record (`store.write_*`) and updates the indexes; it releases the
lock and waits for durability with `store.sync(seq)` outside it, so concurrent writers share
one fsync; then it publishes its ChangeEvent. A change is visible to readers from the moment it
is applied, a moment before its fsync returns. `rebuild_index` holds the lock alone for the
whole compaction and rebuild, so other requests wait.

The indexes, their background search build and their failure bookkeeping are the `IndexSet`
(index_set.py); health is assembled by health.py, the self-check is self_check.py.
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, Final

from convmem_engine.domain import limits
from convmem_engine.domain.errors import (
    ConflictError,
    InternalError,
    NotFoundError,
    ValidationError,
)
from convmem_engine.domain.message import DEFAULT_METADATA, RELATION_TYPES, Message, Relation
from convmem_engine.domain.validation import MetadataPatch, SearchFilters
from convmem_engine.index.heap import release_free_memory
from convmem_engine.index.search_index import SearchIndex
from convmem_engine.service import search_persist, views
from convmem_engine.service.budget import Budget, message_bound
from convmem_engine.service.events import ChangeEvent, EventHub
from convmem_engine.service.health import health_report
from convmem_engine.service.ids import UlidSource, utc_millis
from convmem_engine.service.index_set import (
    BACKGROUND_SEARCH_FROM,
    FLUSH_BOUND,
    FLUSH_DELAY,
    IndexSet,
)
from convmem_engine.service.rwlock import RWLock
from convmem_engine.service.self_check import self_check
from convmem_engine.storage import FileSystem, Store

_RESULTS_RESERVE: Final = len('{"results":[]}')
ALL_RELATION_TYPES: Final = frozenset(RELATION_TYPES)
NO_FILTERS: Final = SearchFilters()

__all__ = ["BACKGROUND_SEARCH_FROM", "DEFERRED_DURABILITY", "MemoryService"]

DEFERRED_DURABILITY: Final[contextvars.ContextVar[list[Callable[[], None]] | None]] = (
    contextvars.ContextVar("convmem_deferred_durability", default=None)
)
"""Set (to a list) by a caller that makes several changes durable together: one thread running
the writes of many hosts in turn (mcp/fast_call.py's writer). A write, update or delete then
returns once its record is appended and indexed, and appends to the list what is left of it:
waiting for its fsync (`store.sync`, shared by every record appended before), then publishing
its change event. The caller must run each (in the change's context) before it answers the
call, and answer with the error one raises instead: the answer still only says "stored" once
the change is durable. Unset, as for every other caller, each change waits for itself."""


class MemoryService:
    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], int] = utc_millis,
        response_budget: int = limits.RESPONSE_BUDGET_BYTES,
        background_search_from: int = BACKGROUND_SEARCH_FROM,
        search_index_factory: Callable[[], SearchIndex] = SearchIndex,
        keep_search_index: bool = True,
        search_gate: threading.Event | None = None,
        search_flush_delay: float = FLUSH_DELAY,
        search_flush_bound: int = FLUSH_BOUND,
    ) -> None:
        """Wrap an open store (prefer `MemoryService.open`). Builds every index.

        A store of at least `background_search_from` messages gets its search index built on
        a background thread: the service is usable at once. Until that build is done,
        `search_messages` scores the live messages directly (`SearchIndex.scan`: the same
        results), `get_system_health` reports `search_index_bytes` 0, and `rebuild_index`
        waits for it. Writes made meanwhile are queued and applied to the index when it is.
        `clock` (UTC milliseconds) and `response_budget` (bytes) are seams for tests, and so is
        `search_index_factory`
        (makes each new, empty search index; a subclass can inject a failure, like the store's
        `FileSystem` seam). With `keep_search_index` (the default) the search index is loaded
        from the data dir's search.idx at open when it matches and written there at close
        (service/search_persist.py); a look at a copy passes False. With `search_gate` the
        background search build waits until that event is set (`convmem serve` sets it after
        its first answers, so the build does not slow them; `wait_for_search_index`,
        `rebuild_index` and `close` set it too); until then searches scan, as during the build.
        Writes queue their search-index change; it is applied in batches before the next read
        of the search index, or by a background flush `search_flush_delay` seconds after it
        was queued (at once when `search_flush_bound` changes are queued): see index_set.py.
        """
        self._store = store
        self._budget = response_budget
        self._clock = clock
        self._ids = UlidSource(clock)
        self._lock = RWLock()
        self._events = EventHub()
        self._indexes = IndexSet(
            self._lock,
            background_search_from=background_search_from,
            search_index_factory=search_index_factory,
            search_gate=search_gate,
            live=lambda: store.messages,  # (not self: no cycle through the service)
            flush_delay=search_flush_delay,
            flush_bound=search_flush_bound,
        )
        self._closed = False
        self._keep_search_index = keep_search_index
        messages = store.messages
        greatest = messages.max_id()
        if greatest is not None:
            # New ids must sort after every id the store holds, whatever the clock says now.
            self._ids.observe(greatest)
        saved = search_persist.PersistedSearch.capture(store, messages)
        if saved is not None and search_index_factory is SearchIndex:
            self._indexes.build(messages, background=True, saved=saved.load)
        else:  # a test's index factory: built by adding, as it expects
            self._indexes.build(messages, background=True)

    @classmethod
    def open(
        cls,
        data_dir: str | os.PathLike[str],
        *,
        fs: FileSystem | None = None,
        clock: Callable[[], int] = utc_millis,
        response_budget: int = limits.RESPONSE_BUDGET_BYTES,
        background_search_from: int = BACKGROUND_SEARCH_FROM,
        search_index_factory: Callable[[], SearchIndex] = SearchIndex,
        keep_search_index: bool = True,
        on_locked: Callable[[], None] | None = None,
        search_gate: threading.Event | None = None,
        search_flush_delay: float = FLUSH_DELAY,
        search_flush_bound: int = FLUSH_BOUND,
    ) -> MemoryService:
        """Open the store in `data_dir` and build the indexes. `on_locked()` runs once the
        data dir's lock is held, before the store is read.

        Raises BusyError, CorruptStoreError or StoreIOError (from the store).
        """
        store = Store.open(data_dir, fs=fs, on_locked=on_locked, release_memory=release_free_memory)
        try:
            return cls(
                store,
                clock=clock,
                response_budget=response_budget,
                background_search_from=background_search_from,
                search_index_factory=search_index_factory,
                keep_search_index=keep_search_index,
                search_gate=search_gate,
                search_flush_delay=search_flush_delay,
                search_flush_bound=search_flush_bound,
            )
        except BaseException:
            store.close()
            raise

    def close(self) -> None:
        self._indexes.stop()
        with self._lock.write():
            if not self._closed:
                self._closed = True
                index = self._indexes.persistable() if self._keep_search_index else None
                if index is not None:
                    search_persist.save(self._store, index)
                self._store.close()

    def __enter__(self) -> MemoryService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def data_dir(self) -> str:
        """The store's directory (host setup and backups name it)."""
        return self._store.data_dir

    def subscribe(self, callback: Callable[[ChangeEvent], None]) -> Callable[[], None]:
        """Call `callback` after each durable change (on the writer's thread); returns the
        function that unsubscribes it. Callbacks must be quick and thread-safe."""
        return self._events.subscribe(callback)

    def wait_for_search_index(self, timeout: float | None = None) -> bool:
        """Wait until the search index is built (at once when it is not building); True when
        it is, False after `timeout` seconds. Searches never need this (they scan meanwhile);
        for tests and tools that want the finished index, e.g. to measure its build. Then
        applies the queued search-index changes (`IndexSet.flush`; takes the read lock)."""
        if not self._indexes.wait_for_search(timeout):
            return False
        with self._lock.read():
            self._indexes.flush()
        return True

    # -- internals ---------------------------------------------------------------------------

    def _check_closed(self) -> None:
        if self._closed:
            raise InternalError("service: closed")

    def _check_open(self) -> None:
        self._check_closed()
        if self._indexes.broken:
            raise InternalError(
                "indexes: could not be rebuilt after a failed update; run rebuild_index"
            )

    def _apply_to_indexes(self, change: Callable[[], None], what: str) -> bool:
        """Caller holds the write lock and has just stored a change (see `IndexSet.apply`)."""
        return self._indexes.apply(change, what, self._store.messages)

    @staticmethod
    def _after_index_failure(ok: bool) -> None:
        if not ok:
            raise InternalError(
                "indexes: the change was stored but the indexes could not be rebuilt; "
                "run rebuild_index"
            )

    def _state(self) -> views.ReadState:
        return views.ReadState(
            self._store.messages, self._indexes.history, self._indexes.relations, self._budget
        )

    def _check_relation_targets(
        self,
        relations: tuple[Relation, ...],
        kept: tuple[Relation, ...],
        self_id: str | None,
        field: str,
    ) -> None:
        """A relation the caller adds must point at a live message other than the message
        itself. Relations already on the message are kept as they are (their target may have
        been deleted since; the context view shows it as deleted)."""
        if not relations:
            return
        kept_targets = {r.message_id for r in kept}
        for i, rel in enumerate(relations):
            at = f"{field}.relations[{i}].message_id"
            if rel.message_id == self_id:
                raise ValidationError(f"{at}: must not refer to the message itself")
            if rel.message_id in kept_targets:
                continue
            if self._store.get(rel.message_id) is None:
                raise ValidationError(f"{at}: must refer to a live message")

    def _finish(self, seq: int, event: ChangeEvent) -> None:
        deferred = DEFERRED_DURABILITY.get()
        if deferred is not None:
            deferred.append(partial(self._durable, seq, event))
            return
        self._durable(seq, event)

    def _durable(self, seq: int, event: ChangeEvent) -> None:
        self._store.sync(seq)
        self._events.publish(event)

    # -- write_message -----------------------------------------------------------------------

    def write_message(
        self,
        *,
        session_id: str,
        role: str,
        content: str,
        metadata: MetadataPatch | None = None,
    ) -> dict[str, Any]:
        stored_metadata = DEFAULT_METADATA if metadata is None else metadata.apply()
        with self._lock.write():
            self._check_open()
            self._check_relation_targets(stored_metadata.relations, (), None, "metadata_json")
            mid, ts = self._ids.next()
            msg = Message(mid, session_id, ts, role, content, 1, ts, stored_metadata)
            seq = self._store.write_put(msg)  # (stores an equal message: never read it back)
            ok = self._apply_to_indexes(lambda: self._indexes.add(msg), "a write")
        self._finish(seq, ChangeEvent("write", mid, session_id))
        self._after_index_failure(ok)
        return {"status": "OK", "message": msg.to_json()}

    # -- update_message ----------------------------------------------------------------------

    def update_message(
        self,
        *,
        message_id: str,
        content: str | None = None,
        metadata: MetadataPatch | None = None,
        expected_revision: int | None = None,
    ) -> dict[str, Any]:
        """`metadata` holds only the fields to change."""
        if content is None and metadata is None:
            raise ValidationError("content, metadata_json: at least one of them is required")
        mid = message_id
        with self._lock.write():
            self._check_open()
            old = self._store.get(mid)
            if old is None:
                raise NotFoundError("message_id: no live message with this id")
            if expected_revision is not None and expected_revision != old.revision:
                raise ConflictError(
                    "expected_revision: does not match the message's current revision"
                )
            new_metadata = old.metadata if metadata is None else metadata.apply(old.metadata)
            new_text = old.content if content is None else content
            if new_metadata == old.metadata and new_text == old.content:
                return {"status": "OK", "changed": False, "message": old.to_json()}
            if new_metadata.relations != old.metadata.relations:
                self._check_relation_targets(
                    new_metadata.relations, old.metadata.relations, mid, "metadata_json"
                )
            new = Message(
                old.message_id,
                old.session_id,
                old.timestamp,
                old.role,
                new_text,
                old.revision + 1,
                max(self._clock(), old.updated_at),
                new_metadata,
            )
            seq = self._store.write_update(new)
            new = self._store.get(mid) or new
            stored = new
            ok = self._apply_to_indexes(lambda: self._indexes.replace(old, stored), "an update")
        self._finish(seq, ChangeEvent("update", mid, new.session_id))
        self._after_index_failure(ok)
        return {"status": "OK", "changed": True, "message": new.to_json()}

    # -- read_messages -----------------------------------------------------------------------

    def read_messages(
        self,
        *,
        view: str = "history",
        limit: int = limits.READ_LIMIT_DEFAULT,
        cursor: str | None = None,
        session_id: str | None = None,
        message_id: str | None = None,
        content_offset: int = 0,
        content_limit: int = limits.CONTENT_LIMIT_DEFAULT,
        expected_revision: int | None = None,
        before: int = limits.CONTEXT_NEIGHBOURS_DEFAULT,
        after: int = limits.CONTEXT_NEIGHBOURS_DEFAULT,
        relation_depth: int = limits.RELATION_DEPTH_DEFAULT,
        relation_types: frozenset[str] = ALL_RELATION_TYPES,
    ) -> dict[str, Any]:
        """Arguments another view uses are ignored. A cursor is only valid for the view (and
        session) that returned it."""
        if cursor is not None and view in ("content", "context"):
            raise ValidationError(f"cursor: the {view} view does not page")
        if view == "history" and session_id is None:
            raise ValidationError("session_id: is required for the history view")
        if view in ("content", "context") and message_id is None:
            raise ValidationError(f"message_id: is required for the {view} view")
        with self._lock.read():
            self._check_open()
            state = self._state()
            if view == "history":
                assert session_id is not None
                return views.history(state, session_id, limit, cursor)
            if view == "content":
                assert message_id is not None
                return views.content(
                    state, message_id, content_offset, content_limit, expected_revision
                )
            if view == "context":
                assert message_id is not None
                return views.context(
                    state, message_id, before, after, relation_depth, relation_types
                )
            return views.sessions(state, limit, cursor)

    # -- search_messages ---------------------------------------------------------------------

    def search_messages(
        self,
        *,
        query: str,
        session_id: str | None = None,
        filters: SearchFilters = NO_FILTERS,
        min_importance: int = limits.IMPORTANCE_MIN,
        context_size: int = 0,
        limit: int = limits.SEARCH_LIMIT_DEFAULT,
    ) -> dict[str, Any]:
        # Session scope and importance floor go to the index as keywords (its per-session and
        # per-importance lists cut the work); only kinds/tiers/tags need a per-message test.
        accept: Callable[[Message], bool] | None = None
        if not filters.empty:
            accept = filters.accepts_message
        ctx = context_size
        with self._lock.read():
            self._check_open()
            messages = self._store.messages
            hits = self._indexes.search(
                query,
                messages,
                accept=accept,
                limit=limit,
                session_id=session_id,
                min_importance=min_importance,
            )
            history, relations = self._indexes.history, self._indexes.relations
            budget = Budget(_RESULTS_RESERVE, self._budget)
            results: list[dict[str, Any]] = []
            for hit in hits:
                msg = messages[hit.message_id]
                item = msg.to_json()
                item["score"] = hit.score
                item["score_breakdown"] = dict(hit.score_breakdown)
                item["matched_fields"] = list(hit.matched_fields)
                item["relation_count"] = len(msg.metadata.relations) + relations.incoming_count(
                    msg.message_id
                )
                bound = message_bound(msg) + 256  # + score fields
                if ctx > 0:
                    before_ids, after_ids = history.neighbours(
                        msg.session_id, msg.message_id, ctx, ctx
                    )
                    item["context_preview"] = {
                        "before": [messages[i].to_json() for i in before_ids],
                        "after": [messages[i].to_json() for i in after_ids],
                    }
                    bound += 64 + sum(message_bound(messages[i]) + 1 for i in before_ids)
                    bound += sum(message_bound(messages[i]) + 1 for i in after_ids)
                if not budget.take(item, bound):
                    break
                results.append(item)
        return {"results": results}

    # -- delete_message ----------------------------------------------------------------------

    def delete_message(
        self,
        *,
        message_id: str,
        session_id: str | None = None,
        expected_revision: int | None = None,
    ) -> dict[str, Any]:
        """`session_id` guards: only delete if the message belongs to it. `expected_revision`
        (the browser's bulk delete): only delete if the message is still at that revision, else
        ConflictError and nothing is deleted."""
        with self._lock.write():
            self._check_open()
            msg = self._store.get(message_id)
            if msg is None or (session_id is not None and msg.session_id != session_id):
                return {"status": "NOT_FOUND"}
            if expected_revision is not None and expected_revision != msg.revision:
                raise ConflictError(
                    "expected_revision: does not match the message's current revision"
                )
            seq = self._store.write_delete(message_id)
            ok = self._apply_to_indexes(lambda: self._indexes.remove(msg), "a delete")
        self._finish(seq, ChangeEvent("delete", message_id, msg.session_id))
        self._after_index_failure(ok)
        return {"status": "OK"}

    # -- rebuild_index -----------------------------------------------------------------------

    def rebuild_index(self) -> dict[str, Any]:
        self._indexes.wait_for_search()
        with self._lock.write():
            self._check_closed()
            result = self._store.compact()
            self._indexes.rebuild(self._store.messages)
            indexed = len(self._store.messages)
        self._events.publish(ChangeEvent("rebuild", None, None))
        return {
            "status": "OK",
            "messages_indexed": indexed,
            "records_removed": result.records_removed,
            "bytes_before": result.bytes_before,
            "bytes_after": result.bytes_after,
        }

    # -- get_system_health -------------------------------------------------------------------

    def get_system_health(self) -> dict[str, Any]:
        with self._lock.read():
            self._check_closed()
            self._indexes.flush()  # its failure is health's to report
            return health_report(self._store.stats(), self._store.messages, self._indexes)

    # -- import (convmem_engine.transfer) ------------------------------------------------------

    def existing_ids(self, message_ids: Iterable[str]) -> set[str]:
        """The ids among `message_ids` that are live messages."""
        with self._lock.read():
            self._check_open()
            messages = self._store.messages
            return {mid for mid in message_ids if mid in messages}

    def import_messages(self, messages: Sequence[Message]) -> list[Message]:
        """Store already validated messages exactly as given: ids, times, revisions and
        metadata included (an import, see convmem_engine.transfer). A message whose id is
        live already is left as it is. Returns the messages stored, all durable (one fsync
        for the batch). Relations are kept as given: their targets need not be live."""
        stored: list[Message] = []
        seq = 0
        ok = True
        with self._lock.write():
            self._check_open()
            try:
                for msg in messages:
                    if self._store.get(msg.message_id) is not None:
                        continue
                    seq = self._store.write_put(msg)
                    stored.append(self._store.get(msg.message_id) or msg)
            finally:
                if stored:
                    # new ids keep sorting after every imported one
                    self._ids.observe(max(m.message_id for m in stored))

                    def add_all() -> None:
                        for m in stored:
                            self._indexes.add(m)

                    ok = self._apply_to_indexes(add_all, "an import")
        if seq:
            self._store.sync(seq)
        for m in stored:
            self._events.publish(ChangeEvent("write", m.message_id, m.session_id))
        self._after_index_failure(ok)
        return stored

    # -- for tests and tools -----------------------------------------------------------------

    def check(self) -> list[str]:
        """Self-check: the store against its files, and every index against a fresh build."""
        self._indexes.wait_for_search()
        with self._lock.read():
            self._indexes.flush()
            return self_check(self._store, self._indexes)
