"""Message id -> document number for the search index, without an object per document.

A `dict[str, int]` of a million ids cost ~59 MiB (the dict's table, 29 MiB, and an int object
per document number above 256, 30 MiB) and 0.35 s to build at every load. Message ids are
ULIDs the service makes strictly increasing (also across restarts: docs/semantics.md), and
documents are numbered in the order messages were indexed, which is the store's creation
order: so the ids, in document order, are almost always ascending already. This table keeps

    keys    one str per document (8 bytes: the store's own strings, shared), ascending: the
            document's id, or for a document whose id does not sort after every earlier one
            (or that is a hole), a copy of the key before it. While every document is live
            and in order this is `ids` itself (no copy until the first removal)
    extra   a dict for those out-of-order documents only (e.g. messages imported with ids
            from another store)

and finds an id with `extra`, then a bisection of `keys` confirmed against the index's
document -> id list `ids` (None for a removed document): equal keys only follow the document
that holds the key, so the bisection lands on it. A removed document keeps its key (so `keys`
stays sorted) but its `ids` entry is None, so it is never found again; that string is
released when the table is next built (load or build). Building it at load is two passes in C
when the ids are ascending (the usual case; ~0.08 s at a million), plus a running maximum
when they are not.

Not thread-safe for mutation (the index's lock covers it).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from itertools import accumulate, chain, compress, islice
from operator import ge, lt

__all__ = ["DocTable"]


class DocTable:
    """The live documents of `ids` (document -> message id, None for a removed one) by id."""

    __slots__ = ("_extra", "_ids", "_keys", "_live")

    def __init__(self, ids: list[str | None]) -> None:
        """The table of every live document of `ids` (the list is kept, not copied: the
        owner appends to it, and `pop` sets a removed document's entry to None). ValueError
        for an id that appears twice."""
        self._ids = ids
        self._extra: dict[str, int] = {}
        holes = ids.count(None)
        self._live = len(ids) - holes
        if not holes and all(map(lt, ids, islice(ids, 1, None))):  # type: ignore[arg-type]
            # The keys are the ids themselves: one list for both until a removal (`pop`
            # copies it then) or an id out of order (`add`).
            self._keys: list[str] = ids  # type: ignore[assignment]
            return
        # A hole's key is "" (no message id is empty) until the running maximum fills it.
        filled = [mid if mid is not None else "" for mid in ids] if holes else ids
        keys: list[str] = list(accumulate(filled, max))  # type: ignore[arg-type]
        del filled
        self._keys = keys
        # A document holds its key when the key rises there. The others: holes, and ids
        # that do not sort after every earlier one (one equal to an earlier id is found by
        # the bisection: twice).
        for doc in compress(range(len(ids)), map(ge, chain(("",), keys), keys)):
            mid = ids[doc]
            if mid is None:
                continue
            if mid in self._extra or self._sorted_get(mid) is not None:
                raise ValueError("a message id is indexed twice")
            self._extra[mid] = doc

    def _sorted_get(self, message_id: str) -> int | None:
        i = bisect_left(self._keys, message_id)
        if i < len(self._keys):
            mid = self._ids[i]
            if mid is message_id or mid == message_id:
                return i
        return None

    def __len__(self) -> int:
        return self._live

    def __contains__(self, message_id: object) -> bool:
        return type(message_id) is str and self.get(message_id) is not None

    def get(self, message_id: str) -> int | None:
        """The document of `message_id`, or None."""
        if self._extra:
            doc = self._extra.get(message_id)
            if doc is not None:
                return doc
        return self._sorted_get(message_id)

    def add(self, message_id: str, doc: int) -> None:
        """Record `doc`, the document just appended to `ids` (whose entry is `message_id`,
        an id not held)."""
        keys = self._keys
        if keys is self._ids:  # shared: `message_id` is its last entry already
            if not doc or message_id > keys[doc - 1]:
                self._live += 1
                return
            keys = self._keys = keys[:doc]
        if not keys or message_id > keys[-1]:
            keys.append(message_id)
        else:
            keys.append(keys[-1])
            self._extra[message_id] = doc
        self._live += 1

    def pop(self, message_id: str) -> int | None:
        """Forget `message_id` and give its document (None when not held): its entry in
        `ids` becomes None."""
        doc = self.get(message_id)
        if doc is not None:
            if self._keys is self._ids:
                self._keys = self._ids.copy()  # type: ignore[assignment]
            self._extra.pop(message_id, None)
            self._ids[doc] = None
            self._live -= 1
        return doc

    def items(self) -> Iterator[tuple[str, int]]:
        """(id, document) of every live document, in document order."""
        for doc, mid in enumerate(self._ids):
            if mid is not None:
                yield mid, doc

    def nbytes(self) -> int:
        """Bytes of the table's own objects (sys.getsizeof; the strings are the store's,
        except a removed document's, kept until the next build)."""
        keys = 0 if self._keys is self._ids else self._keys.__sizeof__()
        return keys + self._extra.__sizeof__()
