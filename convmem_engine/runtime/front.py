"""The stdio front of `convmem serve`: the first answers, before the SDK is even imported.

This module holds the front's moving parts: `StdioFront` (the reader and answering threads, the
descriptors, the hand-over to the session on the engine's loop) and `HandedStream` (the
session's side of the handed stream). What a line is and the bytes of its answer are decided by
the pure functions of `front_plan` (`handshake_for`, `plan_for`, `call_answer`...).

Standard library only (no SDK, no pydantic), so it runs a few tens of milliseconds after the
process starts. Once the data dir's lock is held
(`Runtime.open(on_locked=...)`), `StdioFront.start()` reads stdin on a thread of its own and
answers the session's first request when it is a handshake it is sure about
(`front_plan.handshake_for`): `initialize` (the handshake eras, 2025-11-25 and older) or
`server/discover` (2026-07-28). The answer is the SDK server's own answer to that request, byte
for byte (from the generated `handshake_answers`). Anything the front is not sure about
(another method, params it does not know, an unusual id, an escape sequence) it leaves to the
SDK: that request then waits for the runtime like every other one.

After a handshake it answered, and unless `CONVMEM_FRONT_CALLS=0` (or `--http`: the HTTP
listener may still fail to start), the front goes on answering the requests that follow, one at
a time and in order, on a worker thread, while the store opens and the SDK loads:

- `tools/list` and `ping`: the SDK's answer for the session's protocol version (the negotiated
  one; on 2026-07-28 the request's envelope), from `handshake_answers` (`tools/list` at once when
  the data dir has no `agent.yaml`, i.e. the agent is off; else once the agent part has started
  and says it is off);
- `tools/call` for a memory tool, once the service is open and the parts have started
  (`serve_tools`): `ToolRegistry.result`, shaped byte for byte as the SDK shapes it
  (`front_plan.call_answer`);
- `notifications/initialized` (and any other notification but a cancellation) is kept for the
  SDK; `notifications/cancelled` for a call the front took is honoured as the SDK honours it
  (a call cancelled before its answer is written is never answered) and not passed on.

Only plainly valid requests go this way (`front_plan.plan_for` judges each line; its module doc
says which shapes). The first request that is anything else (an agent tool, an unknown tool, a
cursor, a progress token, a batch, a line the SDK's parser refuses, a line over
`LINE_BYTES`...) ends the front's answering: it and everything after it wait for the SDK.

When the runtime is running, `StdioListener` takes the stream over (`handover`) after the
front has finished the request it is serving (`stop_answering`): the session reads the bytes
the front kept, in order (the handshake it answered, the notifications, and every request it
did not answer, so the SDK's session state is exactly as if it had answered the handshake),
then the rest of stdin. Requests the front answered are never passed on: each is answered
once. The SDK's answer to the handshake the front already answered is swallowed by id
(`wrap_send`). From the hand-over on, a pipe or a socket (on POSIX) is read on the session's
loop itself (`LoopReader`): the front's thread delivers the chunk it may be waiting for, then
ends; anything else (a regular file, a console, Windows) the thread goes on reading.

When the open fails after the lock was taken (a corrupt store, a broken agent.yaml), `fail`
answers each request read so far that the front did not answer with a JSON-RPC error saying
why, before `convmem serve` exits with its usual status and stderr line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from convmem_engine.runtime import handshake_answers as answers
from convmem_engine.runtime.front_plan import (
    INTERNAL_ERROR,
    Plan,
    call_answer,
    call_failure,
    handshake_for,
    line_request_id,
    plan_for,
)
from convmem_engine.runtime.loop_reader import READ_AHEAD_CHUNKS, READ_CHUNK_BYTES, LoopReader

if TYPE_CHECKING:
    import asyncio

    from convmem_engine.mcp.line_transport import Lane
    from convmem_engine.tools import ToolRegistry

logger = logging.getLogger(__name__)

PRE_HANDOVER_BYTES: Final = 1024 * 1024
"""Before the handover the front stops reading once it keeps this many bytes (the host's
writes then block: back-pressure, as the session's own in-flight cap gives later)."""
FIRST_LINE_BYTES: Final = 64 * 1024
"""A first line longer than this is not a handshake the front answers."""
LINE_BYTES: Final = 256 * 1024
"""After the handshake: a request line longer than this ends the front's answering."""
ENV_SWITCH: Final = "CONVMEM_FRONT_CALLS"
"""`0` keeps the front to the handshake: every later request waits for the SDK."""
AGENT_CONFIG: Final = "agent.yaml"
"""(`agent.config.CONFIG_FILE`, not imported here.) Without it the agent is off."""

Send = Callable[[bytes], Awaitable[None]]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def enabled_by_environment() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip() not in {"0", "false", "no", "off"}


# ---- the stream -----------------------------------------------------------------------------


class StdioFront:
    """Reads `in_fd` from `start()` on; answers the first request when it can, then the plain
    requests that follow (see the module doc) until the SDK takes over; keeps every byte it
    does not answer for the session that takes over (`handover`), or answers with errors
    (`fail`)."""

    def __init__(
        self,
        in_fd: int,
        out_fd: int,
        *,
        data_dir: Path | None = None,
        answer_requests: bool | None = None,
    ) -> None:
        self.in_fd = in_fd
        self.out_fd = out_fd
        self._data_dir = data_dir
        self._answer_requests = (
            enabled_by_environment() if answer_requests is None else answer_requests
        )
        self._cond = threading.Condition()
        self._kept: list[bytes] = []  # the bytes the SDK will read, in order
        self._held = 0  # bytes read and not yet answered or handed over (the read-ahead cap)
        self._eof = False
        self._first = bytearray()  # the input up to the first non-blank line's newline
        self._answered: tuple[bytes, bytes] | None = None  # (id prefix, answer line)
        self._state = "new"  # new -> reading -> handed / failed
        self._mode = "first"  # first -> lines (answering plain requests) -> keep
        self._lines: deque[bytes] = deque()  # complete lines the worker has not taken yet
        self._partial = bytearray()  # an incomplete line (lines mode)
        self._busy = False  # the worker is answering a line it took
        self._era = ""
        self._version = ""
        self._tools: ToolRegistry | None = None
        self._tools_known = False  # serve_tools was called (the registry, or None: no calls)
        self._list_static: bool | None = None  # tools/list is the generated one (agent off)
        self.agent_config_absent = False
        """The data dir had no `agent.yaml` when the front started: `tools/list` may be answered
        without the agent's tools at once, so the agent part must take the agent as off
        (`serve_cli`), even if the file appears before the part reads it."""
        self._handled: set[str | int] = set()  # ids of the calls the front took
        self.answered = 0
        """Requests the front answered after the handshake (for the log and the tests)."""
        self._deliver: Callable[[bytes, bool], object] | None = None
        self._loop_reads = False  # after the handover the session's loop reads `in_fd`
        self._slots = threading.Semaphore(READ_AHEAD_CHUNKS)
        self._thread = threading.Thread(target=self._run, name="convmem-stdin", daemon=True)

    def start(self) -> None:
        """Start reading and answering (call once the data dir's lock is held)."""
        with self._cond:
            if self._state != "new":
                return
            self._state = "reading"
            if self._data_dir is not None and not os.path.lexists(
                os.path.join(self._data_dir, AGENT_CONFIG)
            ):
                self._list_static = True  # no agent.yaml: the agent is off
                self.agent_config_absent = True
        self._thread.start()

    # -- the reader thread ---------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._state == "reading" and self._held >= PRE_HANDOVER_BYTES:
                    self._cond.wait()
                if self._state == "failed":
                    return
                handed = self._state == "handed"
                loop_reads = handed and self._loop_reads
                deliver = self._deliver
            if loop_reads:  # the session's loop reads from here on
                assert deliver is not None
                with contextlib.suppress(RuntimeError):  # a closed loop: nobody listens
                    deliver(_LOOP_READS, False)
                return
            if handed:
                self._slots.acquire()
            try:
                chunk = os.read(self.in_fd, READ_CHUNK_BYTES)
            except OSError:
                chunk = b""
            with self._cond:
                if self._state == "reading":
                    self._read(chunk)
                    if not chunk:
                        return
                    continue
                if self._state == "failed":
                    return
                deliver = self._deliver
            assert deliver is not None
            try:
                deliver(chunk, handed)  # a slot was taken for this read only if handed
            except RuntimeError:  # the loop is closed: nobody is listening any more
                return
            if not chunk:
                return

    def _read(self, chunk: bytes) -> None:
        """(Holding the lock.) Take a chunk read before the handover."""
        self._cond.notify_all()
        if not chunk:
            self._eof = True
            return
        self._held += len(chunk)
        if self._mode == "keep":
            self._kept.append(chunk)
        elif self._mode == "lines":
            self._take_lines(chunk)
        else:
            self._first_line(chunk)

    def _first_line(self, chunk: bytes) -> None:
        """(Holding the lock.) Answer the first request once its line is complete, if the
        front knows the answer."""
        self._first += chunk
        start = 0
        while True:
            newline = self._first.find(b"\n", start)
            if newline < 0:
                if len(self._first) > FIRST_LINE_BYTES:
                    self._to_keep()
                return
            line = bytes(self._first[start:newline])
            start = newline + 1
            if line.strip():
                break  # the first line the session will not skip as blank
        self._kept.append(bytes(self._first[:start]))
        rest = bytes(self._first[start:])
        self._first.clear()
        found = handshake_for(line)
        if found is None:
            self._to_keep(rest)
            return
        try:
            _write_all(self.out_fd, found.answer)
        except OSError as exc:  # the host is gone: the session will find out
            logger.debug("front: stdout closed: %s", type(exc).__name__)
            self._to_keep(rest)
            return
        self._answered = (b'{"jsonrpc":"2.0","id":' + found.request_id + b",", found.answer)
        logger.debug("front: answered the handshake before the runtime was ready")
        if not self._answer_requests:
            self._to_keep(rest)
            return
        self._era, self._version = found.era, found.version
        self._mode = "lines"
        threading.Thread(target=self._work, name="convmem-front", daemon=True).start()
        if rest:
            self._take_lines(rest)

    def _take_lines(self, chunk: bytes) -> None:
        """(Holding the lock, lines mode.) Queue the complete lines for the worker."""
        self._partial += chunk
        start = 0
        while (newline := self._partial.find(b"\n", start)) >= 0:
            self._lines.append(bytes(self._partial[start : newline + 1]))
            start = newline + 1
        del self._partial[:start]
        if len(self._partial) > LINE_BYTES:
            self._to_keep()

    def _to_keep(self, rest: bytes = b"") -> None:
        """(Holding the lock.) From here on every byte goes to the SDK: the lines not yet
        answered, the incomplete one, `rest`, and whatever is read next."""
        self._mode = "keep"
        self._kept.extend(self._lines)
        self._lines.clear()
        for pending in (bytes(self._first), bytes(self._partial), rest):
            if pending:
                self._kept.append(pending)
        self._first.clear()
        self._partial.clear()
        self._cond.notify_all()

    # -- the worker: answering the requests after the handshake --------------------------

    def serve_tools(self, registry: ToolRegistry | None, *, agent_enabled: bool) -> None:
        """The service is open and the parts have started: tool calls may be answered through
        `registry` (the memory tools; None: no calls), and `tools/list` is the generated one
        unless the agent is on."""
        with self._cond:
            self._tools = registry
            self._tools_known = True
            self._list_static = not agent_enabled
            self._cond.notify_all()

    def wait_idle(self, timeout: float) -> None:
        """Wait (up to `timeout` seconds) until the front has answered every request it has
        read, or has stopped answering (the SDK is imported after: it would slow them)."""
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    self._mode != "lines"
                    or self._state != "reading"
                    or (not self._lines and not self._busy)
                ),
                timeout,
            )

    def stop_answering(self) -> None:
        """End the front's answering: wait for the request being answered, then keep every
        byte for the SDK (called before the hand-over)."""
        with self._cond:
            if self._mode == "lines":
                self._to_keep()
            self._cond.wait_for(lambda: not self._busy)

    def _work(self) -> None:
        try:
            while self._answer_next():
                pass
        except Exception:  # never leave a request unanswered: the SDK gets it
            logger.exception("front: answering failed; the SDK takes the requests")
            with self._cond:
                self._busy = False
                if self._mode == "lines":
                    self._to_keep()

    @property
    def answering(self) -> bool:
        """The front answers the requests it reads, and stdin is not at its end: nothing waits
        for the SDK (`serve_cli.sdk_after_search_index`)."""
        with self._cond:
            return self._answering() and not self._eof

    def _answering(self) -> bool:
        return self._mode == "lines" and self._state == "reading"

    def _answer_next(self) -> bool:
        """Answer (or keep) the next line; False when the front's answering is over."""
        with self._cond:
            self._cond.wait_for(lambda: not self._answering() or bool(self._lines))
            if not self._answering():
                return False
            line = self._lines[0]
        plan = plan_for(line, self._era, self._version)
        with self._cond:
            if plan.kind == "call" or (plan.kind == "list" and self._list_static is None):
                self._cond.wait_for(lambda: not self._answering() or self._tools_known)
            if not self._answering():
                return False
            if (
                plan.kind == "sdk"
                or (plan.kind == "list" and not self._list_static)
                or (plan.kind == "call" and (self._tools is None or plan.name not in self._tools))
            ):
                self._to_keep()
                return False
            self._lines.popleft()
            if plan.kind == "keep" or (plan.kind == "cancel" and plan.key not in self._handled):
                self._kept.append(line)
                return True
            self._held -= len(line)
            self._cond.notify_all()
            if plan.kind == "cancel":  # of a call the front took: answered, or never will be
                return True
            if plan.kind == "call":
                self._handled.add(plan.key)
                if self._cancelled(plan.key):
                    return True
            self._busy = True
        try:
            if plan.kind == "call":
                out = self._call(plan)
            elif plan.kind == "list":
                out = b'{"jsonrpc":"2.0","id":' + plan.request_id + answers.TOOLS_LIST[plan.version]
            else:
                out = b'{"jsonrpc":"2.0","id":' + plan.request_id + plan.answer
            with self._cond:
                if plan.kind == "call" and self._cancelled(plan.key):
                    return True
            try:
                _write_all(self.out_fd, out)
            except OSError as exc:
                logger.debug("front: stdout closed: %s", type(exc).__name__)
            self.answered += 1
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
        return True

    def _cancelled(self, key: str | int) -> bool:
        """(Holding the lock.) A cancellation of `key` is among the lines read after it."""
        for line in self._lines:
            if b"notifications/cancelled" in line:
                plan = plan_for(line, self._era, self._version)
                if plan.kind == "cancel" and plan.key == key:
                    return True
        return False

    def _call(self, plan: Plan) -> bytes:
        tools = self._tools
        assert tools is not None and plan.arguments is not None
        try:
            result = tools.result(plan.name, plan.arguments)
        except Exception as exc:
            logger.error("handler for 'tools/call' raised %s", type(exc).__name__)
            return call_failure(plan, exc)
        return call_answer(plan, result.text, result.is_error)

    # -- the hand-over ---------------------------------------------------------------------

    def handover(self, loop: asyncio.AbstractEventLoop) -> HandedStream:
        """Give the stream to a session on `loop` (call on that loop): its `read()` yields
        the bytes the front kept, then the rest of stdin; b"" at end of input.

        Where `loop` can watch `in_fd` (`LoopReader.usable`: a pipe or a socket, on POSIX),
        the reader thread stops after the chunk it may be waiting for and the loop reads the
        rest itself: no thread hand-off per request. Else the thread goes on reading."""
        self.stop_answering()
        loop_reads = LoopReader.usable(loop, self.in_fd, (self.out_fd, 1, 2))
        stream = HandedStream(self._slots, loop, self.in_fd if loop_reads else None)
        with self._cond:
            if self._state == "failed":
                raise RuntimeError("the front failed: there is no stream to hand over")
            self._to_keep()
            kept, self._kept = self._kept, []
            eof = self._eof
            started = self._state != "new"
            self._state = "handed"
            self._loop_reads = loop_reads
            self._deliver = lambda chunk, slotted: loop.call_soon_threadsafe(
                stream.put, chunk, slotted
            )
            self._cond.notify_all()
        if self.answered:
            logger.info("front: answered %d request(s) before the SDK took over", self.answered)
        for chunk in kept:
            stream.put(chunk, False)
        if eof:
            stream.put(b"", False)
        elif not started:  # the lock was never reported (a custom open): read from here on
            if loop_reads:
                stream.put(_LOOP_READS, False)
            else:
                self._thread.start()
        return stream

    def wrap_send(self, send: Send) -> Send:
        """`send`, dropping the SDK's answer to the request the front already answered."""
        answered = self._answered
        if answered is None:
            return send
        prefix, answer = answered
        pending = True

        async def wrapped(data: bytes) -> None:
            nonlocal pending
            if (
                pending
                and data.startswith(prefix)
                and data[len(prefix) :].startswith((b'"result":', b'"error":'))
            ):
                pending = False
                if data != answer:
                    logger.warning(
                        "front: the SDK's handshake answer differs from the one sent early "
                        "(regenerate convmem_engine/runtime/handshake_answers.py)"
                    )
                return
            await send(data)

        return wrapped

    # -- a failed open ---------------------------------------------------------------------

    def fail(self, message: str) -> None:
        """The runtime will not come: answer each request read so far with an error naming
        `message` (not those the front answered), and stop reading."""
        self.stop_answering()
        with self._cond:
            if self._state in ("handed", "failed"):
                return
            self._to_keep()
            kept = b"".join(self._kept)
            self._kept = []
            self._state = "failed"
            self._cond.notify_all()
        skip_first = self._answered is not None
        for line in kept.split(b"\n")[:-1]:  # whole lines only
            request_id = line_request_id(line)
            if request_id is None:
                continue
            if skip_first:  # the first request is the one the front answered
                skip_first = False
                continue
            body: dict[str, Any] = {
                "jsonrpc": "2.0",
                "id": request_id,
                "error": {"code": INTERNAL_ERROR, "message": message},
            }
            try:
                _write_all(self.out_fd, json.dumps(body, separators=(",", ":")).encode() + b"\n")
            except OSError:
                return


