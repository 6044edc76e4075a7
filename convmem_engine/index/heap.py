"""Give the C library's free heap memory back to the operating system, where that is possible.

CPython allocates array buffers, bytes and most objects above 512 bytes with the C library's
`malloc`. glibc keeps what is freed in its heaps for reuse and hands back to the system only
what lies at a heap's top, so a phase that allocates and frees a lot (a search index build: a
container's gram lists made, appended to the posting lists and dropped, 16 times at a million
messages; a search.idx load's read buffers) leaves the process's resident size at its high
point. glibc's `malloc_trim(0)` returns every whole free page of every heap (madvise), in a
few milliseconds at most per call at a million messages; measured there it took the RSS after
a build from 523 to 469 MiB, and called after each container, the build's own peak from 523
to 494-510 MiB (docs/benchmarks.md, "Peak RSS at a million messages").

Linux with glibc only: elsewhere (macOS and Windows return freed memory themselves, musl has no
`malloc_trim`) `release_free_memory` does nothing and says so.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import cache

__all__ = ["release_free_memory"]


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the process's C library has none."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # loaded on the first call only (not on the first reply's path)

    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library this process runs on
    except (OSError, AttributeError):  # no symbol: not glibc (e.g. musl)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Return the C heap's free pages to the system (glibc's `malloc_trim(0)`); False where
    that is not available (then nothing is done). Safe from any thread at any time: glibc
    locks each heap while it trims it."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
