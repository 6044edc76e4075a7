"""The service's derived state: the history, relation and search indexes, kept in step with
the store's live messages, and the background search build. (The memory the messages take is
counted by the store itself: `StoreStats.memory`.)

The store is the truth; everything here can be rebuilt from its live messages. Locking is the
owner's (MemoryService's readers/writer lock, given here for the background builder):
`build`, `add`, `remove`, `replace` and `apply` need it held for writing, the readers
(`search`, `search_index_bytes`, the properties) for reading; `flush` either. The search
index itself is guarded by `_search_lock` besides (taken here, inside the service's lock, never
the other way round).

Search-index changes leave the write path: `add`, `remove` and `replace` update the history
and relation indexes at once but only queue the search index's change (`_search_pending`).
A search reads the index as it is plus the queued messages themselves (`search`: the index's
hits without the queued ids, merged with a scan of their queued versions: the same results as
after applying the queue), so a search finds every write acknowledged before it without
paying for the queue. The queue is applied in order (runs of adds as one
`SearchIndex.add_many` batch) by a background thread `flush_delay` seconds after a first
change is queued (at once from `flush_bound` changes), before the other reads of the search
index (`search_index_bytes`, `persistable`, the service's health and check: `flush`), and by a
writer at `FLUSH_LIMIT`. The background flush holds only `_search_lock` (the index's own
readers/writer lock, which searches share), never the service's lock: a write never waits for
it; and it lets go of the GIL every FLUSH_SLICE seconds of work (`_pauser`), so a write
arriving meanwhile waits about that long, not for the whole batch. docs/semantics.md,
"Concurrency and events", says why this is safe.

Background search build: a store of at least `background_search_from` messages gets its
search index built on a thread; until it is ready, `search` scores the live messages directly
(`SearchIndex.scan`: the same results), changes are queued and applied when the build is done,
and `memory_bytes` counts the search index as 0.

Failure bookkeeping (health DEGRADED): when an update of the indexes fails after its change
was stored, `apply` rebuilds them from the store and keeps the failure as `error` until the
next successful `rebuild`; when that rebuild fails too, the indexes are `broken` (the service
refuses every operation but health and rebuild_index).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Final, Literal, cast

from convmem_engine.domain.errors import InternalError
from convmem_engine.domain.message import Message
from convmem_engine.index.heap import release_free_memory
from convmem_engine.index.history_index import HistoryIndex
from convmem_engine.index.relation_index import RelationIndex
from convmem_engine.index.search_index import SearchHit, SearchIndex
from convmem_engine.service.rwlock import RWLock
from convmem_engine.storage.packed import MessagesView

BACKGROUND_SEARCH_FROM: Final = 20_000
"""Stores with at least this many live messages build their search index in the background."""
BATCH_FROM: Final = 20_000
"""Indexes of at least this many messages take a long run of queued adds (BATCH_CHARS) as one
`add_many` batch; smaller ones add them one by one (there grouping a batch's grams costs more
than it saves: docs/benchmarks.md, "Search-index updates off the write path")."""
BATCH_CHARS: Final = 3_000
"""A run of queued adds goes to `add_many` (in an index of BATCH_FROM messages or more) only
when its messages' contents total at least this many characters; a shorter run is added one
by one. Grouping pays per (gram, message) pair, and only once the batch's messages share
enough grams: at 1M messages, `add` one by one against `add_many`, microseconds per message
(medians): 49-character chat lines 66 vs 123 (4 a batch), 85 vs 119 (16), 90 vs 91 (64), 86
vs 73 (256); 210-character texts 328 vs 458 (4), 358 vs 374 (16), 308 vs 262 (64), 320 vs 227
(128). Both cross near 3,000 characters a run (docs/benchmarks.md, "Write p50 from empty to
1M"). The background flush's batches while one host writes are ~5-15 messages."""
FLUSH_DELAY: Final = 0.010
"""Seconds a queued search-index change waits for the background flush (more changes join it
meanwhile: one batch). docs/benchmarks.md, "Search-index updates off the write path"."""
FLUSH_BOUND: Final = 64
"""Queued changes that start the background flush at once."""
FLUSH_HOLD: Final = 0.005
"""Seconds of CPU the background flush aims at per batch (per hold of `_search_lock`: a
search waits for one batch at most; writes never wait for it): its batch is sized from the
CPU time the last one took per change, between FLUSH_CHUNK_MIN and FLUSH_CHUNK_MAX changes;
FLUSH_CHUNK_MAX while more than `flush_bound` are queued (the flush is behind: bigger batches
cost less per change, measured at 258k: 740, 460 and 320 us per add in batches of 4, 16 and
64, docs/benchmarks.md, "The background flush and write p99")."""
FLUSH_CHUNK_MIN: Final = 4
FLUSH_CHUNK_MAX: Final = 64
FLUSH_LIMIT: Final = 4096
"""Queued changes at which the writer applies them itself (while the background flush cannot
keep up): the queue's memory stays bounded."""
FLUSH_SLICE: Final = 0.0002
"""Seconds of work the background flush does between two yields of the GIL (`_pauser`): a
thread that wants it meanwhile waits about this long, instead of the whole batch or the
interpreter's 5 ms switch interval. docs/benchmarks.md, "The background flush and write p99"."""
FLUSH_YIELD: Final = 0.0
"""Seconds the background flush sleeps at each yield: 0 is enough (measured): the sleep's
system call lets the thread waiting for the GIL take it, and costs nothing when none does.
(A GIL release without a system call, e.g. a C call that drops it, is not: the flush takes it
back before the waiter runs, and the waiter waits again, up to 5 ms or more.)"""

log = logging.getLogger(__name__)

Op = Literal["add", "remove", "replace"]


def _freeze_heap() -> None:
    """Move every object alive now (the store and the indexes: millions of long-lived, acyclic
    objects) out of the cyclic collector's scans. Without this each full collection walks them
    all while holding the GIL, a pause of hundreds of milliseconds on whichever thread
    allocates. Refcounting still frees them when dropped (e.g. the old indexes after a
    rebuild). A constant-time list splice. Done for large stores only (where the pauses are)."""
    gc.freeze()


Change = tuple[Op, Message, Message | None]
_WHAT: Final[dict[Op, str]] = {"add": "a write", "remove": "a delete", "replace": "an update"}


def _rebuilt_after(what: str, exc: Exception) -> str:
    """The kept failure (health DEGRADED) when an index update after `what` failed and the
    index was rebuilt from the store."""
    return f"indexes: update after {what} failed ({type(exc).__name__}); rebuilt from the store"


def _not_rebuilt_after(what: str, exc: Exception) -> str:
    """The kept failure when the rebuild after a failed update failed too (`exc`): broken."""
    return (
        f"indexes: update after {what} failed and rebuilding them failed "
        f"({type(exc).__name__}); run rebuild_index"
    )


def _pauser() -> Callable[[], None]:
    """The background flush's `pause`: once FLUSH_SLICE seconds have passed since the last
    one, sleep FLUSH_YIELD seconds: a thread waiting for the GIL (a write arriving, its fsync
    returning) takes it there."""
    clock = time.perf_counter
    due = clock() + FLUSH_SLICE

    def pause() -> None:
        nonlocal due
        if clock() >= due:
            time.sleep(FLUSH_YIELD)
            due = clock() + FLUSH_SLICE

    return pause


def _latest(changes: list[Change]) -> dict[str, Message | None]:
    """Each message id the queued `changes` touch, with its value after them (None: removed)."""
    latest: dict[str, Message | None] = {}
    for op, msg, new in changes:
        if op == "add":
            latest[msg.message_id] = msg
        elif op == "remove":
            latest[msg.message_id] = None
        else:
            assert new is not None
            latest[msg.message_id] = None
            latest[new.message_id] = new
    return latest


def _merged(
    hits: list[SearchHit],
    messages: Mapping[str, Message],
    extra: list[SearchHit],
    queued: Mapping[str, Message],
    limit: int,
) -> list[SearchHit]:
    """The best `limit` of two hit lists over disjoint messages (`hits` of `messages`, `extra`
    of `queued`), under the index's key: score, importance, timestamp, message_id, all desc."""
    keyed: list[tuple[tuple[float, int, int, str], SearchHit]] = []
    for source, values in ((hits, messages), (extra, queued)):
        for hit in source:
            msg = values[hit.message_id]
            key = (hit.score, msg.metadata.importance, msg.timestamp, hit.message_id)
            keyed.append((key, hit))
    keyed.sort(key=lambda kh: kh[0], reverse=True)
    return [hit for _, hit in keyed[:limit]]


def _run_chars(changes: list[Change], i: int, j: int, enough: int) -> int:
    """The characters of the contents of the adds `changes[i:j]`, counted up to `enough`."""
    total = 0
    for k in range(i, j):
        total += len(changes[k][1].content)
        if total >= enough:
            break
    return total


def _apply_search_changes(
    index: SearchIndex,
    changes: list[Change],
    batch_from: int = BATCH_FROM,
    pause: Callable[[], None] | None = None,
    batch_chars: int = BATCH_CHARS,
) -> None:
    """Apply `changes` ("add", "remove" or "replace" `msg` by `new`) to a search index, in
    order: each run of adds of at least `batch_chars` characters as one batch
    (`SearchIndex.add_many`) once the index holds `batch_from` messages (one by one
    otherwise: see BATCH_FROM and BATCH_CHARS), the others one by one.
    `pause` (the background flush's, `_pauser`) is called between changes, within a batch
    and within a long message's add."""
    i = 0
    n = len(changes)
    while i < n:
        op, msg, new = changes[i]
        if op == "add":
            j = i + 1
            while j < n and changes[j][0] == "add":
                j += 1
            if j - i == 1:
                index.add(msg, pause)
            elif len(index) < batch_from or _run_chars(changes, i, j, batch_chars) < batch_chars:
                for change in changes[i:j]:
                    index.add(change[1], pause)
                    if pause is not None:
                        pause()
            else:
                index.add_many([c[1] for c in changes[i:j]], pause)
            i = j
        else:
            if op == "remove":
                index.remove(msg)
            else:
                assert new is not None
                index.replace(msg, new)
            i += 1
        if pause is not None:
            pause()


def _snapshot_of(
    messages: Mapping[str, Message],
) -> tuple[list[str | None] | None, Iterator[Message]]:
    """The messages live now, for a build that runs while they change: the store's lazy
    snapshot (16 bytes per message; each Message is built when the build reaches it, and
    the snapshot's values go as it passes them) and its list of their ids (the index keeps
    it as its id table); (None, the messages) for another mapping."""
    if isinstance(messages, MessagesView):
        keys, values = messages.frozen().take()
        return cast("list[str | None]", keys), values
    return None, iter(list(messages.values()))


def _build_history_and_relations(
    history: HistoryIndex, relations: RelationIndex, messages: Mapping[str, Message]
) -> None:
    """From the store's packed messages without building a Message per message: the history
    index needs only the id, session and metadata, the relation index only the messages
    whose metadata is not the default (the others have no relations)."""
    if isinstance(messages, MessagesView):
        columns = messages.history_columns()
        if columns is not None:  # no message has metadata: grouped at C speed
            history.build_columns(*columns)
        else:
            history.build_rows(messages.history_rows())
        relations.build(messages.with_metadata())
    else:
        history.build(messages.values())
        relations.build(messages.values())


class IndexSet:
    def __init__(
        self,
        lock: RWLock,
        *,
        background_search_from: int = BACKGROUND_SEARCH_FROM,
        search_index_factory: Callable[[], SearchIndex] = SearchIndex,
        search_gate: threading.Event | None = None,
        live: Callable[[], Mapping[str, Message]] | None = None,
        flush_delay: float = FLUSH_DELAY,
        flush_bound: int = FLUSH_BOUND,
    ) -> None:
        """Empty indexes; `build` fills them. `search_index_factory` makes each new, empty
        search index (a seam for tests: a subclass can inject a failure). With `search_gate`
        a background search build starts only once the event is set (`wait_for_search` and
        `stop` set it). `live()` gives the store's live messages (the search index is rebuilt
        from them when applying queued changes fails). `flush_delay` (seconds) and
        `flush_bound` (changes): when the background flush applies the queued changes."""
        self._lock = lock
        self._live = live
        self._flush_delay = flush_delay
        self._flush_bound = flush_bound
        # The search-index changes not applied yet, in order. Appended to by writers (the
        # service's write lock held); taken off the front only once applied, holding
        # `_search_lock` for writing (the background flush: that lock alone).
        self._search_pending: list[Change] = []
        # Guards the search index's contents and the queue's front: searches read (the index
        # and the queue as one state), applying, replacing or rebuilding the index writes.
        self._search_lock = RWLock()
        # A background batch that failed part-way (the index may hold part of it): what it was
        # and why; the next `flush` (holding the service's lock) rebuilds the index.
        self._search_stale: tuple[str, Exception] | None = None
        # `flush` calls under way (the background flush leaves the rest to them: one batch).
        self._draining = 0
        self._draining_lock = threading.Lock()
        self._flush_kick = threading.Event()  # a first change is queued
        self._flush_full = threading.Event()  # flush_bound changes are queued
        self._flusher: threading.Thread | None = None
        self._stopping = False
        self._search_gate = search_gate
        self.history = HistoryIndex()
        self.relations = RelationIndex()
        self._new_search_index = search_index_factory
        self.search_index = search_index_factory()
        self._search_ready = threading.Event()
        self._search_error = ""
        self._search_thread: threading.Thread | None = None
        self._search_cancel = False
        self._background_search_from = background_search_from
        self._index_error = ""
        self._broken = False

    # -- building ----------------------------------------------------------------------------

    def build(
        self,
        messages: Mapping[str, Message],
        *,
        background: bool,
        saved: Callable[[], SearchIndex | None] | None = None,
    ) -> None:
        """Build every index from the live messages (write lock held, or not yet shared).
        `saved` (at open): loads the search index of exactly these messages from disk, or
        gives None (then it is built by adding them; see search_persist.py)."""
        _build_history_and_relations(self.history, self.relations, messages)
        with self._search_lock.write():
            self._build_search_index(messages, background=background, saved=saved)

    def _build_search_index(
        self,
        messages: Mapping[str, Message],
        *,
        background: bool,
        saved: Callable[[], SearchIndex | None] | None,
    ) -> None:
        """`build`'s search part, holding `_search_lock` for writing."""
        self.search_index = self._new_search_index()
        self._search_error = ""
        self._search_stale = None
        self._search_pending = []  # every change queued so far is in `messages`
        if background and len(messages) >= self._background_search_from:
            self._search_ready.clear()
            self._search_thread = threading.Thread(
                target=self._build_search,
                args=(self.search_index, messages, saved),
                name="convmem-search-build",
                daemon=True,
            )
            self._search_thread.start()
        else:
            loaded = saved() if saved is not None else None
            if loaded is not None:
                self.search_index = loaded
            else:
                self.search_index.build(messages.values())
            self._search_ready.set()
            if len(messages) >= BACKGROUND_SEARCH_FROM:
                _freeze_heap()

    def _build_search(
        self,
        index: SearchIndex,
        live: Mapping[str, Message],
        saved: Callable[[], SearchIndex | None] | None = None,
    ) -> None:
        """Background thread: load (`saved`) the index of the messages live at open, or index
        the messages `live` now, then (holding the write lock) the changes queued since, and
        declare the index ready. For a build, the snapshot of the messages (16 bytes each) is
        taken with the write lock held, and the changes queued until then are dropped (they
        are in it); it is only taken when needed (not when a file loads). Its id list becomes
        the index's id table, and its values go part by part as the build reads them.

        `stop` (at close) cuts an index build short: that index is incomplete, so it is marked
        failed (`_search_error`), never searched and never kept on disk (`persistable`). An
        index that is complete (loaded, or built before the stop) gets the queued changes even
        after a stop: they are few, and only with them is it the index of the store's state."""
        error = ""
        loaded: SearchIndex | None = None
        if self._search_gate is not None:
            self._search_gate.wait()
        try:
            if self._search_cancel:  # closed before the gate opened: nothing loaded or built
                error = "search index: build stopped at close"
            else:
                loaded = saved() if saved is not None else None
            if not error and loaded is None:
                # (the snapshot leaves the store's pending blocks as they are: taken under the
                # lock in milliseconds, and ~30 MiB less at a million: `MessageTable.frozen`)
                with self._lock.write(), self._search_lock.write():
                    if index is not self.search_index:
                        return  # replaced meanwhile (see below)
                    ids, source = _snapshot_of(live)  # only the iterator holds the snapshot
                    self._search_pending = []
                if not index.build(source, cancelled=lambda: self._search_cancel, ids=ids):
                    error = "search index: build stopped at close"
                del source, ids
        except Exception as e:  # reported by search; rebuild_index recovers
            log.exception("search index build failed")
            error = f"search index: build failed ({type(e).__name__})"
        with self._lock.write(), self._search_lock.write():
            if index is not self.search_index:
                # Replaced meanwhile (the indexes were rebuilt after a failed update): the
                # new index is complete and ready; this one is dropped.
                return
            if loaded is not None:
                index = self.search_index = loaded
            pending = self._search_pending
            self._search_pending = []
            if not error:
                try:
                    _apply_search_changes(index, pending)
                except Exception as e:  # never leave searches waiting for a ready index
                    log.error("search index: applying queued changes failed: %s", type(e).__name__)
                    error = f"search index: build failed ({type(e).__name__})"
            self._search_error = error
            self._search_ready.set()
        if len(live) >= BACKGROUND_SEARCH_FROM:
            _freeze_heap()
        release_free_memory()  # what the load or build freed (index/heap.py)

    def wait_for_search(self, timeout: float | None = None) -> bool:
        """Wait until the search index is built (at once when it is not building); True when
        it is. Call without holding the lock (the builder needs it to finish). A gated build
        starts now."""
        if self._search_gate is not None:
            self._search_gate.set()
        return self._search_ready.wait(timeout)

    def stop(self) -> None:
        """Stop a background build and the background flush, and wait for their threads
        (without holding the lock). Changes still queued stay queued (`flush`)."""
        self._search_cancel = True
        self._stopping = True
        if self._search_gate is not None:
            self._search_gate.set()
        self._flush_kick.set()
        self._flush_full.set()
        for thread in (self._search_thread, self._flusher):
            if thread is not None:
                thread.join()

    # -- changes (write lock held) -----------------------------------------------------------

    def _search_apply(self, op: Op, msg: Message, new: Message | None = None) -> None:
        """Queue a search-index change (applied by `flush`: before the next read of the search
        index, or by the background flush, whichever comes first)."""
        pending = self._search_pending
        pending.append((op, msg, new))
        n = len(pending)
        if n == 1:
            if self._flusher is None and not self._stopping:
                self._flusher = threading.Thread(
                    target=self._flush_loop, name="convmem-search-flush", daemon=True
                )
                self._flusher.start()
            self._flush_kick.set()
        elif n == self._flush_bound:
            self._flush_full.set()
        elif n >= FLUSH_LIMIT:
            self.flush()

    def add(self, msg: Message) -> None:
        self.history.add(msg)
        self.relations.add(msg)
        self._search_apply("add", msg)

    def remove(self, msg: Message) -> None:
        self.history.remove(msg)
        self.relations.remove(msg)
        self._search_apply("remove", msg)

    def replace(self, old: Message, new: Message) -> None:
        self.history.replace(old, new)
        self.relations.replace(old, new)
        self._search_apply("replace", old, new)

    def apply(self, change: Callable[[], None], what: str, messages: Mapping[str, Message]) -> bool:
        """Apply a change just stored (`what`, e.g. "a write") to the indexes.

        If the update fails (e.g. MemoryError) the indexes may hold half the change, so they
        are rebuilt from `messages` (the store's live messages) and the failure is kept as
        `error` (health DEGRADED) until `rebuild` succeeds. The change itself is durable and
        visible, so the caller's request still succeeds. If the rebuild fails too, the indexes
        are `broken` and this returns False: the caller raises INTERNAL_ERROR once its change
        is durable."""
        try:
            change()
            return True
        except Exception as exc:
            log.error("index update after %s failed: %s", what, type(exc).__name__)
            self._index_error = _rebuilt_after(what, exc)
        try:
            self.build(messages, background=False)
            return True
        except Exception as exc:
            log.error("index rebuild after a failed update failed: %s", type(exc).__name__)
            self._broken = True
            self._index_error = _not_rebuilt_after(what, exc)
            self._search_ready.set()
            return False

    def rebuild(self, messages: Mapping[str, Message]) -> None:
        """rebuild_index: a fresh build that clears a kept failure; raises INTERNAL_ERROR (and
        marks the indexes broken) when it fails."""
        try:
            self.build(messages, background=False)
        except Exception as exc:
            log.error("index rebuild failed: %s", type(exc).__name__)
            self._broken = True
            self._index_error = f"indexes: rebuild failed ({type(exc).__name__})"
            self._search_ready.set()
            raise InternalError(
                "rebuild_index: the store was compacted but the indexes could not be "
                "rebuilt; run rebuild_index again"
            ) from None
        self._broken = False
        self._index_error = ""

    # -- applying the queued search-index changes ---------------------------------------------

    def flush(self) -> None:
        """Apply every queued search-index change to the search index, once it is ready (a
        background build applies them itself). The caller holds the service's lock, in either
        mode (no writer queues meanwhile, and the live messages stay as they are for a
        rebuild); this takes `_search_lock` for writing, after any background batch.

        A failure (e.g. MemoryError), here or in a background batch, may leave the index
        holding part of the batch: it is rebuilt from the store's live messages, and the
        failure kept as `error` (health DEGRADED) until `rebuild`; when that rebuild fails too
        the indexes are `broken`, as when an inline update failed (`apply`)."""
        if not self._search_ready.is_set():
            return
        if not self._search_pending and self._search_stale is None:
            return
        with self._draining_lock:
            self._draining += 1
        try:
            self._flush_all()
        finally:
            with self._draining_lock:
                self._draining -= 1

    def _flush_all(self) -> None:
        """`flush`'s work, once its caller is counted in `_draining`."""
        with self._search_lock.write():
            if not self._search_ready.is_set():
                return
            pending = self._search_pending
            if self._search_stale is not None:  # a background batch failed part-way
                what, exc = self._search_stale
                self._rebuild_search_after(what, exc)
                return
            if not pending:
                return
            if self._search_error or self._broken:  # an unusable index: rebuild_index
                del pending[:]  # builds it from the store
                return
            try:
                _apply_search_changes(self.search_index, pending)
            except Exception as exc:
                self._rebuild_search_after(_WHAT[pending[0][0]], exc)
                return
            del pending[:]

    def _rebuild_search_after(self, what: str, exc: Exception) -> None:
        """Applying queued changes failed: a fresh search index of the live messages (the
        history and relation indexes are updated inline: they are not affected). Holding the
        service's lock and `_search_lock` for writing."""
        log.error("index update after %s failed: %s", what, type(exc).__name__)
        try:
            if self._live is None:
                raise exc
            messages = self._live()
            index = self._new_search_index()
            index.build(messages.values())
            self.search_index = index
            self._index_error = _rebuilt_after(what, exc)
        except Exception as again:
            log.error("index rebuild after a failed update failed: %s", type(again).__name__)
            self._broken = True
            self._index_error = _not_rebuilt_after(what, again)
        self._search_stale = None
        del self._search_pending[:]  # in the live messages

    def _flush_batch(self, size: int) -> tuple[int, float]:
        """The background flush's step: apply the first `size` queued changes, holding
        `_search_lock` for writing (and not the service's lock: writers keep queueing
        meanwhile, at the end of the queue). Returns how many it applied and the seconds it
        took; (0, 0.0) when there is nothing it can apply (`flush` deals with the rest)."""
        with self._search_lock.write():
            pending = self._search_pending
            if (
                not pending
                or not self._search_ready.is_set()
                or self._search_stale is not None
                or self._search_error
                or self._broken
            ):
                return 0, 0.0
            batch = pending[:size]
            started = time.thread_time()
            try:
                _apply_search_changes(self.search_index, batch, pause=_pauser())
            except Exception as exc:  # the index may hold part of it: `flush` rebuilds it
                self._search_stale = (_WHAT[batch[0][0]], exc)
                return 0, 0.0
            del pending[: len(batch)]
            return len(batch), time.thread_time() - started

    def _flush_loop(self) -> None:
        """The background flush: once a change is queued, wait `flush_delay` seconds (or until
        `flush_bound` are queued), then apply the queue a batch at a time (sized from the last
        batch's CPU time per change to take about FLUSH_HOLD seconds), letting go of the GIL
        every FLUSH_SLICE seconds within a batch (`_pauser`): a write arriving meanwhile gets
        it within about that time, and never waits for the batch (the service's lock is not
        held). What it cannot apply (a failed batch to rebuild, an unusable index) is left to
        `flush`, called here under the service's read lock."""
        chunk = FLUSH_CHUNK_MIN
        while True:
            self._flush_kick.wait()
            if self._stopping:
                return
            self._flush_full.wait(self._flush_delay)
            if self._stopping:
                return
            self._flush_kick.clear()
            self._flush_full.clear()
            try:
                while self._search_pending and self._search_ready.is_set():
                    if self._stopping:
                        return
                    if self._draining:  # a `flush` applies the rest, as one batch
                        self._flush_kick.set()  # (look again after the delay)
                        break
                    behind = len(self._search_pending) > self._flush_bound
                    n, spent = self._flush_batch(FLUSH_CHUNK_MAX if behind else chunk)
                    if not n:
                        with self._lock.read():
                            self.flush()
                        break
                    if spent > 0 and not behind:
                        chunk = int(FLUSH_HOLD * n / spent)
                        chunk = max(FLUSH_CHUNK_MIN, min(FLUSH_CHUNK_MAX, chunk))
            except Exception:  # never expected (flush keeps its failures); keep flushing
                log.exception("search index: background flush failed")

    # -- reads (read lock held) --------------------------------------------------------------

    @property
    def broken(self) -> bool:
        """The indexes could not be rebuilt after a failed update: not usable."""
        return self._broken

    @property
    def errors(self) -> tuple[str, ...]:
        """The failures health reports (index update, background search build), if any."""
        return tuple(e for e in (self._index_error, self._search_error) if e)

    @property
    def search_ready(self) -> bool:
        return self._search_ready.is_set()

    def persistable(self) -> SearchIndex | None:
        """The search index when it is complete and in step with the store (ready, no failure
        reported, built by SearchIndex itself), to be kept on disk; else None. Applies the
        queued changes first (`flush`)."""
        self.flush()
        index = self.search_index
        if (
            self.search_ready
            and not self.errors
            and not self._broken
            and type(index) is SearchIndex
        ):
            return index
        return None

    def search(
        self,
        query: str,
        messages: Mapping[str, Message],
        *,
        accept: Callable[[Message], bool] | None,
        limit: int,
        session_id: str | None,
        min_importance: int,
    ) -> list[SearchHit]:
        """Ranked hits. No wait for a background build: under the read lock its state cannot
        change (the builder declares the index ready under the write lock). Until then every
        live message is scored directly: the same scoring, ranking and limit as the index.

        The queued changes are not applied (that is the background flush's work): the index
        is searched without the messages they touch, their queued values are scored directly
        (`SearchIndex.scan`), and the two are merged under the index's key: exactly the hits
        of the index with the queue applied (a search finds every write acknowledged before
        it), for the cost of scoring the queued messages."""
        while True:
            with self._search_lock.read():
                if self._search_stale is None:
                    return self._search(
                        query,
                        messages,
                        accept=accept,
                        limit=limit,
                        session_id=session_id,
                        min_importance=min_importance,
                    )
            self.flush()  # a background batch failed part-way: rebuild the index first

    def _search(
        self,
        query: str,
        messages: Mapping[str, Message],
        *,
        accept: Callable[[Message], bool] | None,
        limit: int,
        session_id: str | None,
        min_importance: int,
    ) -> list[SearchHit]:
        """`search`, holding `_search_lock` for reading (the index and the queue hold still)."""
        if self._broken:
            raise InternalError(
                "indexes: could not be rebuilt after a failed update; run rebuild_index"
            )
        if not self._search_ready.is_set():
            return SearchIndex.scan(
                query,
                messages,
                accept=accept,
                limit=limit,
                session_id=session_id,
                min_importance=min_importance,
                # (the store's pending blocks stay pending: ~30 MiB at a million messages)
                values=messages.values_passing() if isinstance(messages, MessagesView) else None,
            )
        if self._search_error:
            raise InternalError(self._search_error)
        index = self.search_index
        if not self._search_pending:
            return index.search(
                query,
                messages,
                accept=accept,
                limit=limit,
                session_id=session_id,
                min_importance=min_importance,
            )
        latest = _latest(self._search_pending)

        def indexed(msg: Message) -> bool:  # as indexed: no queued change touches it
            return msg.message_id not in latest and (accept is None or accept(msg))

        hits = index.search(
            query,
            messages,
            accept=indexed,
            limit=limit,
            session_id=session_id,
            min_importance=min_importance,
        )
        queued = {mid: msg for mid, msg in latest.items() if msg is not None}
        if not queued:
            return hits
        extra = SearchIndex.scan(
            query,
            queued,
            accept=accept,
            limit=limit,
            session_id=session_id,
            min_importance=min_importance,
        )
        if not extra:
            return hits
        return _merged(hits, messages, extra, queued, limit)

    def search_index_bytes(self, *, walk: bool = False) -> int:
        """While the background build runs, its thread fills the index without a lock, so the
        index is not read: it counts 0 until ready (docs/semantics.md). Applies the queued
        changes first (`flush`): the figure is the index's with every acknowledged write.
        The index's kept byte count, or with `walk` a walk of its objects (the reference)."""
        self.flush()
        if not self._search_ready.is_set():
            return 0
        with self._search_lock.read():
            index = self.search_index
            return index.memory_bytes_fresh() if walk else index.memory_bytes()