_LOOP_READS: Final = b"loop reads"
"""(Compared by identity.) In a handed stream: what follows is read by the loop itself."""


class HandedStream:
    """The session's side of a handed-over stdin (used on the session's loop): the chunks the
    front delivers, then (`_LOOP_READS`) what a `LoopReader` reads."""

    def __init__(
        self,
        slots: threading.Semaphore,
        loop: asyncio.AbstractEventLoop | None = None,
        loop_fd: int | None = None,
    ) -> None:
        import asyncio

        self._slots = slots
        self._queue: asyncio.Queue[tuple[bytes, bool]] = asyncio.Queue()
        self._closed = False
        self._loop = loop
        self._loop_fd = loop_fd
        self._reader: LoopReader | None = None
        self.lane: Lane | None = None
        """Given to the `LoopReader` once the loop reads (see `LoopReader.lane`)."""

    def put(self, chunk: bytes, slotted: bool) -> None:
        self._queue.put_nowait((chunk, slotted))

    async def read(self) -> bytes:
        if self._reader is not None:
            return await self._reader.read()
        if self._closed:
            return b""
        chunk, slotted = await self._queue.get()
        if self._closed:
            return b""
        if chunk is _LOOP_READS:
            assert self._loop is not None and self._loop_fd is not None
            self._reader = LoopReader(self._loop, self._loop_fd)
            self._reader.lane = self.lane
            return await self._reader.read()
        if slotted:
            self._slots.release()
        if not chunk:
            self._queue.put_nowait((b"", False))  # end of input stays end of input
        return chunk

    def close(self) -> None:
        """From now on reads see end of input."""
        self._closed = True
        self._queue.put_nowait((b"", False))
        if self._reader is not None:
            self._reader.close()
