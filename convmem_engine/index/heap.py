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

`large_blocks_mapped()` makes glibc give every block of 32 KiB or more (a search index build's
posting arrays and per-container lists) its own mapping for as long as it is held: such a block
never fragments the heap, is returned to the system the moment it is freed, and the spare
room an array keeps for its next appends (1/16 of it) is never touched, so it is not resident.
Measured on the start that rebuilds the index at a million messages: the build's peak RSS
-10 MiB, for no measurable CPU (docs/benchmarks.md, "rebuild500").

Linux with glibc only: elsewhere (macOS and Windows return freed memory themselves, musl has no
`malloc_trim` nor `mallopt`) `release_free_memory` does nothing and says so, and
`large_blocks_mapped` changes nothing.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Final

__all__ = ["MAPPED_FROM", "heap_blocks", "large_blocks_mapped", "release_free_memory"]

MAPPED_FROM: Final = 32 << 10
"""`large_blocks_mapped`: blocks of at least this many bytes get their own mapping (at a million
messages, 32 KiB gave the lowest build peak of 32, 64 and 128 KiB; the kernel's default limit
of 65,530 mappings is far: the build holds a few thousand)."""
_M_MMAP_THRESHOLD: Final = -3  # mallopt's parameter (malloc.h)
_M_TRIM_THRESHOLD: Final = -1
_HEAP_UP_TO: Final = 32 << 20
"""`heap_blocks`: the mapping threshold while held (glibc's largest on 64-bit systems)."""
_DEFAULT_TRIM: Final = 128 << 10  # glibc's own M_TRIM_THRESHOLD
_DEFAULT_THRESHOLD: Final = 128 << 10
"""glibc's own starting threshold (then raised as mapped blocks are freed): what is set back
once no build holds `large_blocks_mapped` (setting it fixes it: glibc stops raising it)."""
_mapped_lock = threading.Lock()
_mapped_holders = 0


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


@cache
def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's `mallopt`, or None where the process's C library has none (or it is not glibc:
    the parameter numbers are glibc's)."""
    if _malloc_trim() is None:  # glibc only (see there)
        return None
    import ctypes

    try:
        opt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    opt.argtypes = [ctypes.c_int, ctypes.c_int]
    opt.restype = ctypes.c_int
    return opt


@contextmanager
def large_blocks_mapped() -> Iterator[bool]:
    """While held (by any thread; nested and concurrent holders share it), every C heap block
    of `MAPPED_FROM` bytes or more is allocated as its own mapping (glibc's
    `M_MMAP_THRESHOLD`): see the module docstring. Yields False where that is not available
    (nothing is changed). Blocks allocated meanwhile stay mapped until freed; once the last
    holder leaves, the threshold is glibc's default again (128 KiB, fixed from then on)."""
    global _mapped_holders
    opt = _mallopt()
    if opt is None:
        yield False
        return
    with _mapped_lock:
        _mapped_holders += 1
        if _mapped_holders == 1:
            opt(_M_MMAP_THRESHOLD, MAPPED_FROM)
    try:
        yield True
    finally:
        with _mapped_lock:
            _mapped_holders -= 1
            if _mapped_holders == 0:
                opt(_M_MMAP_THRESHOLD, _DEFAULT_THRESHOLD)


@contextmanager
def heap_blocks() -> Iterator[None]:
    """Inside `large_blocks_mapped` (else nothing changes): while held, blocks up to 32 MiB
    come from the heap again, and freeing them does not shrink the heap. For a phase that
    makes and drops large short-lived blocks over and over: a search index build's NumPy
    arrays, chunk after chunk (index/gram_batch.py). Mapped, each would be a new mapping whose
    every page is faulted in again: at 258k messages 720,000 page faults, 1.6 s of the
    kernel's CPU, against ~100,000 and 0.3 s from the heap. The build makes them on a thread
    of their own, whose C heap (glibc's arena for that thread) holds nothing else, so they do
    not fragment the heap the posting lists grow in (docs/benchmarks.md, "The batch build
    with NumPy"). Not nested; the caller trims the heap (`release_free_memory`) once the
    phase is over for a while."""
    opt = _mallopt()
    with _mapped_lock:
        held = opt is not None and _mapped_holders > 0
        if held:
            assert opt is not None
            opt(_M_MMAP_THRESHOLD, _HEAP_UP_TO)
            opt(_M_TRIM_THRESHOLD, 2 * _HEAP_UP_TO)
    try:
        yield
    finally:
        if held:
            assert opt is not None
            with _mapped_lock:
                opt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM)
                opt(_M_MMAP_THRESHOLD, MAPPED_FROM if _mapped_holders else _DEFAULT_THRESHOLD)


def release_free_memory() -> bool:
    """Return the C heap's free pages to the system (glibc's `malloc_trim(0)`); False where
    that is not available (then nothing is done). Safe from any thread at any time: glibc
    locks each heap while it trims it."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
