"""One MCP session over any byte stream of newline-delimited JSON-RPC.

The SDK's own stdio transport drops lines it cannot parse without answering; a host waiting
for that reply would hang. Here every line gets an answer or is served:

- a line that is not UTF-8 or not JSON: JSON-RPC parse error (-32700, id null);
- JSON that is not a JSON-RPC 2.0 message (or a batch): invalid request (-32600), with the
  request's id when one can be read;
- a request whose id is not a string or an integer (a fraction, 1e400, true, null, an object or
  an array): invalid request (-32600), answered with the id when it is a finite number, else
  with id null (JSON-RPC: an id that cannot be read is answered as null);
- valid JSON the fast parser refuses (a lone surrogate escape such as "\\ud800", which
  JavaScript hosts produce; nesting deeper than it goes) is parsed again by the standard
  library and served: a lone surrogate in a tool argument then gets the tool's
  VALIDATION_ERROR ("must be valid UTF-8 text") under the request's id;
- a line longer than `MAX_LINE_BYTES`: never buffered whole; its bytes are skipped up to the
  next newline and it gets an invalid-request error (-32600) carrying the request's id when the
  id appears before "params" in the first bytes (every SDK client writes it there), else null.

After each of these the session goes on with the next line.

Back-pressure: at most `max_in_flight` requests of one session are in flight (read but not yet
answered, or answered but not yet sent). At the cap the session stops reading input until an
answer has been sent, so a host that stops reading its output cannot make the server buffer
requests and responses without bound: the pipe fills and the host's writes block.

At end of input the session first waits (up to `DRAIN_SECONDS`) for answers to the requests it
has already read, then ends: a client that writes a request and closes its side still gets the
answer.

Once the SDK has settled the session's protocol era, a `tools/call` for a tool of the server's
registry skips the SDK's dispatcher (`fast_call.py`: same checks, same answer bytes, a fraction
of the CPU); everything else, and every call the fast path does not take, goes to the SDK.

The lane (`Lane`, optional): a reader that runs on the session's loop (a protocol's callback)
may offer the bytes it has just read to the session before queuing them for `read_chunk`. The
session serves them right there when they are one whole line holding a write the fast path
serves on the loop ("One call alone") and nothing could tell the difference: its reading is
parked on `read_chunk` with no partial line, the reader has nothing else queued, nothing of the
session is in flight, no answer is being written and the output takes the answer without
waiting (`Lane.ready`). The answer is the same bytes, written through `Lane.send` (the
transport's synchronous write; when that cannot take it at once, the session's answer task
writes it, as for a call served in a thread). What it saves is the hand-over to the session's
task: a future, a task step and a loop iteration (with its `epoll_wait`) per request. Other
calls the fast path takes are started from the lane as `handle_line` starts them, and their
answers are written through the lane when they come back, if it takes them at once. Anything
else is refused (`offer` returns False) and goes the usual way, in order.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import math
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

import anyio
import anyio.abc
import mcp_types as types
import pydantic
import pydantic_core
from mcp.server import Server
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.message import SessionMessage

from convmem_engine.domain import limits as L
from convmem_engine.mcp import fast_call

logger = logging.getLogger(__name__)

MAX_LINE_BYTES: Final = 6 * (L.CONTENT_MAX_BYTES + L.METADATA_JSON_MAX_BYTES) + L.MIB
"""13 MiB. The largest valid request is a write or update with 1 MiB of content and 1 MiB of
metadata_json in which every byte is escaped as \\u00XX (6 bytes each): 12 MiB plus framing."""

READ_CHUNK_BYTES: Final = 64 * 1024
MAX_IN_FLIGHT: Final = 64
"""Requests of one session read and not yet answered (sent) before reading pauses."""
DRAIN_SECONDS: Final = 60.0
HEAD_BYTES: Final = 4096

_BOM: Final = b"\xef\xbb\xbf"

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600

Send = Callable[[bytes], Awaitable[None]]
ReadChunk = Callable[[], Awaitable[bytes]]
OnRequest = Callable[[str, dict[str, Any] | None], None]
"""Called with each well-formed request's method and params before it is served (the runtime
counts requests and reads the client's name from the handshake). Must be quick and must not
raise."""
Inline = Callable[[], bool]
"""Asked when a write arrives alone in its session: True when serving it on the loop (no
worker thread) holds up no other session (`fast_call.py`, "One call alone"). Must be quick."""


class Lane:
    """The synchronous lane between a reader on the session's loop and the session (see the
    module doc). The transport makes one per connection and passes it to `serve_chunks`; its
    reader calls `offer(data)` with bytes just read, when nothing it read before is still
    queued for `read_chunk`: True means they were served (never queue them), False that they
    must be queued as usual. `ready()` says whether the output can take an answer now (no
    waiting for the peer to read); `send(data)` writes `data` whole and returns True, or
    returns False without writing anything when it cannot do so at once; it raises when the
    output is gone."""

    __slots__ = ("offer", "ready", "send")

    def __init__(self, ready: Callable[[], bool], send: Callable[[bytes], bool]) -> None:
        self.ready = ready
        self.send = send
        self.offer: Callable[[bytes], bool] = _refuse  # the session's, while it runs


def _refuse(data: bytes) -> bool:
    return False


class ByteReader(Protocol):
    """What `serve_lines` reads from: an `asyncio.StreamReader` or anything alike."""

    async def read(self, n: int = -1) -> bytes: ...


_ID_IN_HEAD = re.compile(rb'"id"\s*:\s*("(?:[^"\\]|\\.){0,256}"|-?\d{1,19})\s*[,}]')


def error_line(request_id: str | int | float | None, code: int, message: str) -> bytes:
    """A complete JSON-RPC error response line (ASCII: a lone surrogate in an id is escaped)."""
    body = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def _request_id(value: object) -> str | int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str | int):
        return value
    return None


def _echo_id(value: object) -> str | int | float | None:
    """The id to answer an invalid request with: any string or finite number, else null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return _request_id(value)


