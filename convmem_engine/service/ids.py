"""Message ids: ULIDs from python-ulid, strictly increasing for the life of the data dir.

python-ulid's own generator is monotonic only while its clock moves forward. This source keeps
the last issued (timestamp, randomness) and never goes below it: within one millisecond, or when
the clock steps back, it reuses the last timestamp and adds 1 to the randomness (carrying into
the timestamp on the rare overflow). Seeded with the largest id in the store, so ids also
increase across restarts. Callers serialise `next()` (the service calls it under its write lock).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from ulid import ULID

_RANDOM_BITS = 80
_RANDOM_BYTES = _RANDOM_BITS // 8
_RANDOM_MAX = (1 << _RANDOM_BITS) - 1
RANDOM_BATCH = 64
"""Ids whose randomness is drawn from the OS at once: one `getrandom` system call (which
releases the GIL, so another thread may take it) per 64 new milliseconds, not per id."""
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]  # 10 bits -> 2 characters


def ulid_text(value: int) -> str:
    """The 26-character ULID of a 128-bit value: Crockford base32, as python-ulid writes it
    (its `str(ULID)`, ~4x the time: this runs for every message written)."""
    return "".join(
        [
            _PAIRS[(value >> 120) & 0x3FF],
            _PAIRS[(value >> 110) & 0x3FF],
            _PAIRS[(value >> 100) & 0x3FF],
            _PAIRS[(value >> 90) & 0x3FF],
            _PAIRS[(value >> 80) & 0x3FF],
            _PAIRS[(value >> 70) & 0x3FF],
            _PAIRS[(value >> 60) & 0x3FF],
            _PAIRS[(value >> 50) & 0x3FF],
            _PAIRS[(value >> 40) & 0x3FF],
            _PAIRS[(value >> 30) & 0x3FF],
            _PAIRS[(value >> 20) & 0x3FF],
            _PAIRS[(value >> 10) & 0x3FF],
            _PAIRS[value & 0x3FF],
        ]
    )


def utc_millis() -> int:
    return time.time_ns() // 1_000_000


class UlidSource:
    def __init__(
        self,
        clock: Callable[[], int] = utc_millis,
        randomness: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self._clock = clock
        self._randomness = randomness
        self._last = 0  # 128-bit integer value of the last id issued (or seen)
        self._pool = b""  # randomness drawn and not yet used
        self._taken = 0  # bytes of `_pool` used

    def observe(self, message_id: str) -> None:
        """Never issue an id at or below `message_id` (an id already in the store)."""
        value = int.from_bytes(ULID.from_str(message_id).bytes, "big")
        if value > self._last:
            self._last = value

    def next(self) -> tuple[str, int]:
        """A new id and its timestamp (UTC milliseconds, as encoded in the id)."""
        now = self._clock()
        last_ts = self._last >> _RANDOM_BITS
        if now > last_ts:
            taken = self._taken
            if taken >= len(self._pool):
                self._pool = self._randomness(_RANDOM_BYTES * RANDOM_BATCH)
                taken = 0
            self._taken = taken + _RANDOM_BYTES
            rand = int.from_bytes(self._pool[taken : taken + _RANDOM_BYTES], "big")
            # Keep half of the randomness space for same-millisecond increments.
            value = (now << _RANDOM_BITS) | (rand >> 1)
        else:
            value = self._last + 1
        self._last = value
        return ulid_text(value), value >> _RANDOM_BITS
