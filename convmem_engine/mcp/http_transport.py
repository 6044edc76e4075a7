"""Stateless Streamable HTTP: `POST /mcp` on loopback, behind a bearer token.

The MCP work is the official SDK's: its `StreamableHTTPSessionManager` in stateless mode with
JSON responses (a bare `tools/call` is served in both protocol eras without `initialize`; no
`Mcp-Session-Id` is issued or required), its `TransportSecuritySettings` for the Host and Origin
checks and its request-body limit. Around it, `_Guard` decides, in this order:

1. path other than `/mcp` → 404;
2. foreign Host → 421, foreign Origin → 403 (the SDK's DNS-rebinding check and answers);
3. any method but POST → 405 (`Allow: POST`; a GET would open an endless event stream);
4. missing or wrong `Authorization: Bearer <token>` → 401 (constant-time compare; a token in
   the query string is never looked at);
5. a body over `max_body_bytes` → 413 before anything parses it (chunked bodies too).

Every refusal is a small JSON body. Access log lines (INFO, `convmem_engine.mcp.http`) carry the
method, the path without its query string and the status, never a header or a body.

`HttpListener` binds the sockets itself (so a busy port is a clear `HttpBindError` naming the
port before anything starts) and serves them with uvicorn, the ASGI server the SDK brings.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import math
import socket
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

import uvicorn
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from convmem_engine.mcp.http_config import (
    ENDPOINT_PATH,
    HttpBindError,
    HttpConfig,
    host_port,
)

if TYPE_CHECKING:
    from mcp.server import Server

    from convmem_engine.mcp.http_token import HttpToken

logger = logging.getLogger("convmem_engine.mcp.http")

STOP_GRACE_SECONDS: Final = 5.0
"""On stop: how long requests in progress may take to be answered before they are cancelled."""
MAX_CONNECTIONS: Final = 64
"""Connections served at once; more get 503. Bounds the memory bodies in flight can take."""

_JSON: Final = [(b"content-type", b"application/json")]


def security_settings(hosts: Sequence[str], port: int) -> TransportSecuritySettings:
    """Host and Origin values accepted: the loopback names and the bound addresses, this port."""
    names = {"127.0.0.1", "localhost", "::1", *hosts}
    allowed = sorted(host_port(name, port) for name in names if name not in {"0.0.0.0", "::"})
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=allowed,
        allowed_origins=[f"http://{value}" for value in allowed],
    )


# -- the ASGI application -----------------------------------------------------------------


async def _respond(
    send: Send, status: int, message: str, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """A JSON-RPC error body (id null) with an HTTP status."""
    body = _error_body(message)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*_JSON, (b"content-length", str(len(body)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


_VALIDATION_PREFIX: Final = "Validation error"
_NOT_A_MESSAGE: Final = "Invalid request: the body must be one JSON-RPC 2.0 message object"


class _JsonErrors:
    """Send wrapper over the SDK's answers: every error is a JSON body.

    The SDK answers some refusals in plain text (413 "Request body too large", 400 for a wrong
    Content-Type): they become the same JSON-RPC error body as ours, status unchanged. Its
    legacy transport answers JSON that is not a JSON-RPC message with a pydantic error text
    that quotes the input: that text is replaced.
    """

    def __init__(self, send: Send) -> None:
        self.send = send
        self.start: Message | None = None

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400:
            self.start = message  # held until the body shows what it is
            return
        if message["type"] == "http.response.body" and self.start is not None:
            if message.get("more_body", False):  # a streamed error: pass it on as it is
                await self.send(self.start)
            else:
                body = _json_error_body(self.start, message.get("body", b""))
                headers = [
                    (k, v)
                    for k, v in self.start["headers"]
                    if k.lower() not in {b"content-length", b"content-type"}
                ]
                headers += [*_JSON, (b"content-length", str(len(body)).encode())]
                await self.send({**self.start, "headers": headers})
                message = {**message, "body": body}
            self.start = None
        await self.send(message)


def _json_error_body(start: Message, body: bytes) -> bytes:
    content_type = dict(start["headers"]).get(b"content-type", b"")
    if content_type.startswith(b"application/json"):
        try:
            data = json.loads(body)
            if str(data["error"]["message"]).startswith(_VALIDATION_PREFIX):
                data["error"]["message"] = _NOT_A_MESSAGE
                return json.dumps(data, separators=(",", ":")).encode()
        except (ValueError, KeyError, TypeError):
            pass
        return body
    text = body.decode("utf-8", errors="replace")[:200] or "HTTP " + str(start["status"])
    return _error_body(text)


def _error_body(message: str) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}},
        separators=(",", ":"),
    ).encode()


class _Guard:
    """Path, Host/Origin, method and token checks in front of the SDK's session manager."""

    def __init__(
        self,
        manager: StreamableHTTPSessionManager,
        token: HttpToken,
        settings: TransportSecuritySettings,
    ) -> None:
        self.manager = manager
        self.token = token
        self.security = TransportSecurityMiddleware(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        status = 0

        async def watched(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._handle(scope, receive, watched)
        finally:
            # The path without its query string; never a header, never a body.
            logger.info("%s %s %d", scope.get("method", "?"), scope.get("path", "?"), status)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("path") != ENDPOINT_PATH:
            await _respond(send, 404, f"Not found: the MCP endpoint is {ENDPOINT_PATH}")
            return
        refused = await self.security.validate_request(Request(scope), is_post=False)
        if refused is not None:
            reason = bytes(refused.body).decode("utf-8", errors="replace")
            await _respond(send, refused.status_code, reason)
            return
        if scope.get("method") != "POST":
            await _respond(
                send,
                405,
                "Method not allowed: this stateless endpoint serves POST only",
                [(b"allow", b"POST")],
            )
            return
        if not self._authorized(scope):
            await _respond(
                send,
                401,
                "Unauthorized: send Authorization: Bearer <token> (see the ConvMem settings)",
                [(b"www-authenticate", b'Bearer realm="convmem"')],
            )
            return
        await self.manager.handle_request(scope, receive, _JsonErrors(send))

    def _authorized(self, scope: Scope) -> bool:
        values = [v for k, v in scope.get("headers", ()) if k.lower() == b"authorization"]
        if len(values) != 1:
            return False
        scheme, _, presented = values[0].decode("latin-1").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return self.token.matches(presented.strip())

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        message = await receive()
        if message["type"] != "lifespan.startup":
            return
        try:
            async with self.manager.run():
                await send({"type": "lifespan.startup.complete"})
                while (await receive())["type"] != "lifespan.shutdown":
                    pass
        except Exception as exc:
            logger.error("the HTTP transport failed: %s", type(exc).__name__)
            await send({"type": "lifespan.startup.failed", "message": type(exc).__name__})
            return
        await send({"type": "lifespan.shutdown.complete"})


def build_http_app(
    server: Server[Any],
    token: HttpToken,
    *,
    hosts: Sequence[str],
    port: int,
    body_limit: int,
) -> _Guard:
    """The ASGI application serving `server` at `POST /mcp` (one per listener: the SDK's session
    manager runs once)."""
    settings = security_settings(hosts, port)
    manager = StreamableHTTPSessionManager(
        app=server,
        json_response=True,
        stateless=True,
        security_settings=settings,
        max_request_body_size=body_limit,
    )
    return _Guard(manager, token, settings)


# -- the listener -------------------------------------------------------------------------


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers (the process running the listener owns signals),
    saying when it accepts connections."""

    def __init__(self, config: uvicorn.Config, started: threading.Event) -> None:
        super().__init__(config)
        self._started_event = started

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self._started_event.set()


def _expand(hosts: Sequence[str]) -> list[str]:
    out: list[str] = []
    for host in hosts:
        for name in ("127.0.0.1", "::1") if host == "localhost" else (host,):
            if name not in out:
                out.append(name)
    return out


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say TCP; a
    # proto-0 socket answers every request ~40 ms late (Nagle meets the peer's delayed ACK).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        if sys.platform == "win32":
            # Windows' SO_REUSEADDR would let another process share the port: forbid it.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)  # type: ignore[attr-defined]
        else:
            # Rebind at once after a restart (connections of the old process in TIME_WAIT).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _ipv6_unavailable(error: OSError) -> bool:
    return error.errno in {errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT}


class HttpListener:
    """The HTTP listener of one data dir: `bind()` (sync; a busy port raises `HttpBindError`
    before anything starts), then `await serve(server)` on the engine's event loop until
    `await stop(grace)` (or `request_stop()` from any thread). Sockets are closed on the way
    out, so the port is free again when `serve` returns."""

    def __init__(self, token: HttpToken, config: HttpConfig) -> None:
        self.token = token
        self.config = config
        self.sockets: list[socket.socket] = []
        self.started = threading.Event()
        """Set once uvicorn accepts connections (or `serve` ended before it could)."""
        self._uvicorn: _Server | None = None
        self._stopping = False
        self._done = threading.Event()

    @property
    def port(self) -> int:
        if not self.sockets:
            return self.config.port
        return int(self.sockets[0].getsockname()[1])

    @property
    def hosts(self) -> list[str]:
        return [str(sock.getsockname()[0]) for sock in self.sockets]

    @property
    def url(self) -> str:
        """The endpoint URL to give a host (the first bound address)."""
        host = self.hosts[0] if self.sockets else _expand(self.config.hosts)[0]
        return f"http://{host_port(host, self.port)}{ENDPOINT_PATH}"

    def bind(self) -> None:
        """Bind every configured address on one port. Port 0: the first gets a free port and
        the others share it. IPv6 loopback is skipped where the machine has none."""
        port = self.config.port
        for host in _expand(self.config.hosts):
            try:
                sock = _bind(host, port)
            except OSError as error:
                if host == "::1" and self.sockets and _ipv6_unavailable(error):
                    logger.info("IPv6 loopback is not available; serving on IPv4 only")
                    continue
                self.close()
                if error.errno in {errno.EADDRINUSE, getattr(errno, "WSAEADDRINUSE", -1)}:
                    raise HttpBindError(
                        f"port {port} is already in use on {host}; "
                        "stop the program using it or choose another port",
                        port,
                    ) from None
                if sys.platform == "win32" and error.errno in {errno.EACCES, 10013}:
                    # WSAEACCES: another socket holds it exclusively, or Windows reserved it.
                    raise HttpBindError(
                        f"port {port} is in use or reserved on {host}; choose another port", port
                    ) from None
                raise HttpBindError(
                    f"cannot listen on {host} port {port}: {error.strerror or error}", port
                ) from None
            self.sockets.append(sock)
            port = int(sock.getsockname()[1])

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self.sockets = []

    async def serve(self, server: Server[Any]) -> None:
        """Serve `server` on the bound sockets until stopped; closes them on the way out."""
        try:
            if not self.sockets:
                self.bind()
            app = build_http_app(
                server,
                self.token,
                hosts=self.hosts,
                port=self.port,
                body_limit=self.config.body_limit,
            )
            config = uvicorn.Config(
                app,
                lifespan="on",
                http="h11",
                ws="none",
                interface="asgi3",
                log_config=None,
                access_log=False,
                server_header=False,
                proxy_headers=False,
                limit_concurrency=MAX_CONNECTIONS,
                timeout_graceful_shutdown=int(STOP_GRACE_SECONDS),
            )
            self._uvicorn = _Server(config, self.started)
            self._uvicorn.should_exit = self._stopping
            await self._uvicorn.serve(sockets=self.sockets)
        finally:
            self.close()
            self.started.set()
            self._done.set()

    def request_stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """Stop accepting; requests in progress get `grace` seconds to be answered (0: cut
        them off). Any thread: uvicorn polls the flags."""
        self._stopping = True
        server = self._uvicorn
        if server is not None:
            # uvicorn takes whole seconds; "at once" is its smallest wait that still lets the
            # application shut down in order (force_exit would skip that).
            server.config.timeout_graceful_shutdown = math.ceil(grace) if grace > 0 else 0.01  # type: ignore[assignment]
            server.should_exit = True

    async def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """`request_stop(grace)` and wait (on the serving loop) until `serve` has returned."""
        self.request_stop(grace)
        if self._uvicorn is None and not self._done.is_set():
            return  # never served
        while not self._done.is_set():
            await asyncio.sleep(0.05)
