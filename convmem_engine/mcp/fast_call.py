"""`tools/call` without the SDK's dispatcher: the same answer, a fraction of the CPU.

Once a session's protocol era is settled by the SDK (the handshake answered, or the first
request of a 2026-07-28 session served), the line transport hands each `tools/call` line for a
tool of the registry here instead of to the SDK. It is served by the same steps the SDK runs,
without its per-message machinery (JSON-RPC dispatcher task, middleware chain, request context
and session objects, anyio streams and `to_thread`):

1. parse: `pydantic_core.from_json` (the parser the SDK's message adapter uses), and only a
   plain request (`jsonrpc`, `id` a string or an integer, `method`, `params` an object);
2. the checks the SDK's runner makes, with the SDK's own functions: the modern era's envelope
   ladder (`classify_inbound_request`), the legacy era's refusal of an enveloped request, the
   per-version surface check (`validate_client_request`) and `CallToolRequestParams`; run once
   per distinct `_meta` for calls of the plain shape, whose verdict depends on it alone
   (`CallChecks`), and for every other call each time;
3. `ToolRegistry.result` in a worker thread (a small pool; the caller's context variables go
   with the call), as the server's `call_tool` handler runs it; or, for a write
   (`INLINE_TOOLS`) that is alone (the session has nothing else in flight and no further
   bytes read, and the transport says no other session could be held up: `inline`), on the
   loop itself, answered at once: no thread hand-off either way, which is most of what the
   path costs beyond the call (see "One call alone" below); any other write on the writer
   thread (`_Writer`: the writes of every session in turn, made durable together by one sync
   thread, a few thread wake-ups per fsync rather than several per write);
4. the result shaped by the SDK's own serialiser (`ServerRunner._serialize`: the per-version
   sieve, `resultType` and the `serverInfo` stamp of the modern era), computed once per
   protocol version and error flag with a marker text and then filled per call, and the
   response line encoded as the line transport encodes the SDK's responses.

Anything else goes to the SDK unchanged: the handshake and every other method, a request before
the era is settled (the SDK decides it on the first request it reads), an unknown tool name,
arguments or envelope a check refuses (the SDK answers them itself, with its own error), an id
already in flight, any server with middleware (tracing) or a cache hint for `tools/call`, a
second `initialize`. `notifications/cancelled` for a fast call is honoured as the SDK honours
it: the request is never answered (a call already running finishes, its answer is dropped).
When input ends, answers still due after the drain get the SDK's "Connection closed" error,
and the session waits for its calls' threads to finish, as the SDK's does.

One call alone: a write holds the loop for its own duration (its lock, append, index update
and fsync: ~0.3 ms; the loop's thread releases the GIL while it waits for the disk). Only the
session's own later requests could be held up, and there are none read yet; a
`notifications/cancelled` for it can only arrive after its answer, which the SDK's path also
answers when the call finishes first. The transport decides for the other sessions on the
same loop (`Runtime.serve_session`: only while its session is the runtime's only client).

`CONVMEM_MCP_FAST_PATH=0` turns it off (every request then goes through the SDK):
tests/mcp/test_fast_call.py drives the same requests both ways and compares the bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import queue
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import mcp_types as types
import pydantic_core
from mcp.server import Server
from mcp.server.runner import ServerRunner, modern_error_data
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.inbound import InboundLadderRejection, classify_inbound_request
from mcp_types import methods as _methods

from convmem_engine.mcp.envelope import call_tool_result
from convmem_engine.service.memory_service import DEFERRED_DURABILITY
from convmem_engine.tools import ToolRegistry, ToolResult

logger = logging.getLogger(__name__)

ENV_SWITCH: Final = "CONVMEM_MCP_FAST_PATH"
METHOD: Final = "tools/call"
POOL_THREADS: Final = 40
"""Worker threads at most (anyio's default for `to_thread`): more calls than that at once queue."""

INLINE_TOOLS: Final = frozenset({"write_message", "update_message", "delete_message"})
"""Tools served on the loop when a call is alone: bounded work (one message, one fsync)."""

_MARKER: Final = "convmem-fast-call-marker-5f0c9a"
_REQUEST_KEYS: Final = frozenset({"jsonrpc", "id", "method", "params"})

Encode = Callable[[types.JSONRPCMessage], bytes]
Write = Callable[[bytes], Awaitable[None]]
Settle = Callable[[str | int], None]


def enabled_by_environment() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip() not in {"0", "false", "no", "off"}


# ---- which servers have a fast path --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FastCallSupport:
    """What `build_server` registers for its server: the registry its `tools/call` handler
    runs, that handler (the fast path stands in for it only while it is still the one), and
    the tools the handler does not simply run through the registry (they go to the SDK)."""

    registry: ToolRegistry
    handler: object
    exclude: frozenset[str]


_SUPPORT: weakref.WeakKeyDictionary[Server[Any], FastCallSupport] = weakref.WeakKeyDictionary()


def register(
    server: Server[Any],
    registry: ToolRegistry,
    handler: object,
    *,
    exclude: frozenset[str] = frozenset(),
) -> None:
    """`server`'s `tools/call` handler is `handler`, and for every tool of `registry` but
    those in `exclude` it answers what `ToolRegistry.result` gives, shaped by `call_tool_result`
    (a wrapper that intercepts some tools registers itself with them excluded)."""
    _SUPPORT[server] = FastCallSupport(registry, handler, exclude)


def support_for(server: Server[Any]) -> FastCallSupport | None:
    """The fast path's support for `server`, or None when every call must go to the SDK."""
    support = _SUPPORT.get(server)
    if support is None or not enabled_by_environment():
        return None
    entry = server.get_request_handler(METHOD)
    if entry is None or entry.handler is not support.handler:
        return None
    if server.middleware or METHOD in server.cache_hints:
        return None  # middleware sees (and may change) every request; hints change results
    return support


# ---- worker threads ------------------------------------------------------------------------


Job = Callable[[], Callable[[], None]]
"""Work for a pool thread; returns what to do once the thread counts as idle again (hand the
result back), so the next job submitted after the result arrives finds this thread free."""


class _CallPool:
    """Daemon worker threads taking jobs from one queue; a new thread whenever no idle one is
    free (up to `POOL_THREADS`), so a slow call never holds up another."""

    def __init__(self, max_threads: int) -> None:
        self._max = max_threads
        self._jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # threads waiting for a job and not yet promised one

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
            elif self._threads < self._max:
                self._threads += 1
                name = f"convmem-call-{self._threads}"
                threading.Thread(target=self._work, name=name, daemon=True).start()
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                deliver = job()
            except BaseException:  # a job reports its own failures; never lose the thread
                logger.exception("fast call job raised")
                deliver = _nothing
            with self._lock:
                self._idle += 1
            deliver()


def _nothing() -> None:
    pass


_POOL_LOCK = threading.Lock()
_POOL: _CallPool | None = None


def _pool() -> _CallPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = _CallPool(POOL_THREADS)
        return _POOL


WRITER_BATCH: Final = 64
"""Writes the writer thread takes at once at most."""

WriteJob = tuple["FastCallSession", "FastCall", contextvars.Context]
Finishing = tuple[list[Callable[[], None]], WriteJob]
"""A write stored and indexed, and what is left of it (its fsync, its change event)."""


def _drain(jobs: queue.SimpleQueue[Any], first: Any) -> list[Any]:
    """`first` and whatever else is queued, at most `WRITER_BATCH`."""
    batch = [first]
    while len(batch) < WRITER_BATCH:
        try:
            batch.append(jobs.get_nowait())
        except queue.Empty:
            break
    return batch


class _Writer:
    """Two threads for the writes (`INLINE_TOOLS`) that cannot run on their session's loop.

    The writer thread takes every write queued so far (in arrival order) and runs each with
    its durability deferred (`DEFERRED_DURABILITY`: stored and indexed; its fsync and change
    event left for later), then hands them to the sync thread and goes on with the next
    writes. The sync thread takes every stored write handed over so far and makes them durable
    together (the first `store.sync` covers every record appended before it; the others find
    theirs done), publishes their change events, each in its own call's context, and hands the
    answers back to each loop at once. A write whose fsync failed is answered with that error,
    as it would be alone. While one batch waits for the disk, the next one is stored: the
    overlap a worker thread per write had, with none of its cost per write.

    Against a worker thread per write waiting in `store.sync`'s group commit, the same shared
    fsyncs cost a few thread wake-ups per batch instead of a thread hand-off, a
    condition-variable wait and a loop wake-up per write, and many threads taking turns at the
    GIL."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[WriteJob] = queue.SimpleQueue()
        self._stored: queue.SimpleQueue[list[Finishing]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._started = False

    def submit(self, job: WriteJob) -> None:
        if not self._started:
            with self._lock:
                if not self._started:
                    for target, name in ((self._write, "writer"), (self._sync, "sync")):
                        thread = threading.Thread(target=target, name=f"convmem-{name}")
                        thread.daemon = True
                        thread.start()
                    self._started = True
        self._jobs.put(job)

    def _write(self) -> None:
        while True:
            batch: list[WriteJob] = _drain(self._jobs, self._jobs.get())
            stored: list[Finishing] = []
            for job in batch:
                session, call, context = job
                deferred: list[Callable[[], None]] = []
                try:
                    context.run(session._answer_deferred, call, deferred)
                except BaseException:  # never lose the thread or a call (it is answered)
                    logger.exception("fast call writer raised")
                stored.append((deferred, job))
            self._stored.put(stored)

    def _sync(self) -> None:
        while True:
            stored: list[Finishing] = [
                item for items in _drain(self._stored, self._stored.get()) for item in items
            ]
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[FastCallSession, FastCall]]] = {}
            for deferred, (session, call, context) in stored:
                for finish in deferred:
                    try:
                        context.run(finish)
                    except Exception as exc:  # not durable: the call's answer is this error
                        call.line = session._failed(call, exc)
                        break
                by_loop.setdefault(session.loop, []).append((session, call))
            for loop, done in by_loop.items():
                with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                    loop.call_soon_threadsafe(_done_all, done)


def _done_all(done: list[tuple[FastCallSession, FastCall]]) -> None:
    for session, call in done:
        session._done(call)


_WRITER_LOCK = threading.Lock()
_WRITER: _Writer | None = None


def _writer() -> _Writer:
    global _WRITER
    with _WRITER_LOCK:
        if _WRITER is None:
            _WRITER = _Writer()
        return _WRITER


# ---- one session ---------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class FastCall:
    """One `tools/call` taken by the fast path."""

    request_id: str | int
    key: str | int  # the id as the SDK correlates it ("7" and 7 are one id)
    version: str
    modern: bool
    name: str
    arguments: dict[str, Any]
    params: dict[str, Any]
    cancelled: bool = False
    line: bytes = field(default=b"")


def _has_modern_envelope(params: Mapping[str, Any] | None) -> bool:
    """As the SDK's runner decides an era: `params._meta` carries the protocol-version key."""
    if not params:
        return False
    meta = params.get("_meta")
    return isinstance(meta, Mapping) and types.PROTOCOL_VERSION_META_KEY in meta


Checked = tuple[str, str, dict[str, Any]]
"""A call's params as the SDK's checks pass them: (protocol version, tool name, arguments)."""


def sdk_check(params: dict[str, Any], modern: bool, handshake_version: str) -> Checked | None:
    """The checks the SDK's runner makes on a `tools/call`'s params, with its own functions:
    the modern era's envelope ladder (`classify_inbound_request`) or the legacy era's refusal
    of an enveloped request, the per-version surface check (`validate_client_request`) and
    `CallToolRequestParams`. None when one of them refuses the params."""
    if modern:
        route = classify_inbound_request({"method": METHOD, "params": params})
        if isinstance(route, InboundLadderRejection):
            return None
        version = route.protocol_version
    else:
        if _has_modern_envelope(params):
            return None  # the SDK refuses it on a handshake connection
        version = handshake_version
    try:
        _methods.validate_client_request(METHOD, version, params)
        typed = types.CallToolRequestParams.model_validate(params, by_name=False)
    except Exception:
        return None
    return version, typed.name, dict(typed.arguments or {})


_PLAIN_PARAMS: Final = frozenset({"name", "arguments", "_meta"})
_NO_META: Final = b""
_NO_ARGUMENTS: Final[Any] = object()
CHECKS_KEPT: Final = 32
"""Envelopes whose verdict a session remembers (a host sends the same one with every call)."""


class CallChecks:
    """`sdk_check` without running the SDK's validation for every call (it is most of the
    fast path's own CPU: ~15 µs a call, ~30 µs on 2026-07-28).

    For params of the plain shape (`name` a string, `arguments` absent or an object, nothing
    else but `_meta`), what the SDK's checks decide depends on the `_meta` alone (and the era
    and the negotiated version): every other field of the surface models is optional, `name`
    is any string, `arguments` an object of anything, and no model has a validator tying
    fields together. So the first call with a given `_meta` (compared by its exact JSON: 1,
    1.0 and true are not one value) runs the SDK's checks; when they pass, later plain calls
    with the same `_meta` pass with the same protocol version. Anything else runs the SDK's
    checks every time. tests/mcp/test_fast_call_checks.py proves the two agree (hypothesis)."""

    def __init__(self) -> None:
        self._passed: dict[tuple[bool, str, bytes], str] = {}

    def check(self, params: dict[str, Any], modern: bool, handshake_version: str) -> Checked | None:
        name = params.get("name")
        arguments = params.get("arguments", _NO_ARGUMENTS)
        if (
            type(name) is not str
            or (arguments is not _NO_ARGUMENTS and type(arguments) is not dict)
            or not params.keys() <= _PLAIN_PARAMS
        ):
            return sdk_check(params, modern, handshake_version)
        try:
            meta = pydantic_core.to_json(params["_meta"]) if "_meta" in params else _NO_META
        except pydantic_core.PydanticSerializationError:
            return sdk_check(params, modern, handshake_version)
        key = (modern, "" if modern else handshake_version, meta)
        version = self._passed.get(key)
        if version is None:
            checked = sdk_check(params, modern, handshake_version)
            if checked is not None and len(self._passed) < CHECKS_KEPT:
                self._passed[key] = checked[0]
            return checked
        return version, name, dict(arguments) if arguments is not _NO_ARGUMENTS else {}


class FastCallSession:
    """The fast path's side of one line session: what the SDK has settled (era, negotiated
    version), the calls in flight, and the task writing their answers."""

    def __init__(
        self, server: Server[Any], support: FastCallSupport, encode: Encode, write: Write
    ) -> None:
        self.server = server
        self.registry = support.registry
        self.exclude = support.exclude
        self.encode = encode
        self.write = write
        self.settle: Settle = lambda _key: None
        self.write_now: Callable[[bytes], bool] | None = None  # the transport's, if it can
        self.inline: Callable[[], bool] | None = None  # the transport's say (see module doc)
        self.era: str | None = None  # "legacy" or "modern", once the SDK has seen a request
        self.handshake_version: str | None = None  # legacy: negotiated by the first initialize
        self.initialize_requests = 0
        self.initialize_id: str | int | None = None
        self.in_flight: dict[str | int, FastCall] = {}
        self.running = 0  # calls submitted and not yet back on the loop
        self.closing = False  # input ended and the drain is over
        self.loop = asyncio.get_running_loop()
        self.answers: asyncio.Queue[FastCall | None] = asyncio.Queue()
        self.idle = asyncio.Event()
        self.idle.set()
        self.shapes: dict[tuple[str, bool], dict[str, Any] | None] = {}
        self.checks = CallChecks()
        self.runner = ServerRunner(server, None, None)  # type: ignore[arg-type]  # shapes only

    # -- what the SDK has settled --------------------------------------------------------------

    def observe_request(self, message: types.JSONRPCRequest) -> None:
        """Every request the SDK is given, in order (it decides the era on the first one)."""
        if self.era is None:
            opens_modern = message.method != "initialize" and _has_modern_envelope(message.params)
            self.era = "modern" if opens_modern else "legacy"
        if message.method == "initialize":
            self.initialize_requests += 1
            self.initialize_id = message.id
            self.handshake_version = None
            # A second handshake re-negotiates; such a session is left to the SDK entirely.

    def observe_answer(self, message: types.JSONRPCMessage) -> None:
        """Every answer the SDK sends: the first initialize's success settles the version."""
        if (
            self.initialize_requests == 1
            and self.handshake_version is None
            and isinstance(message, types.JSONRPCResponse)
            and message.id == self.initialize_id
        ):
            version = message.result.get("protocolVersion")
            if isinstance(version, str):
                self.handshake_version = version

    # -- taking a request ----------------------------------------------------------------------

    def take(self, text: str, pending: Mapping[str | int, int]) -> FastCall | None:
        """The call on this line if the fast path serves it exactly as the SDK would, else
        None (the line then goes to the SDK as it is)."""
        if self.era is None or METHOD not in text:
            return None
        if self.era == "legacy" and (
            self.handshake_version is None or self.initialize_requests != 1
        ):
            return None
        try:
            body = pydantic_core.from_json(text, allow_inf_nan=False)
        except ValueError:
            return None
        if not isinstance(body, dict) or body.keys() != _REQUEST_KEYS:
            return None
        request_id, params = body["id"], body["params"]
        if (
            body["jsonrpc"] != "2.0"
            or body["method"] != METHOD
            or type(request_id) not in (str, int)
            or type(params) is not dict
        ):
            return None
        key = coerce_request_id(request_id)
        if key in pending:
            return None  # a duplicate id in flight: the SDK's bookkeeping decides
        modern = self.era == "modern"
        checked = self.checks.check(params, modern, self.handshake_version or "")
        if checked is None:
            return None  # the SDK answers it with its own error
        version, name, arguments = checked
        if name not in self.registry or name in self.exclude:
            return None
        return FastCall(request_id, key, version, modern, name, arguments, params)

    def start(self, call: FastCall) -> None:
        """Run `call` (already counted as pending by the session) in another thread: a write
        on the writer thread (`_Writer`), any other call in a worker thread."""
        self.in_flight[call.key] = call
        self.running += 1
        self.idle.clear()
        context = contextvars.copy_context()  # the session's context: who is calling
        if call.name in INLINE_TOOLS:
            _writer().submit((self, call, context))
        else:
            _pool().submit(lambda: context.run(self._run, call))

    def may_inline(self, call: FastCall) -> bool:
        """Whether `call`, alone in its session, may be served on the loop (`serve_inline`)."""
        return (
            call.name in INLINE_TOOLS
            and self.running == 0
            and self.inline is not None
            and self.inline()
        )

    async def serve_inline(self, call: FastCall) -> None:
        """Run `call` (already counted as pending) on this thread and write its answer."""
        contextvars.copy_context().run(self._answer, call)  # its own context, as on a thread
        await self.write(call.line)
        self.settle(call.key)

    def answer(self, call: FastCall) -> None:
        """Run `call` on this thread (in the caller's context); its answer is `call.line`
        (the line transport's lane writes it: `serve_inline` without the await)."""
        self._answer(call)

    def cancel(self, request_id: str | int) -> None:
        """`notifications/cancelled` for `request_id`: a fast call of that id is never answered."""
        call = self.in_flight.get(coerce_request_id(request_id))
        if call is not None:
            call.cancelled = True

    # -- the worker thread ---------------------------------------------------------------------

    def _run(self, call: FastCall) -> Callable[[], None]:
        self._answer(call)
        return lambda: self._hand_back(call)

    def _answer_deferred(self, call: FastCall, deferred: list[Callable[[], None]]) -> None:
        """`_answer` with the call's durability left in `deferred` (the writer thread)."""
        DEFERRED_DURABILITY.set(deferred)  # in the call's own context: nothing else sees it
        self._answer(call)

    def _answer(self, call: FastCall) -> None:
        try:
            result = self.registry.result(call.name, call.arguments)
            call.line = self._response(call, result)
        except Exception as exc:
            call.line = self._failure(call, exc)

    def _failed(self, call: FastCall, exc: Exception) -> bytes:
        """The answer to `call` when making it durable raised `exc` (the writer's sync)."""
        try:
            return self._response(call, self.registry.failure(call.name, exc))
        except Exception as failure:
            return self._failure(call, failure)

    def _hand_back(self, call: FastCall) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for it any more
            self.loop.call_soon_threadsafe(self._done, call)

    def _response(self, call: FastCall, result: ToolResult) -> bytes:
        shape = self._shape(call.version, result.is_error)
        if shape is None:  # the serialiser's output had an unexpected form: use it per call
            wire = self.runner._serialize(METHOD, call.version, call_tool_result(result))
        else:
            wire = dict(shape)
            wire["content"] = [{**shape["content"][0], "text": result.text}]
        body = {"jsonrpc": "2.0", "id": call.request_id, "result": wire}
        try:
            return pydantic_core.to_json(body) + b"\n"
        except pydantic_core.PydanticSerializationError:
            message = types.JSONRPCResponse(jsonrpc="2.0", id=call.request_id, result=wire)
            return self.encode(message)

    def _shape(self, version: str, is_error: bool) -> dict[str, Any] | None:
        """The SDK's wire form of a one-text result at `version`, with the marker text."""
        try:
            return self.shapes[(version, is_error)]
        except KeyError:
            pass
        wire = self.runner._serialize(
            METHOD, version, call_tool_result(ToolResult(_MARKER, is_error))
        )
        content = wire.get("content")
        shape: dict[str, Any] | None = wire
        if (
            not isinstance(content, list)
            or len(content) != 1
            or not isinstance(content[0], dict)
            or content[0].get("text") != _MARKER
            or pydantic_core.to_json(wire).count(_MARKER.encode()) != 1
        ):
            shape = None
        self.shapes[(version, is_error)] = shape
        return shape

    def _failure(self, call: FastCall, exc: Exception) -> bytes:
        """What the SDK's dispatcher answers when a handler raises something unmapped."""
        if call.modern:
            error = modern_error_data(exc)
        else:  # the dispatcher's code 0 with the exception's text (logged by type only here)
            logger.error("handler for %r raised %s", METHOD, type(exc).__name__)
            error = types.ErrorData(code=0, message=str(exc))
        return self.encode(types.JSONRPCError(jsonrpc="2.0", id=call.request_id, error=error))

    # -- back on the loop ----------------------------------------------------------------------

    def _done(self, call: FastCall) -> None:
        self.running -= 1
        if self.in_flight.get(call.key) is call:
            del self.in_flight[call.key]
        if not call.cancelled:
            if self.closing:
                error = types.ErrorData(code=types.CONNECTION_CLOSED, message="Connection closed")
                call.line = self.encode(
                    types.JSONRPCError(jsonrpc="2.0", id=call.request_id, error=error)
                )
            write_now = self.write_now
            if self.answers.empty() and write_now is not None and write_now(call.line):
                self.settle(call.key)  # written at once: no hand-over to `writer`
            else:
                self.answers.put_nowait(call)
        if self.running == 0:
            self.idle.set()

    async def writer(self) -> None:
        """Write each answer, then settle its request (a task of the session)."""
        while True:
            call = await self.answers.get()
            if call is None:
                return
            await self.write(call.line)
            self.settle(call.key)

    def close_input(self) -> None:
        """Input has ended and the drain is over: answers still due are "Connection closed"."""
        self.closing = True

    async def finish(self) -> None:
        """Wait for the calls' threads (as the SDK waits for its handlers), then end `writer`."""
        await self.idle.wait()
        self.answers.put_nowait(None)
