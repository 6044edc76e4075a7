"""The stdio front of `convmem serve`: the handshake answered before the SDK and the store load.

Standard library only, so it runs a few tens of milliseconds after the process starts. Once the
data dir's lock is held (`Runtime.open(on_locked=...)`), `StdioFront.start()` reads stdin on a
thread of its own, keeps every byte it reads, and answers the session's first request when it
is a handshake it is sure about: `initialize` (the handshake eras, 2025-11-25 and older) or
`server/discover` (2026-07-28). The answer is the SDK server's own answer to that request, byte
for byte: the bytes come from `handshake_answers` (generated from the real server by
`scripts/gen_handshake_answers.py`; tests/runtime/test_front.py proves them identical to what the
live SDK answers, for every protocol version and every request shape the front accepts).
Anything the front is not sure about (another method, params it does not know, an unusual id,
an escape sequence, a line that is not the first request) it leaves to the SDK: that request
then waits for the runtime like every other one.

When the runtime is running, `StdioListener` takes the stream over (`handover`): the session
reads every byte the front kept, in order (including the request the front answered, so the
SDK's session state is exactly as if it had answered it), then the rest of stdin. The SDK's
answer to the request the front already answered is swallowed by id (`wrap_send`), so the host
sees one answer per request. Tool calls that arrive before the handover wait for it: they are
never refused because the store is still opening.

When the open fails after the lock was taken (a corrupt store, a broken agent.yaml), `fail`
answers each request read so far (except the one the front answered) with a JSON-RPC error
saying why, before `convmem serve` exits with its usual status and stderr line.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from convmem_engine.runtime import handshake_answers as answers

if TYPE_CHECKING:
    import asyncio

logger = logging.getLogger(__name__)

READ_CHUNK_BYTES: Final = 64 * 1024
"""As the line transport reads (`line_transport.READ_CHUNK_BYTES`)."""
READ_AHEAD_CHUNKS: Final = 4
"""After the handover: chunks read ahead of the session (as `StdioListener` does)."""
PRE_HANDOVER_BYTES: Final = 1024 * 1024
"""Before the handover the front stops reading once it keeps this many bytes (the host's
writes then block: back-pressure, as the session's own in-flight cap gives later)."""
FIRST_LINE_BYTES: Final = 64 * 1024
"""A first line longer than this is not a handshake the front answers."""
INTERNAL_ERROR: Final = -32603

_BOM: Final = b"\xef\xbb\xbf"
_PLAIN_STRING_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
_MAX_INT_ID: Final = 2**53

Send = Callable[[bytes], Awaitable[None]]
ReadChunk = Callable[[], Awaitable[bytes]]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _request_id(value: object) -> str | int | None:
    """The id of a request as the line transport reads it (a string or an integer)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str | int):
        return value
    return None


# ---- what the front answers ----------------------------------------------------------------


def _plain_id(value: object) -> bytes | None:
    """The id as the SDK writes it back, for ids whose spelling cannot differ; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and -_MAX_INT_ID < value < _MAX_INT_ID:
        return str(value).encode("ascii")
    if isinstance(value, str) and _PLAIN_STRING_ID.fullmatch(value):
        return b'"' + value.encode("ascii") + b'"'
    return None


def _is_str_map(value: object, required: frozenset[str], optional: frozenset[str]) -> bool:
    return (
        isinstance(value, dict)
        and required <= value.keys() <= required | optional
        and all(isinstance(v, str) for v in value.values())
    )


_IMPLEMENTATION_REQUIRED: Final = frozenset({"name", "version"})
_IMPLEMENTATION_OPTIONAL: Final = frozenset({"title", "description"})


def _empty_object(value: object) -> bool:
    return isinstance(value, dict) and not value


def _known_capabilities(value: object, *, modern: bool) -> bool:
    """Client capabilities in the shapes hosts send, each of which the SDK accepts (the tests
    check every one): roots ({} or listChanged), sampling and elicitation ({} or their empty
    sub-capabilities), and on 2026-07-28 extensions with empty settings."""
    if not isinstance(value, dict):
        return False
    for key, item in value.items():
        if not isinstance(item, dict):
            return False
        if key == "roots":
            if modern and item:
                return False
            if not item.keys() <= {"listChanged"} or not all(
                isinstance(flag, bool) for flag in item.values()
            ):
                return False
        elif key == "sampling":
            if not item.keys() <= {"context", "tools"}:
                return False
            if not all(map(_empty_object, item.values())):
                return False
        elif key == "elicitation":
            if not item.keys() <= {"form", "url"} or not all(map(_empty_object, item.values())):
                return False
        elif key == "extensions" and modern:
            if not all(isinstance(k, str) and _empty_object(v) for k, v in item.items()):
                return False
        else:
            return False
    return True


def _initialize_answer(params: object) -> bytes | None:
    if not isinstance(params, dict) or params.keys() != {
        "protocolVersion",
        "capabilities",
        "clientInfo",
    }:
        return None
    version = params["protocolVersion"]
    if not isinstance(version, str) or not _is_str_map(
        params["clientInfo"], _IMPLEMENTATION_REQUIRED, _IMPLEMENTATION_OPTIONAL
    ):
        return None
    if not _known_capabilities(params["capabilities"], modern=False):
        return None
    return answers.INITIALIZE.get(version, answers.INITIALIZE[answers.LATEST_HANDSHAKE_VERSION])


def _discover_answer(params: object) -> bytes | None:
    if not isinstance(params, dict) or params.keys() != {"_meta"}:
        return None
    meta = params["_meta"]
    version_key, info_key, capabilities_key = answers.ENVELOPE_KEYS
    if not isinstance(meta, dict) or not {version_key, capabilities_key} <= meta.keys() <= {
        version_key,
        info_key,
        capabilities_key,
    }:
        return None
    version = meta[version_key]
    if not isinstance(version, str) or version not in answers.DISCOVER:
        return None
    if info_key in meta and not _is_str_map(
        meta[info_key], _IMPLEMENTATION_REQUIRED, _IMPLEMENTATION_OPTIONAL
    ):
        return None
    if not _known_capabilities(meta[capabilities_key], modern=True):
        return None
    return answers.DISCOVER[version]


def answer_for(line: bytes) -> tuple[bytes, bytes] | None:
    """(the id as written back, the complete answer line) when `line`, as the first request of
    a session, is a handshake whose SDK answer the front knows byte for byte; else None."""
    line = line.strip()
    if line.startswith(_BOM) or not line.startswith(b"{") or b"\\" in line:
        return None  # escapes may be read differently by the SDK's parser: leave them to it
    try:
        value = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or value.keys() != {"jsonrpc", "id", "method", "params"}:
        return None
    if value["jsonrpc"] != "2.0":
        return None
    request_id = _plain_id(value["id"])
    if request_id is None:
        return None
    method = value["method"]
    if method == "initialize":
        tail = _initialize_answer(value["params"])
    elif method == "server/discover":
        tail = _discover_answer(value["params"])
    else:
        return None
    if tail is None:
        return None
    return request_id, b'{"jsonrpc":"2.0","id":' + request_id + tail


# ---- the stream -----------------------------------------------------------------------------


class StdioFront:
    """Reads `in_fd` from `start()` on; answers the first request when it can; keeps every
    byte for the session that takes over (`handover`), or answers with errors (`fail`)."""

    def __init__(self, in_fd: int, out_fd: int) -> None:
        self.in_fd = in_fd
        self.out_fd = out_fd
        self._cond = threading.Condition()
        self._kept: list[bytes] = []  # every chunk read before the handover, in order
        self._kept_bytes = 0
        self._eof = False
        self._first = bytearray()  # the input up to the first non-blank line's newline
        self._decided = False  # the first request was looked at (answered or left to the SDK)
        self._answered: tuple[bytes, bytes] | None = None  # (id prefix, answer line)
        self._state = "new"  # new -> reading -> handed / failed
        self._deliver: Callable[[bytes, bool], object] | None = None
        self._slots = threading.Semaphore(READ_AHEAD_CHUNKS)
        self._thread = threading.Thread(target=self._run, name="convmem-stdin", daemon=True)

    def start(self) -> None:
        """Start reading and answering (call once the data dir's lock is held)."""
        with self._cond:
            if self._state != "new":
                return
            self._state = "reading"
        self._thread.start()

    # -- the reader thread ---------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._state == "reading" and self._kept_bytes >= PRE_HANDOVER_BYTES:
                    self._cond.wait()
                if self._state == "failed":
                    return
                handed = self._state == "handed"
            if handed:
                self._slots.acquire()
            try:
                chunk = os.read(self.in_fd, READ_CHUNK_BYTES)
            except OSError:
                chunk = b""
            with self._cond:
                if self._state == "reading":
                    self._keep(chunk)
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

    def _keep(self, chunk: bytes) -> None:
        """(Holding the lock.) Keep a chunk read before the handover; answer the first
        request once its line is complete, if the front knows the answer."""
        if not chunk:
            self._eof = True
            return
        self._kept.append(chunk)
        self._kept_bytes += len(chunk)
        if self._decided:
            return
        self._first += chunk
        while True:
            newline = self._first.find(b"\n")
            if newline < 0:
                if len(self._first) > FIRST_LINE_BYTES:
                    self._decided = True
                return
            line = bytes(self._first[:newline])
            del self._first[: newline + 1]
            if line.strip():
                break  # the first line the session will not skip as blank
        self._decided = True
        self._first.clear()
        found = answer_for(line)
        if found is None:
            return
        request_id, answer = found
        try:
            _write_all(self.out_fd, answer)
        except OSError as exc:  # the host is gone: the session will find out
            logger.debug("front: stdout closed: %s", type(exc).__name__)
            return
        self._answered = (b'{"jsonrpc":"2.0","id":' + request_id + b",", answer)
        logger.debug("front: answered the handshake before the runtime was ready")

    # -- the hand-over ---------------------------------------------------------------------

    def handover(self, loop: asyncio.AbstractEventLoop) -> HandedStream:
        """Give the stream to a session on `loop` (call on that loop): its `read()` yields
        every byte the front kept, then the rest of stdin; b"" at end of input."""
        stream = HandedStream(self._slots)
        with self._cond:
            if self._state == "failed":
                raise RuntimeError("the front failed: there is no stream to hand over")
            kept, self._kept = self._kept, []
            eof = self._eof
            started = self._state != "new"
            self._state = "handed"
            self._deliver = lambda chunk, slotted: loop.call_soon_threadsafe(
                stream.put, chunk, slotted
            )
            self._cond.notify_all()
        for chunk in kept:
            stream.put(chunk, False)
        if eof:
            stream.put(b"", False)
        elif not started:  # the lock was never reported (a custom open): read from here on
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
        `message` (not the one the front answered), and stop reading."""
        with self._cond:
            if self._state in ("handed", "failed"):
                return
            kept = b"".join(self._kept)
            self._kept = []
            self._state = "failed"
            self._cond.notify_all()
        skip_first = self._answered is not None
        for line in kept.split(b"\n")[:-1]:  # whole lines only
            request_id = _line_request_id(line)
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


class HandedStream:
    """The session's side of a handed-over stdin (used on the session's loop)."""

    def __init__(self, slots: threading.Semaphore) -> None:
        import asyncio

        self._slots = slots
        self._queue: asyncio.Queue[tuple[bytes, bool]] = asyncio.Queue()
        self._closed = False

    def put(self, chunk: bytes, slotted: bool) -> None:
        self._queue.put_nowait((chunk, slotted))

    async def read(self) -> bytes:
        if self._closed:
            return b""
        chunk, slotted = await self._queue.get()
        if self._closed:
            return b""
        if slotted:
            self._slots.release()
        if not chunk:
            self._queue.put_nowait((b"", False))  # end of input stays end of input
        return chunk

    def close(self) -> None:
        """From now on reads see end of input."""
        self._closed = True
        self._queue.put_nowait((b"", False))


def _line_request_id(line: bytes) -> str | int | None:
    line = line.strip()
    if line.startswith(_BOM):
        line = line[len(_BOM) :]
    try:
        value = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or "method" not in value:
        return None
    return _request_id(value.get("id"))
