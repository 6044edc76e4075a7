"""index/heap.py: free C-heap memory really goes back to the system on Linux with glibc, and the
call is a harmless no-op elsewhere."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest

from convmem_engine.index.heap import release_free_memory

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
def test_freed_heap_blocks_leave_the_resident_set() -> None:
    # 60 KB blocks come from the heap (below glibc's mmap threshold), each one written; every
    # other one is kept, so the freed ones cannot merge into the heap's top and glibc keeps
    # them (about 24 MiB) until asked.
    blocks = [b"x" * 60_000 for _ in range(800)]
    kept = blocks[::2]
    del blocks
    before = _rss_mib()
    assert release_free_memory() is True
    after = _rss_mib()
    assert before - after >= 12, (before, after)
    assert len(kept) == 400 and all(b[-1:] == b"x" for b in kept)  # the kept ones are intact


@pytest.mark.skipif(GLIBC, reason="glibc releases (the test above)")
def test_without_glibc_nothing_is_done() -> None:
    assert release_free_memory() is False
