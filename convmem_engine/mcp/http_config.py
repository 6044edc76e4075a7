"""What the HTTP transport is configured with, and what a host is told: light (no ASGI server
imported), so `convmem serve` and the app can parse options and show settings without loading
the transport.
"""

from __future__ import annotations

import ipaddress
import json
import math
from dataclasses import dataclass, field
from typing import Final

ENDPOINT_PATH: Final = "/mcp"
DEFAULT_PORT: Final = 8377
LOOPBACK_HOSTS: Final = ("127.0.0.1", "::1")


def max_body_bytes(image_total_bytes: int = 0) -> int:
    """The largest request body accepted (larger: 413).

    The largest valid memory-tool request (`MAX_LINE_BYTES`, 13 MiB: 1 MiB of content and 1 MiB
    of metadata, every byte escaped as \\u00XX, plus framing) plus the base64 of the configured
    total of images a request may carry (base64 turns every 3 bytes into 4).
    """
    from convmem_engine.mcp.line_transport import MAX_LINE_BYTES  # the SDK only when needed

    if image_total_bytes < 0:
        raise ValueError("image_total_bytes must be >= 0")
    return MAX_LINE_BYTES + 4 * math.ceil(image_total_bytes / 3)


class HttpBindError(Exception):
    """The listener could not bind; the message names the address and the port."""

    def __init__(self, message: str, port: int) -> None:
        super().__init__(message)
        self.port = port


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class HttpConfig:
    """Where and how the HTTP listener serves.

    `hosts`: the addresses to bind (default: 127.0.0.1 and, where the machine has IPv6, ::1);
    a non-loopback address needs `allow_non_loopback`. `port` 0 picks a free port (tests).
    """

    port: int = DEFAULT_PORT
    hosts: tuple[str, ...] = LOOPBACK_HOSTS
    allow_non_loopback: bool = False
    body_limit: int = field(default_factory=max_body_bytes)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError("port must be 0 to 65535")
        if not self.hosts:
            raise ValueError("hosts must name at least one address")
        foreign = [host for host in self.hosts if not is_loopback(host)]
        if foreign and not self.allow_non_loopback:
            raise ValueError(
                "binding a non-loopback address exposes ConvMem to the network: "
                "pass the explicit flag to allow it"
            )

    @property
    def loopback_only(self) -> bool:
        return all(is_loopback(host) for host in self.hosts)


# -- what a host needs ------------------------------------------------------------------------


def claude_code_command(url: str, token: str) -> str:
    """The Claude Code command that adds ConvMem over HTTP with its token."""
    return f'claude mcp add --transport http convmem {url} --header "Authorization: Bearer {token}"'


def http_host_json(url: str, token: str) -> str:
    """The JSON entry for hosts that take a URL and headers (Claude Code's `.mcp.json`, Cursor)."""
    entry = {"type": "http", "url": url, "headers": {"Authorization": f"Bearer {token}"}}
    return json.dumps({"mcpServers": {"convmem": entry}}, indent=2)
