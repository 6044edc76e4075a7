"""The HTTP listener of a runtime: `POST /mcp` (`convmem_engine.mcp.http_transport`) on the
runtime's engine loop, serving the runtime's MCP server.

`start` binds before anything is served, so a busy port is a `ListenerError` naming the port
and the runtime goes on with its other listeners (the app keeps its pipe). `stop(grace)` stops
accepting, answers the requests in progress within `grace` seconds and releases the port.

HTTP is stateless: a request is not a connected client, so nothing is added to
`runtime.clients`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from convmem_engine.mcp.http_config import (
    DEFAULT_PORT,
    LOOPBACK_HOSTS,
    HttpBindError,
    HttpConfig,
    is_loopback,
)
from convmem_engine.mcp.http_token import ENV_VAR, TOKEN_FILE_NAME, HttpToken, TokenError
from convmem_engine.runtime.runtime import ListenerError

if TYPE_CHECKING:
    from convmem_engine.runtime.runtime import Runtime

logger = logging.getLogger(__name__)

START_TIMEOUT: Final = 30.0


class HttpRuntimeListener:
    """A runtime `Listener` (transport "http")."""

    transport = "http"

    def __init__(self, token: HttpToken, config: HttpConfig) -> None:
        from convmem_engine.mcp.http_transport import HttpListener  # the transport on demand

        self.http = HttpListener(token, config)
        self._serving: concurrent.futures.Future[None] | None = None

    @property
    def url(self) -> str:
        return self.http.url

    @property
    def port(self) -> int:
        return self.http.port

    @property
    def hosts(self) -> list[str]:
        return self.http.hosts

    def start(self, runtime: Runtime) -> None:
        # The body limit admits the largest request the runtime's tools take: the runtime's
        # message limit (raised by the agent part for its configured images) when larger.
        limit = max(self.http.config.body_limit, getattr(runtime, "max_line_bytes", 0))
        self.http.config = dataclasses.replace(self.http.config, body_limit=limit)
        try:
            self.http.bind()
        except HttpBindError as error:
            raise ListenerError(str(error)) from None
        self._serving = runtime.loop.submit(self.http.serve(runtime.server))
        if not self.http.started.wait(START_TIMEOUT) or self._serving.done():
            self.http.request_stop(0)
            self.http.close()
            cause = "did not start" if not self._serving.done() else "stopped at once"
            raise ListenerError(f"the HTTP listener on port {self.http.config.port} {cause}")
        logger.info("serving MCP over HTTP at %s", self.url)

    async def stop(self, grace: float) -> None:
        if self._serving is None:
            return
        await self.http.stop(grace)


# ---- `convmem serve --http` ---------------------------------------------------------------------


@dataclass(frozen=True)
class HttpOptions:
    """What `convmem serve` was asked to do over HTTP."""

    hosts: tuple[str, ...] = LOOPBACK_HOSTS
    port: int = DEFAULT_PORT
    no_stdio: bool = False
    allow_non_loopback: bool = False


def add_http_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("HTTP (POST /mcp, bearer token; docs/hosts.md)")
    group.add_argument("--http", action="store_true", help="also serve MCP over HTTP")
    group.add_argument(
        "--host",
        action="append",
        metavar="H",
        help="address to bind (repeatable; default: 127.0.0.1 and ::1). Anything but loopback "
        "needs --allow-non-loopback",
    )
    group.add_argument(
        "--port", type=int, default=DEFAULT_PORT, metavar="P", help=f"default {DEFAULT_PORT}"
    )
    group.add_argument(
        "--no-stdio",
        action="store_true",
        help="serve HTTP only, until SIGTERM or Ctrl-C (stdin is not read)",
    )
    group.add_argument(
        "--allow-non-loopback",
        action="store_true",
        help="allow --host to name an address other machines can reach (prints a warning)",
    )


def http_options(args: argparse.Namespace) -> HttpOptions | None:
    if not args.http:
        return None
    return HttpOptions(
        hosts=tuple(args.host) if args.host else LOOPBACK_HOSTS,
        port=args.port,
        no_stdio=args.no_stdio,
        allow_non_loopback=args.allow_non_loopback,
    )


def start_http(runtime: Runtime, options: HttpOptions) -> bool:
    """Add the HTTP listener to a running `runtime`; False (after one line on stderr) when it
    cannot start. Says on stderr where it serves and where the token is, never the token."""
    try:
        config = HttpConfig(
            port=options.port,
            hosts=options.hosts,
            allow_non_loopback=options.allow_non_loopback,
        )
        token = HttpToken(runtime.data_dir)
        token.value()  # generated and stored now, so a host can be given it at once
    except (ValueError, TokenError) as error:
        print(f"convmem serve: HTTP: {error}", file=sys.stderr)
        return False
    listener = HttpRuntimeListener(token, config)
    try:
        runtime.add_listener(listener)
    except ListenerError as error:
        print(f"convmem serve: HTTP: {error}", file=sys.stderr)
        return False
    exposed = [host for host in listener.hosts if not is_loopback(host)]
    if exposed:
        print(
            f"convmem serve: WARNING: HTTP is reachable from other machines on {', '.join(exposed)}"
            f" (port {listener.port}); anyone with the token can read and change your memory",
            file=sys.stderr,
        )
    where = f"${ENV_VAR}" if token.from_environment else str(runtime.data_dir / TOKEN_FILE_NAME)
    print(
        f"convmem serve: MCP over HTTP at {listener.url} (Authorization: Bearer <token from "
        f"{where}>)",
        file=sys.stderr,
    )
    return True
