"""index/heap.py: free C-heap memory really goes back to the system on Linux with glibc, large
blocks get their own mappings while a build holds them, and each
call is a harmless no-op elsewhere."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest

from convmem_engine.index.heap import large_blocks_mapped, release_free_memory

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


_MAPPED_PROBE = """
import ctypes, json

from convmem_engine.index.heap import heap_blocks, large_blocks_mapped


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
        ).split()
    ]


mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2


def mapped():  # glibc's count of blocks allocated as their own mappings
    return int(mallinfo2().hblks)


SIZE, COUNT = 96 << 10, 64  # above MAPPED_FROM, below glibc's default threshold (128 KiB)
out = {}
with large_blocks_mapped() as held:
    out["held"] = held
    before = mapped()
    blocks = [bytearray(SIZE) for _ in range(COUNT)]
    out["while held"] = mapped() - before
    with large_blocks_mapped():  # a nested (or concurrent) holder shares it
        pass
    inner = [bytearray(SIZE) for _ in range(COUNT)]  # the outer holder still holds it
    out["after a nested holder left"] = mapped() - before
    del blocks, inner
    out["freed"] = mapped() - before
before = mapped()
after = [bytearray(SIZE) for _ in range(COUNT)]
out["after"] = mapped() - before
del after
with large_blocks_mapped():
    before = mapped()
    with heap_blocks():
        heaped = [bytearray(4 * SIZE) for _ in range(COUNT)]
    out["heap_blocks"] = mapped() - before
    again = [bytearray(SIZE) for _ in range(COUNT)]
    out["after heap_blocks"] = mapped() - before
    del heaped, again
with heap_blocks():  # without a holder: changes nothing
    pass
before = mapped()
last = [bytearray(SIZE) for _ in range(COUNT)]
out["after all"] = mapped() - before
print(json.dumps(out))
"""


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_large_blocks_are_mapped_while_a_holder_holds_them() -> None:
    # In a fresh interpreter: glibc maps a block only when no free heap chunk fits it, and
    # this process's heap may hold many after other tests.
    import json
    import subprocess

    run = subprocess.run(
        [sys.executable, "-c", _MAPPED_PROBE], capture_output=True, text=True, check=True
    )
    out = json.loads(run.stdout)
    assert out["held"] is True
    assert out["while held"] >= 32, out  # most of the 64 (some fit free heap chunks)
    assert out["after a nested holder left"] >= out["while held"] + 48, out
    assert out["freed"] < 16, out  # mapped blocks go back when freed
    assert out["after"] == 0, out  # glibc's default threshold (128 KiB) again
    assert out["heap_blocks"] == 0, out  # 384 KiB blocks from the heap while heap_blocks holds
    assert out["after heap_blocks"] >= 32, out  # then mapped again
    assert out["after all"] == 0, out


@pytest.mark.skipif(GLIBC, reason="glibc maps them (the test above)")
def test_without_glibc_large_blocks_change_nothing() -> None:
    with large_blocks_mapped() as held:
        assert held is False
