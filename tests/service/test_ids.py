"""Message ids: strictly increasing ULIDs, also when the clock steps back."""

from __future__ import annotations

import os

import pytest
from ulid import ULID

from convmem_engine.service.ids import RANDOM_BATCH, UlidSource, ulid_text


def test_ulid_source_monotonic_with_clock_going_back() -> None:
    times = iter([100, 100, 100, 99, 50, 101, 101, 102])
    src = UlidSource(lambda: next(times))
    out = [src.next() for _ in range(7)]
    ids = [i for i, _ in out]
    assert ids == sorted(ids) and len(set(ids)) == 7
    assert [t for _, t in out][:5] == [100] * 5  # the clock stepped back: time held
    assert out[5][1] == 101
    future = "7ZZZZZZZZZ" + "0" * 16  # an id from the far future already in the store
    src.observe(future)
    assert src.next()[0] > future


@pytest.mark.parametrize("bits", [0, 1, 48, 80, 127, 128])
def test_ulid_text_is_python_ulids_text(bits: int) -> None:
    values = [0, (1 << 128) - 1] + [
        int.from_bytes(os.urandom(16), "big") >> (128 - bits) for _ in range(2_000)
    ]
    for value in values:
        ulid = ULID.from_bytes(value.to_bytes(16, "big"))
        assert ulid_text(value) == str(ulid)


def test_next_gives_the_ids_own_timestamp() -> None:
    src = UlidSource(lambda: 1_790_000_000_123)
    for _ in range(3):
        text, ts = src.next()
        assert ULID.from_str(text).milliseconds == ts == 1_790_000_000_123


def test_randomness_is_drawn_in_batches_and_each_new_millisecond_gets_its_own() -> None:
    """One draw from the OS serves RANDOM_BATCH new milliseconds, each with its own 10 bytes
    (ids of successive milliseconds never reuse a slice); the next draw comes after them."""
    draws: list[int] = []
    pools: list[bytes] = []

    def randomness(n: int) -> bytes:
        draws.append(n)
        pools.append(os.urandom(n))
        return pools[-1]

    clock = iter(range(1_000, 1_000 + 2 * RANDOM_BATCH + 1))
    src = UlidSource(lambda: next(clock), randomness)
    ids = [src.next()[0] for _ in range(2 * RANDOM_BATCH + 1)]
    assert draws == [10 * RANDOM_BATCH] * 3
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for k, text in enumerate(ids):
        value = int.from_bytes(ULID.from_str(text).bytes, "big")
        pool = pools[k // RANDOM_BATCH]
        at = (k % RANDOM_BATCH) * 10
        expected = int.from_bytes(pool[at : at + 10], "big") >> 1
        assert value & ((1 << 80) - 1) == expected