class _NotJson(ValueError):
    pass


def _refuse_constant(name: str) -> object:
    raise _NotJson(name)  # NaN and Infinity are Python's extensions, not JSON


_NOT_JSON: Final = "not JSON"
_TOO_DEEP: Final = "too deep"


def _loads(text: str) -> tuple[str | None, object]:
    """(None, value) for valid JSON (lone surrogates allowed), else (the reason, None)."""
    try:
        return None, json.loads(text, parse_constant=_refuse_constant)
    except ValueError:
        return _NOT_JSON, None
    except RecursionError:
        return _TOO_DEEP, None


INVALID_ID: Final = "Invalid Request: id must be a string or an integer"


def _id_from_head(head: bytes) -> str | int | None:
    """The id of an oversized request, if it shows before "params" in its first bytes."""
    cut = head.find(b'"params"')
    match = _ID_IN_HEAD.search(head if cut < 0 else head[:cut])
    if match is None:
        return None
    try:
        return _request_id(json.loads(match.group(1)))
    except ValueError:
        return None


def _encode(message: types.JSONRPCMessage) -> bytes:
    """One output line. Never the input echoed back: the SDK's "Method not found" carries the
    method name as `data`, which is dropped. A lone surrogate (only in a string id the client
    sent) is written as the escape it came in as."""
    if isinstance(message, types.JSONRPCError) and message.error.code == types.METHOD_NOT_FOUND:
        error = types.ErrorData(code=message.error.code, message=message.error.message)
        message = types.JSONRPCError(jsonrpc="2.0", id=message.id, error=error)
    try:
        return message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
    except pydantic_core.PydanticSerializationError:
        body = message.model_dump(mode="json", by_alias=True, exclude_unset=True)
        return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def _on_asyncio() -> bool:
    """True when the session runs on an asyncio loop (the fast path's worker threads answer
    through it); under another anyio backend every call goes through the SDK."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class _LineSession:
    def __init__(
        self,
        server: Server[Any],
        send: Send,
        max_line_bytes: int,
        max_in_flight: int,
        on_request: OnRequest | None = None,
        inline: Inline | None = None,
        lane: Lane | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.server = server
        self.on_request = on_request
        self.send = send
        self.max_line_bytes = max_line_bytes
        self.max_in_flight = max_in_flight
        self.in_flight = 0  # == sum(self.pending.values())
        # asyncio's lock and events where the loop is asyncio's (taking the lock uncontended
        # costs nothing, an anyio Lock checks the task's cancel scopes each time; an anyio
        # Event asks which async library runs each time one is made: once per request)
        on_asyncio = _on_asyncio()
        self.new_event: Callable[[], asyncio.Event | anyio.Event] = (
            asyncio.Event if on_asyncio else anyio.Event
        )
        self.progress = self.new_event()  # set whenever a request is settled
        self.server_done = False
        # one answer at a time on the output
        self.send_lock: asyncio.Lock | anyio.Lock = asyncio.Lock() if on_asyncio else anyio.Lock()
        self.broken = False
        # requests read and not yet answered, by id as the SDK correlates them ("7" and 7 are one)
        self.pending: Counter[str | int] = Counter()
        self.settled = self.new_event()
        self.to_server, self.server_reads = anyio.create_memory_object_stream[
            SessionMessage | Exception
        ](0)
        self.server_writes, self.from_server = anyio.create_memory_object_stream[SessionMessage](0)
        self.scope: anyio.CancelScope | None = None
        self.fast: fast_call.FastCallSession | None = None
        self.inline = inline
        self.at_tail = False  # the line being handled is the last of the bytes read so far
        self.lane = lane
        self.parked = False  # reading waits in read_chunk, with no partial line kept
        self.context = contextvars.Context()  # the session's (its task's), set by `run`

    async def write(self, data: bytes) -> None:
        async with self.send_lock:
            if self.broken:
                return
            try:
                await self.send(data)
            except Exception as exc:  # the peer is gone: end the session
                self._output_closed(exc)

    def write_now(self, lane: Lane, data: bytes) -> bool:
        """`write` on the lane (the caller saw the send lock free): True when done with
        `data` (written, or dropped because the session is broken), False when the lane
        cannot write it at once (nothing written: the caller hands it to a task)."""
        if self.broken:
            return True
        try:
            return lane.send(data)
        except Exception as exc:  # the peer is gone: end the session
            self._output_closed(exc)
            return True

    def _output_closed(self, exc: Exception) -> None:
        logger.debug("session output closed: %s", type(exc).__name__)
        self.broken = True
        if self.scope is not None:
            self.scope.cancel()

    def _settle(self, request_id: str | int | None) -> None:
        if request_id is None:
            return
        key = coerce_request_id(request_id)
        if self.pending[key] > 0:
            self.pending[key] -= 1
            self.in_flight -= 1
            self.progress.set()
            if self.pending[key] == 0:
                del self.pending[key]
        if not self.pending:
            self.settled.set()

    async def writer(self) -> None:
        try:
            async with self.from_server:
                async for item in self.from_server:
                    message = item.message
                    if self.fast is not None:
                        self.fast.observe_answer(message)
                    await self.write(_encode(message))
                    if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
                        self._settle(message.id)
        finally:
            # The server side is done: no answer will come, so nothing may wait for one.
            self.server_done = True
            self.progress.set()

    async def handle_line(self, line: bytes) -> None:
        line = line.strip()
        if line.startswith(_BOM):  # some Windows shells start piped text with one
            line = line[len(_BOM) :].strip()
        if not line:
            return
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            await self.write(error_line(None, PARSE_ERROR, "Parse error: line is not valid UTF-8"))
            return
        if self.fast is not None:
            call = self.fast.take(text, self.pending)
            if call is not None:
                # alone: nothing else of this session in flight, nothing more read yet
                alone = self.in_flight == 0 and self.at_tail and self.fast.may_inline(call)
                if await self.count_request(call.request_id):
                    if self.on_request is not None:
                        self.on_request(fast_call.METHOD, call.params)
                    if alone:
                        await self.fast.serve_inline(call)
                    else:
                        self.fast.start(call)
                return
        message = await self.parse(text)
        if message is None:
            return
        if isinstance(message, types.JSONRPCRequest):
            if not await self.count_request(message.id):
                return
            if self.on_request is not None:
                self.on_request(message.method, message.params)
            if self.fast is not None:
                self.fast.observe_request(message)
        elif isinstance(message, types.JSONRPCNotification) and (
            message.method == "notifications/cancelled"
        ):
            params = message.params or {}
            request_id = _request_id(params.get("requestId"))
            self._settle(request_id)
            if self.fast is not None and request_id is not None:
                self.fast.cancel(request_id)
        await self.to_server.send(SessionMessage(message))

    async def count_request(self, request_id: str | int) -> bool:
        """Count a request as pending (waiting for room first); False if the session broke."""
        await self.wait_for_room()
        if self.broken:
            return False
        self._count(request_id)
        return True

    def _count(self, request_id: str | int) -> None:
        self.pending[coerce_request_id(request_id)] += 1
        self.in_flight += 1
        if self.settled.is_set():
            self.settled = self.new_event()

    def serve_now(self, data: bytes) -> bool:
        """The lane's `offer` (module doc): take `data` here and now if it is one line with a
        call that `handle_line` would give the fast path without waiting (room in flight):
        a write alone in the session is answered at once, as `handle_line` would on the loop;
        any other such call is started (a worker or the writer thread), as `handle_line`
        would start it. False (nothing done) otherwise."""
        fast, lane = self.fast, self.lane
        if (
            not self.parked
            or fast is None
            or lane is None
            or self.in_flight >= self.max_in_flight
            or self.broken
            or self.server_done
            or len(data) > self.max_line_bytes
            or data.find(b"\n") != len(data) - 1
        ):
            return False
        line = data.strip()
        if not line or line.startswith(_BOM):
            return False
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            return False
        call = fast.take(text, self.pending)
        if call is None:
            return False
        alone = self.in_flight == 0 and fast.may_inline(call)
        if alone and (self.send_lock.locked() or not lane.ready()):
            return False  # its answer could not be written at once: the task's way
        # as handle_line: counted (no wait: there is room), observed, answered or started
        self._count(call.request_id)
        if self.on_request is not None:
            self.on_request(fast_call.METHOD, call.params)
        if alone:
            self.context.copy().run(fast.answer, call)  # the session's context, its own copy
            if self.write_now(lane, call.line):
                self._settle(call.key)
            else:  # the output cannot take it at once: the answer task writes it
                fast.answers.put_nowait(call)
        else:
            self.context.run(fast.start, call)  # (start copies the context for the call)
        return True

    def answer_now(self, data: bytes) -> bool:
        """Write an answer at once if the lane's output takes it without waiting and no other
        answer is being written; False (nothing written) otherwise."""
        lane = self.lane
        if lane is None or self.send_lock.locked() or not lane.ready():
            return False
        return self.write_now(lane, data)

    async def wait_for_room(self) -> None:
        """Block reading while `max_in_flight` requests are unanswered."""
        while self.in_flight >= self.max_in_flight and not (self.broken or self.server_done):
            self.progress = self.new_event()
            await self.progress.wait()

    async def parse(self, text: str) -> types.JSONRPCMessage | None:
        """The message on a line, or None when the line has been answered with an error."""
        try:
            message = types.jsonrpc_message_adapter.validate_json(text, by_name=False)
        except pydantic.ValidationError:
            message = None
        if message is not None and not isinstance(message, types.JSONRPCNotification):
            return message
        # Rare paths: what the fast parser refused, and notifications (which must not carry
        # an id: a request with an unusable id would otherwise pass as one, unanswered).
        problem, value = _loads(text)
        if problem == _TOO_DEEP:
            head = text[:HEAD_BYTES].encode("utf-8", "surrogatepass")
            too_deep = "Invalid Request: values are nested too deeply"
            await self.write(error_line(_id_from_head(head), INVALID_REQUEST, too_deep))
            return None
        if problem is not None:
            await self.write(error_line(None, PARSE_ERROR, "Parse error: line is not valid JSON"))
            return None
        # a request is a message with a method and an id member (absent: a notification)
        if (
            isinstance(value, dict)
            and "method" in value
            and _request_id(value.get("id", "")) is None
        ):
            await self.write(error_line(_echo_id(value["id"]), INVALID_REQUEST, INVALID_ID))
            return None
        if message is None:
            try:
                message = types.jsonrpc_message_adapter.validate_python(value, by_name=False)
            except (pydantic.ValidationError, RecursionError):
                await self.reject(value)
                return None
        return message

    async def reject(self, value: object) -> None:
        if isinstance(value, list):
            message = "Invalid Request: batches are not supported; send one message per line"
            await self.write(error_line(None, INVALID_REQUEST, message))
            return
        request_id = _request_id(value.get("id")) if isinstance(value, dict) else None
        message = (
            "Invalid Request: not a JSON-RPC 2.0 message "
            '(needs "jsonrpc": "2.0" and a method, or a result or error)'
        )
        await self.write(error_line(request_id, INVALID_REQUEST, message))

    async def oversized(self, head: bytes) -> None:
        message = (
            f"Invalid Request: message line exceeds the limit of {self.max_line_bytes} bytes; "
            "it was discarded unread"
        )
        await self.write(error_line(_id_from_head(head), INVALID_REQUEST, message))

    async def read_lines(self, read_chunk: ReadChunk) -> None:
        buffer = bytearray()
        scanned = 0  # bytes of `buffer` known to hold no newline
        skipping = False  # inside an oversized line, dropping bytes up to its newline
        head = b""
        while True:
            self.parked = not buffer and not skipping
            try:
                chunk = await read_chunk()
            except (OSError, EOFError) as exc:
                logger.debug("session input closed: %s", type(exc).__name__)
                chunk = b""
            finally:
                self.parked = False
            if not chunk:
                break
            if skipping:
                newline = chunk.find(b"\n")
                if newline < 0:
                    continue
                skipping = False
                await self.oversized(head)
                chunk = chunk[newline + 1 :]
            buffer += chunk
            start = 0
            while True:
                newline = buffer.find(b"\n", max(start, scanned))
                if newline < 0:
                    break
                line = bytes(buffer[start:newline])
                start = newline + 1
                scanned = 0
                self.at_tail = start == len(buffer)
                if len(line) > self.max_line_bytes:
                    await self.oversized(line[:HEAD_BYTES])
                else:
                    await self.handle_line(line)
            del buffer[:start]
            scanned = len(buffer)
            if len(buffer) > self.max_line_bytes:
                head = bytes(buffer[:HEAD_BYTES])
                buffer.clear()
                scanned = 0
                skipping = True
        if skipping:
            await self.oversized(head)
        elif buffer.strip():
            self.at_tail = True
            await self.handle_line(bytes(buffer))

    async def drain(self) -> None:
        if not self.pending or self.broken:
            return
        with anyio.move_on_after(DRAIN_SECONDS) as scope:
            while self.pending and not self.broken:
                await self.settled.wait()
        if scope.cancelled_caught:
            logger.warning("input ended with %d request(s) still unanswered", len(self.pending))

    async def run(self, read_chunk: ReadChunk) -> None:
        options = self.server.create_initialization_options()
        self.context = contextvars.copy_context()
        async with anyio.create_task_group() as tg:
            self.scope = tg.cancel_scope
            self.fast = self._fast_session()
            if self.lane is not None and self.fast is not None:
                self.lane.offer = self.serve_now
            tg.start_soon(self.server.run, self.server_reads, self.server_writes, options)
            tg.start_soon(self.writer)
            if self.fast is not None:
                tg.start_soon(self.fast.writer)
            try:
                async with self.to_server:
                    await self.read_lines(read_chunk)
                    await self.drain()
                    if self.fast is not None:
                        self.fast.close_input()
            finally:
                if self.lane is not None:
                    self.lane.offer = _refuse
                self.to_server.close()
                if self.fast is not None:
                    with anyio.CancelScope(shield=True):  # the calls' threads finish first
                        await self.fast.finish()

    def _fast_session(self) -> fast_call.FastCallSession | None:
        support = fast_call.support_for(self.server)
        if support is None or not _on_asyncio():
            return None
        session = fast_call.FastCallSession(self.server, support, _encode, self.write)
        session.settle = self._settle
        session.inline = self.inline
        if self.lane is not None:
            session.write_now = self.answer_now
        return session


async def serve_chunks(
    server: Server[Any],
    read_chunk: ReadChunk,
    send: Send,
    *,
    max_line_bytes: int = MAX_LINE_BYTES,
    max_in_flight: int = MAX_IN_FLIGHT,
    on_request: OnRequest | None = None,
    inline: Inline | None = None,
    lane: Lane | None = None,
) -> None:
    """Serve one MCP session; `read_chunk()` returns the next bytes, b"" at end of input.
    `inline`: see `Inline` (None: every call the fast path takes runs in a worker thread).
    `lane`: see `Lane` (None: every byte comes through `read_chunk`)."""
    session = _LineSession(server, send, max_line_bytes, max_in_flight, on_request, inline, lane)
    await session.run(read_chunk)


async def serve_lines(
    server: Server[Any],
    reader: ByteReader,
    send: Send,
    *,
    max_line_bytes: int = MAX_LINE_BYTES,
    max_in_flight: int = MAX_IN_FLIGHT,
    on_request: OnRequest | None = None,
) -> None:
    """Serve one MCP session over an `asyncio.StreamReader` (or anything with `async read(n)`).

    `send` gets complete lines (bytes ending in b"\\n"), one call at a time. Returns when the
    reader reaches end of input and the requests already read are answered, or when `send`
    fails (the peer is gone). At most `max_in_flight` requests are unanswered at a time:
    reading pauses at the cap (back-pressure on a host that stops reading). Any number may run
    at once over one server.
    """

    async def read_chunk() -> bytes:
        return await reader.read(READ_CHUNK_BYTES)

    await serve_chunks(
        server,
        read_chunk,
        send,
        max_line_bytes=max_line_bytes,
        max_in_flight=max_in_flight,
        on_request=on_request,
    )
