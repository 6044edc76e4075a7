"""`convmem serve`: one MCP session on this process's stdin/stdout over one MemoryService.

- Only protocol bytes reach stdout: the real stdout is kept on a private descriptor and fd 1 is
  pointed at stderr, so a stray print (ours or a library's) cannot corrupt the stream.
- stdin is read by a daemon thread with back-pressure (at most a few chunks ahead), which works
  for pipes, files and consoles on every platform.
- Ends on stdin EOF (after answering what was already asked), SIGTERM or Ctrl-C. A signal stops
  reading and gives the requests already read `STOP_GRACE_SECONDS` to finish and be answered; a
  second signal stops at once. Every write the client saw acknowledged was fsynced before the
  acknowledgement; `service.close()` then runs with those signals ignored.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio.to_thread

from convmem_engine.domain.errors import BusyError, ConvMemError
from convmem_engine.mcp.line_transport import READ_CHUNK_BYTES, serve_chunks
from convmem_engine.mcp.server import build_server

if TYPE_CHECKING:
    from convmem_engine.service import MemoryService

logger = logging.getLogger(__name__)

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_BUSY: Final = 2
READ_AHEAD_CHUNKS: Final = 4
STOP_GRACE_SECONDS: Final = 5.0
"""After SIGTERM / Ctrl-C: how long requests already read may take to finish and be answered."""

_STOP_SIGNALS: Final = tuple(
    sig
    for sig in (
        getattr(signal, "SIGINT", None),
        getattr(signal, "SIGTERM", None),
        getattr(signal, "SIGBREAK", None),
    )
    if sig is not None
)


class _NoContentFilter(logging.Filter):
    """Keep message content out of the log whatever a library logs.

    Exception messages can quote input (pydantic's do), so a logged exception keeps its type
    and traceback frames and loses its message. The SDK's DEBUG records can print whole
    frames, so `mcp.*` is never logged below INFO.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.split(".")[0] == "mcp" and record.levelno < logging.INFO:
            return False
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            frames = "".join(traceback.format_tb(exc.__traceback__))
            head = record.getMessage()
            record.msg = f"{head} [{type(exc).__name__}; message withheld]\n{frames}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


def configure_logging(level: str) -> None:
    """Everything to stderr (stdout is the protocol), without message content."""
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s convmem %(levelname)s %(name)s: %(message)s")
    )
    handler.addFilter(_NoContentFilter())
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


@contextmanager
def _private_stdout() -> Iterator[int]:
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


class _StdinPump:
    """A daemon thread feeding stdin chunks to the event loop, a few chunks ahead at most."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
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
                chunk = os.read(self.fd, READ_CHUNK_BYTES)
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


def _install_stop_handlers(loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> None:
    for sig in _STOP_SIGNALS:
        try:
            loop.add_signal_handler(sig, stop)
        except (NotImplementedError, RuntimeError, ValueError):
            # Windows: no loop signal handlers; a plain handler wakes the loop instead.
            signal.signal(sig, lambda _signum, _frame: loop.call_soon_threadsafe(stop))


async def _serve(service: MemoryService, out_fd: int, in_fd: int) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    pump = _StdinPump(loop, in_fd)
    stopping = False

    def stop() -> None:
        nonlocal stopping
        if stopping:  # a second signal: stop now
            task.cancel()
            return
        stopping = True
        logger.info("stop signal: answering requests in progress, then exiting")
        pump.close()
        loop.call_later(STOP_GRACE_SECONDS, task.cancel)

    _install_stop_handlers(loop, stop)
    pump.start()

    async def send(data: bytes) -> None:
        try:  # a blocked stdout must not stall the loop
            await anyio.to_thread.run_sync(_write_all, out_fd, data, abandon_on_cancel=True)
        except RuntimeError:  # no thread could be started (resources exhausted): write here
            _write_all(out_fd, data)

    server = build_server(service)
    try:
        await serve_chunks(server, pump.read, send)
    except asyncio.CancelledError:
        if not stopping:
            raise


@contextmanager
def _signals_ignored() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_stdio(data_dir: Path, *, log_level: str = "WARNING") -> int:
    """Serve MCP on stdin/stdout for the store in `data_dir`; return the exit status.

    0 after a clean end, 2 when another process holds the data dir, 1 when the store cannot be
    opened (corrupt or unreadable). Errors are one line on stderr; stdout carries only MCP.
    """
    from convmem_engine.service import MemoryService

    configure_logging(log_level)
    try:
        service = MemoryService.open(data_dir)
    except ConvMemError as error:
        status = EXIT_BUSY if isinstance(error, BusyError) else EXIT_ERROR
        print(f"convmem serve: {error.code}: {data_dir}: {error.message}", file=sys.stderr)
        return status
    logger.info("serving %s over stdio (pid %d)", data_dir, os.getpid())
    if sys.stdin.isatty():
        print(
            "convmem serve: speaking MCP on stdin/stdout for an LLM host (see docs/hosts.md); "
            "press Ctrl-C to stop",
            file=sys.stderr,
        )
    try:
        with _private_stdout() as out_fd:
            asyncio.run(_serve(service, out_fd, sys.stdin.fileno()))
    except KeyboardInterrupt:
        pass
    finally:
        with _signals_ignored():
            service.close()
    logger.info("stopped")
    return EXIT_OK
