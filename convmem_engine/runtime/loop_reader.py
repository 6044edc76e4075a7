"""stdin read on the session's own event loop (`LoopReader`), for `convmem serve`'s stdio after
the front's hand-over (`front.py`) and for the stdio listener without a front
(`stdio_listener.py`). Standard library only: the front imports it before the handshake."""

from __future__ import annotations

import contextlib
import os
import stat
from collections import deque
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import asyncio

    from convmem_engine.mcp.line_transport import Lane

READ_CHUNK_BYTES: Final = 64 * 1024
"""As the line transport reads (`line_transport.READ_CHUNK_BYTES`)."""
READ_AHEAD_CHUNKS: Final = 4
"""After the handover: chunks read ahead of the session (as `StdioListener` does)."""


class LoopReader:
    """Reads `fd` (a pipe or a socket) on `loop` itself (`add_reader`), a few chunks ahead of
    the session at most: each request reaches the session in the loop iteration that sees it
    arrive, with no thread and no wake-up of the loop from another thread.

    The descriptor is put in non-blocking mode while the reader watches it (so a read can
    never hold up the loop) and given back its mode at end of input or `close()`. Where the
    loop cannot watch it (regular files, consoles, Windows: `usable`), a thread reads instead
    (`StdioFront`'s, or the listener's `_StdinPump`).

    `lane` (the session's, `line_transport.Lane`, when set): a chunk read while no other
    waits to be taken is offered to the session first (`Lane.offer`); taken, it is not
    queued."""

    lane: Lane | None = None

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self._loop = loop
        self._fd = fd
        self._chunks: deque[bytes] = deque()
        self._eof = False
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None
        self._watching = False
        self._was_blocking = os.get_blocking(fd)
        if self._was_blocking:
            os.set_blocking(fd, False)
        self._watch()

    @staticmethod
    def usable(loop: asyncio.AbstractEventLoop, fd: int, others: tuple[int, ...] = ()) -> bool:
        """Whether `loop` can watch `fd`: a pipe or a socket, on POSIX (a console's mode is
        shared with the shell; Windows' loops watch sockets only), that none of `others` (our
        stdout and stderr) refers to: non-blocking mode belongs to the open file, so a socket
        that is stdin and stdout at once would make the answers' writes non-blocking too."""
        if os.name != "posix" or not hasattr(loop, "add_reader"):
            return False
        try:
            info = os.fstat(fd)
            if not (stat.S_ISFIFO(info.st_mode) or stat.S_ISSOCK(info.st_mode)):
                return False
            for other in others:
                with contextlib.suppress(OSError):  # (a closed descriptor shares nothing)
                    if os.path.samestat(info, os.fstat(other)):
                        return False
        except OSError:
            return False
        try:  # (a loop may lack readers: asyncio's proactor, some third-party loops)
            loop.add_reader(fd, _nothing)
        except (NotImplementedError, OSError, ValueError):
            return False
        loop.remove_reader(fd)
        return True

    def _watch(self) -> None:
        if not self._watching:
            self._loop.add_reader(self._fd, self._readable)
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            self._loop.remove_reader(self._fd)

    def _readable(self) -> None:
        try:
            chunk = os.read(self._fd, READ_CHUNK_BYTES)
        except (BlockingIOError, InterruptedError):
            return  # nothing after all: wait for the next readiness
        except OSError:
            chunk = b""
        if chunk:
            lane = self.lane
            if lane is not None and not self._chunks and lane.offer(chunk):
                return  # served by the session's lane (nothing read before it waits)
            self._chunks.append(chunk)
            if len(self._chunks) >= READ_AHEAD_CHUNKS:
                self._unwatch()  # back-pressure: read again once the session has taken one
        else:
            self._end()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _end(self) -> None:
        self._eof = True
        self._unwatch()
        if self._was_blocking:
            self._was_blocking = False
            with contextlib.suppress(OSError):
                os.set_blocking(self._fd, True)

    async def read(self) -> bytes:
        """The next chunk; b"" at end of input (and after `close()`)."""
        while not self._chunks and not self._eof and not self._closed:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._closed or not self._chunks:
            return b""
        chunk = self._chunks.popleft()
        if not self._eof:
            self._watch()
        return chunk

    def close(self) -> None:
        """From now on reads see end of input; `fd` is no longer watched (call on the loop)."""
        self._closed = True
        self._end()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _nothing() -> None:
    pass
