"""Message ids: strictly increasing ULIDs, also when the clock steps back."""

from __future__ import annotations

from convmem_engine.service.ids import UlidSource


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
