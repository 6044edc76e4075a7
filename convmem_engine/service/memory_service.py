"""MemoryService: the seven memory operations of seed 000 over one store and its indexes.

Each method takes the tool's arguments as keyword arguments (the tool reference's names and
JSON types; `None` means omitted) and returns the tool's JSON-ready result dict, or raises the
`ConvMemError` subclass carrying the seed's error code.

Concurrency: a readers/writer lock. Reads share it. A write validates its arguments first (no
lock), then, holding the lock alone, checks the current state, appends its record
(`store.write_*`) and updates the indexes; it releases the lock and waits for durability with
`store.sync(seq)` outside it, so concurrent writers share one fsync; then it publishes its
ChangeEvent. A change is visible to readers from the moment it is applied, a moment before
its fsync returns. `rebuild_index` holds the lock alone for the whole compaction and rebuild, so
other requests wait.

Large stores build the search index on a background thread after open (see `__init__`); the
other indexes are built before `open` returns.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from convmem_engine.domain import limits
from convmem_engine.domain import validation as v
from convmem_engine.domain.errors import (
    ConflictError,
    InternalError,
    NotFoundError,
    ValidationError,
)
from convmem_engine.domain.message import Message, Metadata, Relation
from convmem_engine.index.history_index import HistoryIndex
from convmem_engine.index.relation_index import RelationIndex
from convmem_engine.index.search_index import SearchIndex
from convmem_engine.service import views
from convmem_engine.service.accounting import (
    MessageAccounting,
    dict_table_bytes,
    session_ids_bytes,
)
from convmem_engine.service.budget import Budget, message_bound
from convmem_engine.service.events import ChangeEvent, EventHub
from convmem_engine.service.ids import UlidSource, utc_millis
from convmem_engine.service.rwlock import RWLock
from convmem_engine.storage import FileSystem, Store

_RESULTS_RESERVE = len('{"results":[]}')
BACKGROUND_SEARCH_FROM = 20_000
"""Stores with at least this many live messages build their search index in the background."""

log = logging.getLogger(__name__)


def _freeze_heap() -> None:
    """Move every object alive now (the store and the indexes: millions of long-lived, acyclic
    objects) out of the cyclic collector's scans. Without this each full collection walks them
    all while holding the GIL, a pause of hundreds of milliseconds on whichever thread
    allocates. Refcounting still frees them when dropped (e.g. the old indexes after a
    rebuild). A constant-time list splice. Done for large stores only (where the pauses are)."""
    gc.freeze()


def _apply_search_change(index: SearchIndex, op: str, msg: Message, new: Message | None) -> None:
    """Apply one change ("add", "remove" or "replace" `msg` by `new`) to a search index."""
    if op == "add":
        index.add(msg)
    elif op == "remove":
        index.remove(msg)
    else:
        assert new is not None
        index.replace(msg, new)


class MemoryService:
    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], int] = utc_millis,
        response_budget: int = limits.RESPONSE_BUDGET_BYTES,
        background_search_from: int = BACKGROUND_SEARCH_FROM,
        search_index_factory: Callable[[], SearchIndex] = SearchIndex,
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
        `FileSystem` seam).
        """
        self._store = store
        self._budget = response_budget
        self._clock = clock
        self._ids = UlidSource(clock)
        self._lock = RWLock()
        self._events = EventHub()
        self._history = HistoryIndex()
        self._relations = RelationIndex()
        self._new_search_index = search_index_factory
        self._search = search_index_factory()
        self._search_ready = threading.Event()
        # Changes made while the search index builds in the background, applied when it is.
        self._search_pending: list[tuple[str, Message, Message | None]] | None = None
        self._search_error: str = ""
        self._search_thread: threading.Thread | None = None
        self._search_cancel = False
        self._background_search_from = background_search_from
        # Built on the first health call (not at open), then maintained by every change.
        self._accounting: MessageAccounting | None = None
        self._accounting_lock = threading.Lock()
        # Set when an index update failed after its change was stored (see `_recover`);
        # reported as health `last_error` (DEGRADED) until rebuild_index succeeds.
        self._index_error = ""
        # Set when rebuilding the indexes after such a failure failed too: the indexes are
        # not usable; every operation but get_system_health and rebuild_index refuses.
        self._indexes_broken = False
        self._closed = False
        self._build_indexes(background=True)

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
    ) -> MemoryService:
        """Open the store in `data_dir` and build the indexes.

        Raises BusyError, CorruptStoreError or StoreIOError (from the store).
        """
        store = Store.open(data_dir, fs=fs)
        try:
            return cls(
                store,
                clock=clock,
                response_budget=response_budget,
                background_search_from=background_search_from,
                search_index_factory=search_index_factory,
            )
        except BaseException:
            store.close()
            raise

    def close(self) -> None:
        self._search_cancel = True
        thread = self._search_thread
        if thread is not None:
            thread.join()
        with self._lock.write():
            if not self._closed:
                self._closed = True
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

    # -- internals ---------------------------------------------------------------------------

    def _build_indexes(self, *, background: bool) -> None:
        """Caller holds the write lock (or is the constructor)."""
        messages = self._store.messages
        self._accounting = None
        self._history.build(messages.values())
        self._relations.build(messages.values())
        if messages:
            # New ids must sort after every id the store holds, whatever the clock says now.
            self._ids.observe(max(messages))
        self._search = self._new_search_index()
        self._search_error = ""
        if background and len(messages) >= self._background_search_from:
            self._search_ready.clear()
            self._search_pending = []
            self._search_thread = threading.Thread(
                target=self._build_search,
                args=(self._search, list(messages.values())),
                name="convmem-search-build",
                daemon=True,
            )
            self._search_thread.start()
        else:
            for msg in messages.values():
                self._search.add(msg)
            self._search_pending = None
            self._search_ready.set()
            if len(messages) >= BACKGROUND_SEARCH_FROM:
                _freeze_heap()

    def _build_search(self, index: SearchIndex, messages: list[Message]) -> None:
        """Background thread: index the messages live at open, then (holding the write lock)
        the changes queued since, and declare the index ready."""
        error = ""
        try:
            for msg in messages:
                if self._search_cancel:
                    break
                index.add(msg)
        except Exception as e:  # reported by search_messages; rebuild_index recovers
            log.exception("search index build failed")
            error = f"search index: build failed ({type(e).__name__})"
        with self._lock.write():
            if index is not self._search:
                # Replaced meanwhile (the indexes were rebuilt after a failed update): the
                # new index is complete and ready; this one is dropped.
                return
            pending = self._search_pending or []
            self._search_pending = None
            if not error and not self._search_cancel:
                try:
                    for op, msg, new in pending:
                        _apply_search_change(index, op, msg, new)
                except Exception as e:  # never leave searches waiting for a ready index
                    log.error("search index: applying queued changes failed: %s", type(e).__name__)
                    error = f"search index: build failed ({type(e).__name__})"
            self._search_error = error
            self._search_ready.set()
        if len(messages) >= BACKGROUND_SEARCH_FROM:
            _freeze_heap()

    def _wait_for_search(self) -> None:
        """Called before taking the lock (the builder needs it to finish)."""
        self._search_ready.wait()

    def wait_for_search_index(self, timeout: float | None = None) -> bool:
        """Wait until the search index is built (at once when it is not building); True when
        it is, False after `timeout` seconds. Searches never need this (they scan meanwhile);
        for tests and tools that want the finished index, e.g. to measure its build."""
        return self._search_ready.wait(timeout)

    def _search_apply(self, op: str, msg: Message, new: Message | None = None) -> None:
        if self._search_pending is not None:
            self._search_pending.append((op, msg, new))
        else:
            _apply_search_change(self._search, op, msg, new)

    def _index_add(self, msg: Message) -> None:
        self._history.add(msg)
        self._relations.add(msg)
        self._search_apply("add", msg)
        if self._accounting is not None:
            self._accounting.add(msg)

    def _index_remove(self, msg: Message) -> None:
        self._history.remove(msg)
        self._relations.remove(msg)
        self._search_apply("remove", msg)
        if self._accounting is not None:
            self._accounting.remove(msg)

    def _index_replace(self, old: Message, new: Message) -> None:
        self._history.replace(old, new)
        self._relations.replace(old, new)
        self._search_apply("replace", old, new)
        if self._accounting is not None:
            self._accounting.remove(old)
            self._accounting.add(new)

    def _message_accounting(self) -> MessageAccounting:
        """Caller holds the read lock (so no write runs); the mutex stops two health calls
        from both building it."""
        with self._accounting_lock:
            if self._accounting is None:
                acc = MessageAccounting()
                for msg in self._store.messages.values():
                    acc.add(msg)
                self._accounting = acc
            return self._accounting

    def _check_closed(self) -> None:
        if self._closed:
            raise InternalError("service: closed")

    def _check_open(self) -> None:
        self._check_closed()
        if self._indexes_broken:
            raise InternalError(
                "indexes: could not be rebuilt after a failed update; run rebuild_index"
            )

    def _apply_to_indexes(self, change: Callable[[], None], what: str) -> bool:
        """Caller holds the write lock and has just stored a change: apply it to the indexes.

        The store is the truth. If an index update fails (e.g. MemoryError) the indexes may
        hold half the change, so they are rebuilt from the store and the failure is kept as
        `last_error` (health DEGRADED) until rebuild_index succeeds. The change itself is
        durable and visible, so the caller's request still succeeds. If the rebuild fails
        too, the indexes are marked broken (every operation but get_system_health and
        rebuild_index raises INTERNAL_ERROR) and this returns False: the caller raises
        INTERNAL_ERROR once its change is durable."""
        try:
            change()
            return True
        except Exception as exc:
            log.error("index update after %s failed: %s", what, type(exc).__name__)
            self._index_error = (
                f"indexes: update after {what} failed ({type(exc).__name__}); "
                "rebuilt from the store"
            )
        try:
            self._build_indexes(background=False)
            return True
        except Exception as exc:
            log.error("index rebuild after a failed update failed: %s", type(exc).__name__)
            self._indexes_broken = True
            self._index_error = (
                f"indexes: update after {what} failed and rebuilding them failed "
                f"({type(exc).__name__}); run rebuild_index"
            )
            self._search_ready.set()
            return False

    @staticmethod
    def _after_index_failure(ok: bool) -> None:
        if not ok:
            raise InternalError(
                "indexes: the change was stored but the indexes could not be rebuilt; "
                "run rebuild_index"
            )

    def _state(self) -> views.ReadState:
        return views.ReadState(self._store.messages, self._history, self._relations, self._budget)

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
        self._store.sync(seq)
        self._events.publish(event)

    # -- write_message -----------------------------------------------------------------------

    def write_message(
        self,
        *,
        session_id: object,
        role: object,
        content: object,
        metadata_json: object = None,
        metadata: v.MetadataPatch | None = None,
    ) -> dict[str, Any]:
        """`metadata` (already parsed) replaces `metadata_json` when given."""
        sid = v.session_id(session_id)
        role_ = v.role(role)
        text = v.content(content)
        patch = v.metadata_json(metadata_json) if metadata is None else metadata
        stored_metadata = patch.apply()
        with self._lock.write():
            self._check_open()
            self._check_relation_targets(stored_metadata.relations, (), None, "metadata_json")
            mid, ts = self._ids.next()
            msg = Message(mid, sid, ts, role_, text, 1, ts, stored_metadata)
            seq = self._store.write_put(msg)
            msg = self._store.get(mid) or msg  # the store may share its default metadata
            stored = msg
            ok = self._apply_to_indexes(lambda: self._index_add(stored), "a write")
        self._finish(seq, ChangeEvent("write", mid, sid))
        self._after_index_failure(ok)
        return {"status": "OK", "message": msg.to_json()}

    # -- update_message ----------------------------------------------------------------------

    def update_message(
        self,
        *,
        message_id: object,
        content: object = None,
        metadata_json: object = None,
        expected_revision: object = None,
        metadata: v.MetadataPatch | None = None,
    ) -> dict[str, Any]:
        """`metadata` (already parsed) replaces `metadata_json` when given."""
        mid = v.message_id(message_id)
        text = None if content is None else v.content(content)
        patch = metadata
        if patch is None and metadata_json is not None:
            patch = v.metadata_json(metadata_json)
        revision = v.expected_revision(expected_revision)
        if text is None and patch is None:
            raise ValidationError("content, metadata_json: at least one of them is required")
        with self._lock.write():
            self._check_open()
            old = self._store.get(mid)
            if old is None:
                raise NotFoundError("message_id: no live message with this id")
            if revision is not None and revision != old.revision:
                raise ConflictError(
                    "expected_revision: does not match the message's current revision"
                )
            new_metadata: Metadata = old.metadata if patch is None else patch.apply(old.metadata)
            new_text = old.content if text is None else text
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
            ok = self._apply_to_indexes(lambda: self._index_replace(old, stored), "an update")
        self._finish(seq, ChangeEvent("update", mid, new.session_id))
        self._after_index_failure(ok)
        return {"status": "OK", "changed": True, "message": new.to_json()}

    # -- read_messages -----------------------------------------------------------------------

    def read_messages(
        self,
        *,
        view: object = None,
        limit: object = None,
        cursor: object = None,
        session_id: object = None,
        message_id: object = None,
        content_offset: object = None,
        content_limit: object = None,
        expected_revision: object = None,
        before: object = None,
        after: object = None,
        relation_depth: object = None,
        relation_types_json: object = None,
        relation_types: frozenset[str] | None = None,
    ) -> dict[str, Any]:
        """Every argument given is validated (type and range) whatever the view; arguments
        another view uses are then ignored. A cursor is only valid for the view (and session)
        that returned it. `relation_types` (already parsed) replaces `relation_types_json`."""
        view_ = v.view(view)
        limit_ = v.optional_integer(
            limit,
            "limit",
            lo=limits.READ_LIMIT_MIN,
            hi=limits.READ_LIMIT_MAX,
            default=limits.READ_LIMIT_DEFAULT,
        )
        sid = None if session_id is None else v.session_id(session_id)
        mid = None if message_id is None else v.message_id(message_id)
        offset = v.optional_integer(content_offset, "content_offset", lo=0, hi=None, default=0)
        chunk = v.optional_integer(
            content_limit,
            "content_limit",
            lo=limits.CONTENT_LIMIT_MIN,
            hi=limits.CONTENT_LIMIT_MAX,
            default=limits.CONTENT_LIMIT_DEFAULT,
        )
        revision = v.expected_revision(expected_revision)
        before_ = v.optional_integer(
            before,
            "before",
            lo=0,
            hi=limits.CONTEXT_NEIGHBOURS_MAX,
            default=limits.CONTEXT_NEIGHBOURS_DEFAULT,
        )
        after_ = v.optional_integer(
            after,
            "after",
            lo=0,
            hi=limits.CONTEXT_NEIGHBOURS_MAX,
            default=limits.CONTEXT_NEIGHBOURS_DEFAULT,
        )
        depth = v.optional_integer(
            relation_depth,
            "relation_depth",
            lo=0,
            hi=limits.RELATION_DEPTH_MAX,
            default=limits.RELATION_DEPTH_DEFAULT,
        )
        types = (
            v.relation_types_json(relation_types_json) if relation_types is None else relation_types
        )
        cursor_ = None if cursor is None else v.require_str(cursor, "cursor")
        if cursor_ is not None and view_ in ("content", "context"):
            raise ValidationError(f"cursor: the {view_} view does not page")
        if view_ == "history" and sid is None:
            raise ValidationError("session_id: is required for the history view")
        if view_ in ("content", "context") and mid is None:
            raise ValidationError(f"message_id: is required for the {view_} view")
        with self._lock.read():
            self._check_open()
            state = self._state()
            if view_ == "history":
                assert sid is not None
                return views.history(state, sid, limit_, cursor_)
            if view_ == "content":
                assert mid is not None
                return views.content(state, mid, offset, chunk, revision)
            if view_ == "context":
                assert mid is not None
                return views.context(state, mid, before_, after_, depth, types)
            return views.sessions(state, limit_, cursor_)

    # -- search_messages ---------------------------------------------------------------------

    def search_messages(
        self,
        *,
        query: object,
        session_id: object = None,
        filters_json: object = None,
        min_importance: object = None,
        context_size: object = None,
        limit: object = None,
        filters: v.SearchFilters | None = None,
    ) -> dict[str, Any]:
        """`filters` (already parsed) replaces `filters_json` when given."""
        q = v.query(query)
        sid = None if session_id is None else v.session_id(session_id)
        if filters is None:
            filters = v.filters_json(filters_json)
        floor = v.optional_integer(
            min_importance,
            "min_importance",
            lo=limits.IMPORTANCE_MIN,
            hi=limits.IMPORTANCE_MAX,
            default=limits.IMPORTANCE_MIN,
        )
        ctx = v.optional_integer(
            context_size, "context_size", lo=0, hi=limits.SEARCH_CONTEXT_MAX, default=0
        )
        limit_ = v.optional_integer(
            limit,
            "limit",
            lo=limits.SEARCH_LIMIT_MIN,
            hi=limits.SEARCH_LIMIT_MAX,
            default=limits.SEARCH_LIMIT_DEFAULT,
        )

        # Session scope and importance floor go to the index as keywords (its per-session and
        # per-importance lists cut the work); only kinds/tiers/tags need a per-message test.
        accept: Callable[[Message], bool] | None = None
        if not filters.empty:
            accept = filters.accepts_message

        # No wait for a background search build: under the read lock its state cannot change
        # (the builder declares the index ready under the write lock). Until then, every live
        # message is scored directly: the same scoring, ranking and limit as the index.
        with self._lock.read():
            self._check_open()
            messages = self._store.messages
            if self._search_ready.is_set():
                if self._search_error:
                    raise InternalError(self._search_error)
                hits = self._search.search(
                    q, messages, accept=accept, limit=limit_, session_id=sid, min_importance=floor
                )
            else:
                hits = SearchIndex.scan(
                    q, messages, accept=accept, limit=limit_, session_id=sid, min_importance=floor
                )
            budget = Budget(_RESULTS_RESERVE, self._budget)
            results: list[dict[str, Any]] = []
            for hit in hits:
                msg = messages[hit.message_id]
                item = msg.to_json()
                item["score"] = hit.score
                item["score_breakdown"] = dict(hit.score_breakdown)
                item["matched_fields"] = list(hit.matched_fields)
                item["relation_count"] = len(
                    msg.metadata.relations
                ) + self._relations.incoming_count(msg.message_id)
                bound = message_bound(msg) + 256  # + score fields
                if ctx > 0:
                    before_ids, after_ids = self._history.neighbours(
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

    def delete_message(self, *, message_id: object, session_id: object = None) -> dict[str, Any]:
        mid = v.message_id(message_id)
        guard = None if session_id is None else v.session_id(session_id)
        with self._lock.write():
            self._check_open()
            msg = self._store.get(mid)
            if msg is None or (guard is not None and msg.session_id != guard):
                return {"status": "NOT_FOUND"}
            seq = self._store.write_delete(mid)
            ok = self._apply_to_indexes(lambda: self._index_remove(msg), "a delete")
        self._finish(seq, ChangeEvent("delete", mid, msg.session_id))
        self._after_index_failure(ok)
        return {"status": "OK"}

    # -- rebuild_index -----------------------------------------------------------------------

    def rebuild_index(self) -> dict[str, Any]:
        self._wait_for_search()
        with self._lock.write():
            self._check_closed()
            result = self._store.compact()
            try:
                self._build_indexes(background=False)
            except Exception as exc:
                log.error("index rebuild failed: %s", type(exc).__name__)
                self._indexes_broken = True
                self._index_error = f"indexes: rebuild failed ({type(exc).__name__})"
                self._search_ready.set()
                raise InternalError(
                    "rebuild_index: the store was compacted but the indexes could not be "
                    "rebuilt; run rebuild_index again"
                ) from None
            self._indexes_broken = False
            self._index_error = ""
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
            stats = self._store.stats()
            last_error = "; ".join(
                e for e in (stats.last_error, self._index_error, self._search_error) if e
            )
            acc = self._message_accounting()
            store_entries = (
                acc.entry_bytes
                + dict_table_bytes(acc.entries)
                + session_ids_bytes(self._history.session_ids())
            )
            # While the background build runs, its thread fills the index without a lock, so
            # the index is not read: it counts 0 until ready (docs/semantics.md).
            search_bytes = self._search.memory_bytes() if self._search_ready.is_set() else 0
            history_bytes = self._history.memory_bytes()
            relation_bytes = self._relations.memory_bytes()
            estimate = {
                "total_bytes": store_entries
                + acc.body_bytes
                + acc.metadata_bytes
                + search_bytes
                + history_bytes
                + relation_bytes,
                "store_entries_bytes": store_entries,
                "body_bytes": acc.body_bytes,
                "metadata_bytes": acc.metadata_bytes,
                "search_index_bytes": search_bytes,
                "history_index_bytes": history_bytes,
                "relation_index_bytes": relation_bytes,
            }
            return {
                "status": "DEGRADED" if last_error else "OK",
                "format_version": stats.format_version,
                "log_size": stats.log_size,
                "snapshot_size": stats.snapshot_size,
                "active_messages": len(self._store.messages),
                "session_count": self._history.session_count(),
                "deleted_messages": stats.deleted_messages,
                "last_sequence": stats.last_sequence,
                "update_records": stats.update_records,
                "dead_bytes": stats.dead_bytes,
                "memory_estimate": estimate,
                "io": stats.io.to_json(),
                "recovered_tail": stats.recovered_tail,
                "snapshot_valid": stats.snapshot_valid,
                "last_error": last_error,
            }

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
                            self._index_add(m)

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
        self._wait_for_search()
        with self._lock.read():
            problems = list(self._store.check())
            problems.extend(self._search.check(self._store.messages))
            messages = list(self._store.messages.values())
            fresh_history = HistoryIndex()
            fresh_history.build(messages)
            for sid in {m.session_id for m in messages}:
                a = self._history.session(sid)
                b = fresh_history.session(sid)
                if a is None or b is None or a.ids != b.ids or a.kind_counts != b.kind_counts:
                    problems.append("history index: session differs from a fresh build")
                    break
            if self._history.session_count() != fresh_history.session_count():
                problems.append("history index: session count differs from a fresh build")
            fresh_relations = RelationIndex()
            fresh_relations.build(messages)
            if not fresh_relations.same_as(self._relations):
                problems.append("relation index: differs from a fresh build")
            if self._accounting is not None:
                fresh_accounting = MessageAccounting()
                for msg in messages:
                    fresh_accounting.add(msg)
                if fresh_accounting != self._accounting:
                    problems.append("memory accounting: differs from a fresh count")
            return problems
