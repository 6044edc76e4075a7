"""The stdio listener: one MCP session on this process's stdin and a private copy of stdout.

- Only protocol bytes reach stdout: `private_stdout()` keeps the real stdout on a private
  descriptor and points fd 1 at stderr, so a stray print (ours or a library's) cannot corrupt
  the stream.
- stdin is read with back-pressure (at most a few chunks ahead of the session): on the loop
  itself when it is a pipe or a socket on POSIX (`loop_reader.LoopReader`: each request is read in
  the loop iteration that sees it arrive, with no thread hand-off), else by a daemon thread
  (regular files, consoles, Windows).
- With a `StdioFront` (`convmem serve`), the front has been reading stdin since the lock was
  taken (and may have answered the handshake): the session takes its stream over, replaying
  every byte the front kept, and the SDK's duplicate of the front's answer is dropped.
- An answer that fits in the pipe's free room (at most `PIPE_BUF` bytes, the pipe reporting
  room) is written on the loop; anything else from a worker thread, so a host that stops
  reading never stalls the loop.
- Read on the loop with stdout a pipe, each chunk is offered to the session first
  (`line_transport.Lane`): a write that comes alone is served and answered in the read's own
  callback when its answer fits the pipe's room (else the session's answer task writes it).
- The session ends at stdin EOF, after answering what was already asked (`finished` is set).
  `stop(grace)` stops reading and gives the requests already read `grace` seconds to finish and
  be answered; `stop(0)` ends the session at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import stat
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    from convmem_engine.runtime.front import Send, StdioFront
    from convmem_engine.runtime.runtime import Runtime

logger = logging.getLogger(__name__)

READ_AHEAD_CHUNKS: Final = 4


@contextmanager
def private_stdout() -> Iterator[int]:
    """Yield a descriptor on the real stdout while fd 1 points at stderr."""
    sys.stdout.flush()
    wire = os.dup(1)
    try:
        os.dup2(2, 1)
    except OSError:  # no usable stderr: stray output goes nowhere rather than on the wire
        sink = os.open(os.devnull, os.O_WRONLY)
        os.dup2(sink, 1)
        os.close(sink)
    try:
        yield wire
    finally:
        try:
            os.dup2(wire, 1)
        finally:
            os.close(wire)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class _Input(Protocol):
    async def read(self) -> bytes: ...

    def close(self) -> None: ...


class _PipeRoom:
    """Whether a write to a pipe can be done at once on the loop (no thread hand-off per
    answer): it is at most `PIPE_BUF` bytes (written whole, atomically) and the pipe reports
    room (POLLOUT: a free buffer of at least that size). Pipes on POSIX systems only; anything
    else, or an answer too large, is written from a worker thread."""

    def __init__(self, fd: int) -> None:
        self._poll = select.poll()
        self._poll.register(fd, select.POLLOUT)

    @classmethod
    def of(cls, fd: int) -> _PipeRoom | None:
        if not hasattr(select, "poll"):
            return None
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                return None
        except OSError:
            return None
        return cls(fd)

    def fits(self, data: bytes) -> bool:
        if len(data) > select.PIPE_BUF:
            return False
        try:
            events = self._poll.poll(0)
        except OSError:
            return False
        return any(mask == select.POLLOUT for _fd, mask in events)


def _always() -> bool:
    return True


class _StdinPump:
    """A daemon thread feeding stdin chunks to the event loop, a few chunks ahead at most."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        from convmem_engine.mcp.line_transport import READ_CHUNK_BYTES

        self.chunk_bytes = READ_CHUNK_BYTES
        self.loop = loop
        self.fd = fd
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.closed = False
        self.slots = threading.Semaphore(READ_AHEAD_CHUNKS)
        self.thread = threading.Thread(target=self._run, name="convmem-stdin", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        while True:
            self.slots.acquire()
            try:
                chunk = os.read(self.fd, self.chunk_bytes)
            except OSError:
                chunk = b""
            try:
                self.loop.call_soon_threadsafe(self.queue.put_nowait, chunk)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                return
            if not chunk:
                return

    async def read(self) -> bytes:
        if self.closed:
            return b""
        chunk = await self.queue.get()
        if self.closed:
            return b""
        if chunk:
            self.slots.release()
        else:
            self.queue.put_nowait(b"")  # EOF stays EOF for any later read
        return chunk

    def close(self) -> None:
        """From now on reads see end of input (call on the loop's thread)."""
        self.closed = True
        self.queue.put_nowait(b"")


class StdioListener:
    """One MCP session over `in_fd` / `out_fd` (a `Listener`, transport "stdio")."""

    transport = "stdio"

    def __init__(self, in_fd: int, out_fd: int, *, front: StdioFront | None = None) -> None:
        self.in_fd = in_fd
        self.out_fd = out_fd
        self.front = front
        self.finished = threading.Event()
        """Set when the session has ended (EOF and answers sent, or stopped)."""
        self._pump: _Input | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._room = _PipeRoom.of(out_fd)

    def start(self, runtime: Runtime) -> None:
        import anyio.to_thread  # imported here: the SDK loads it anyway, after the handshake

        from convmem_engine.mcp.line_transport import Lane
        from convmem_engine.runtime.loop_reader import LoopReader

        self._run_sync = anyio.to_thread.run_sync
        started = threading.Event()

        async def run() -> None:
            self._task = asyncio.current_task()
            loop = asyncio.get_running_loop()
            send: Send = self._send
            # stdin read on the loop offers each request to the session first, which answers
            # a plain write at once when stdout has room for the answer (line_transport.Lane)
            lane = None if self._room is None else Lane(_always, self._send_now)
            if self.front is not None:
                stream = self.front.handover(loop)
                stream.lane = lane
                self._pump = stream
                send = self.front.wrap_send(send)
            elif LoopReader.usable(loop, self.in_fd, (self.out_fd, 1, 2)):
                reader = LoopReader(loop, self.in_fd)
                reader.lane = lane
                self._pump = reader
            else:
                pump = _StdinPump(loop, self.in_fd)
                pump.start()
                self._pump = pump
                lane = None  # (read by a thread: nothing offers)
            started.set()
            try:
                await runtime.serve_session(self.transport, self._pump.read, send, lane)
            except asyncio.CancelledError:
                if not self._stopping:
                    raise
            finally:
                self.finished.set()

        runtime.loop.submit(run())
        started.wait()

    def _send_now(self, data: bytes) -> bool:
        """The lane's write: at once if the pipe has room for all of `data`, else False."""
        if self._room is not None and self._room.fits(data):
            _write_all(self.out_fd, data)
            return True
        return False

    async def _send(self, data: bytes) -> None:
        if self._send_now(data):  # cannot block: the pipe had room for all of it
            return
        try:  # a blocked stdout must not stall the loop
            await self._run_sync(_write_all, self.out_fd, data, abandon_on_cancel=True)
        except RuntimeError:  # no thread could be started (resources exhausted): write here
            _write_all(self.out_fd, data)

    async def stop(self, grace: float) -> None:
        task = self._task
        if task is None or task.done():
            return
        if not self._stopping:
            self._stopping = True
            logger.info("stdio: answering requests in progress, then ending the session")
            if self._pump is not None:
                self._pump.close()
        if grace <= 0:
            task.cancel()
        await asyncio.wait({task}, timeout=max(grace, 0.0))
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
