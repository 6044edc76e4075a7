"""The search index kept on disk (`search.idx`): loaded at open instead of rebuilt, written at
close. See docs/storage-format.md ("search.idx") and docs/search.md.

At open, `PersistedSearch.capture` (with the service's lock held, like the rest of the index
build) takes the store's log-tail changes since the snapshot it loaded; `load` (on the builder
thread) then decodes the file the store hands out for that snapshot, checks it completely
(CRC-32, every id a message of that state, the count) and applies the tail's changes, giving
the index of the messages live at open. Whatever goes wrong (no file, another state's file, a
damaged one, a foreign format, an I/O error) gives None and removes the file: the caller
builds the index from the messages as before. A wrong file never reaches a search.

At close, `save` writes the index with the store's snapshot (the store writes that first when
the log moved on), unless the file on disk is already the one for that snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final

from convmem_engine.domain.message import Message
from convmem_engine.index import search_file
from convmem_engine.index.search_index import SearchIndex
from convmem_engine.storage.derived import DerivedError
from convmem_engine.storage.store import Store

log = logging.getLogger(__name__)

FILE_NAME: Final = "search.idx"


class PersistedSearch:
    """The open-time state needed to load `search.idx` later, off the lock."""

    def __init__(
        self,
        store: Store,
        messages: Mapping[str, Message],
        changes: dict[str, tuple[Message | None, Message | None]],
        snapshot_count: int,
    ) -> None:
        self._store = store
        self._messages = messages
        # The ids live at open in the store's order: the index's documents are mostly in the
        # same order, so a window of its id table is usually one slice of this list.
        self._order = list(messages)
        self._changes = changes
        self._snapshot_count = snapshot_count

    @classmethod
    def capture(cls, store: Store, messages: Mapping[str, Message]) -> PersistedSearch | None:
        """Call once, right after open, with the store's live messages (lock held). None when
        the store loaded no snapshot (no file can match: it is removed)."""
        changes = store.take_open_changes()
        if changes is None:
            store.discard_derived(FILE_NAME)
            return None
        pairs = {mid: (old, messages.get(mid)) for mid, old in changes.items()}
        count = len(messages)
        for old, new in pairs.values():
            count += (old is not None) - (new is not None)
        return cls(store, messages, pairs, count)

    def load(self) -> SearchIndex | None:
        """The index of the messages live at open, from the file; None (file removed) when
        it cannot be used. Never raises for a bad file."""
        store = self._store
        order = self._order
        self._order = []  # only this call holds it (it goes once the ids are resolved)
        reader = store.open_derived(FILE_NAME, search_file.FORMAT)
        if reader is None:
            return None
        changes = self._changes
        messages = self._messages
        at = 0

        def one(raw: str) -> str | None:
            if not raw:
                return None
            pair = changes.get(raw)
            msg = pair[0] if pair is not None else messages.get(raw)
            if msg is not None:
                return msg.message_id
            if pair is None:
                # Untouched by the tail but gone now: deleted after open (that removal is
                # queued for the index); the id as read is just as good.
                return raw
            raise ValueError("the index names a message that was not live at its snapshot")

        def resolve(raws: list[str]) -> list[str | None]:
            nonlocal at
            n = len(raws)
            window = order[at : at + n]
            if window == raws:  # the common case, compared in C
                at += n
                return window  # type: ignore[return-value]
            out: list[str | None] = []
            for raw in raws:
                if at < len(order) and order[at] == raw:
                    out.append(order[at])
                    at += 1
                else:
                    out.append(one(raw))
            return out

        def ids_done() -> None:
            # Resolved: the list goes before the posting lists are read (the load's peak).
            nonlocal order
            order = []

        try:
            index = search_file.decode(reader.read, resolve, ids_done)
            reader.finish()
            if len(index) != self._snapshot_count:
                raise ValueError("the index does not hold the snapshot's messages")
            for old, new in changes.values():
                if old is None:
                    if new is not None:
                        index.add(new)
                elif new is None:
                    index.remove(old)
                elif new is not old:
                    index.replace(old, new)
        except Exception as e:  # any failure: this file is not usable, rebuild
            log.warning("%s: not used (%s); rebuilding the search index", FILE_NAME, _reason(e))
            store.close_derived(reader)
            store.discard_derived(FILE_NAME)
            return None
        store.close_derived(reader)
        self._changes = {}
        return index


def _reason(e: Exception) -> str:
    """Why a file was not used, for the log: the type, and the text of the checks' own errors
    (fixed sentences, never content; other exceptions' text may quote the bytes read)."""
    if type(e) in (ValueError, DerivedError):
        return f"{type(e).__name__}: {e}"
    return type(e).__name__


def save(store: Store, index: SearchIndex) -> bool:
    """Write `index` (which must hold exactly the store's live messages; the caller's lock
    keeps both still) as `search.idx` with the store's snapshot. True when written; False when
    the file was already current or could not be written (logged; the next open rebuilds)."""
    try:
        return store.write_derived(
            FILE_NAME, search_file.FORMAT, lambda: search_file.encode(index), keep_current=True
        )
    except Exception as e:  # never fail a close over an optimisation
        log.warning("%s: not written (%s)", FILE_NAME, type(e).__name__)
        return False
