"""Helpers for the HTTP transport tests: a live listener, the SDK's HTTP client with the token,
raw HTTP exchanges over a plain socket, and a scripted run of every tool whose normalised
results can be compared between transports."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import mcp_types as types
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from tool_results import payload

from convmem_engine.mcp import build_server
from convmem_engine.mcp.http_config import HttpConfig
from convmem_engine.mcp.http_token import HttpToken
from convmem_engine.mcp.http_transport import HttpListener
from convmem_engine.service import MemoryService

HEALTH = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {"name": "get_system_health", "arguments": {}},
}


@asynccontextmanager
async def http_client(url: str, token: str | None, mode: str, **headers: str):  # type: ignore[no-untyped-def]
    """The SDK's Streamable HTTP client, with `Authorization: Bearer <token>` when given."""
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with (
        create_mcp_http_client(headers=headers) as hc,
        Client(streamable_http_client(url, http_client=hc), mode=mode) as client,
    ):
        yield client


def wait_accepting(port: int, host: str = "127.0.0.1", timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@dataclass
class LiveHttp:
    """A MemoryService and an HttpListener on a real loopback port, served by uvicorn on its own
    thread and event loop (as the app's engine thread does)."""

    data_dir: Path
    config: HttpConfig = field(default_factory=lambda: HttpConfig(port=0))
    environ: dict[str, str] = field(default_factory=dict)

    def __enter__(self) -> LiveHttp:
        self.service = MemoryService.open(self.data_dir)
        self.token = HttpToken(self.data_dir, self.environ)
        self.listener = HttpListener(self.token, self.config)
        self.listener.bind()
        server = build_server(self.service)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.listener.serve(server)))
        self.thread.start()
        assert self.listener.started.wait(30)
        wait_accepting(self.port)
        return self

    def __exit__(self, *exc: object | TracebackType) -> None:
        self.listener.request_stop()
        self.thread.join(60)
        assert not self.thread.is_alive()
        self.service.close()

    @property
    def port(self) -> int:
        return self.listener.port

    @property
    def url(self) -> str:
        return self.listener.url


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def read_response(sock: socket.socket) -> RawResponse:
    """One HTTP/1.1 response with a Content-Length body (what the server sends)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed after {len(data)} bytes")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return RawResponse(status, headers, body[:length])


def raw_request(
    port: int,
    body: bytes | None = None,
    *,
    method: str = "POST",
    target: str = "/mcp",
    headers: dict[str, str] | None = None,
    token: str | None = None,
    host: str | None = None,
    chunked: bool = False,
    chunk_size: int = 1 << 20,
) -> RawResponse:
    """One request over a plain socket, exactly as written (no client library in the way)."""
    fields = {"Host": host or f"127.0.0.1:{port}", "Accept": "application/json, text/event-stream"}
    if body is not None:
        fields["Content-Type"] = "application/json"
        if chunked:
            fields["Transfer-Encoding"] = "chunked"
        else:
            fields["Content-Length"] = str(len(body))
    if token is not None:
        fields["Authorization"] = f"Bearer {token}"
    fields.update(headers or {})
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head.encode("latin-1") + b"\r\n")
        if body is not None and chunked:
            for start in range(0, len(body), chunk_size):
                piece = body[start : start + chunk_size]
                try:
                    sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    break  # the server answered early and closed: read what it said
            else:
                sock.sendall(b"0\r\n\r\n")
        elif body is not None:
            sock.sendall(body)
        return read_response(sock)


def rpc(method: str, params: dict[str, Any], request_id: int = 1) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    ).encode()


def tool_call(name: str, **arguments: Any) -> bytes:
    return rpc("tools/call", {"name": name, "arguments": arguments})


# -- a scripted run of every tool, comparable across transports -----------------------------

Call = Callable[[str, dict[str, Any]], Awaitable[types.CallToolResult]]

_ULID = re.compile(r"\b[0-9A-HJKMNP-TV-Z]{26}\b")
_TIME_KEYS = {"timestamp", "updated_at", "started_at", "last_message_at"}
# Byte sizes vary with the encoded length of the times; I/O counters with group commits.
_VOLATILE_KEYS = {"io", "nextCursor", "memory_estimate"} | {
    "log_size",
    "snapshot_size",
    "bytes_before",
    "bytes_after",
}


def normalise(value: Any, ids: dict[str, str] | None = None) -> Any:
    """Message ids become ID1, ID2, ... in order of appearance; times and I/O counters go."""
    ids = {} if ids is None else ids
    if isinstance(value, dict):
        return {
            key: (
                "<time>"
                if key in _TIME_KEYS
                else "<volatile>"
                if key in _VOLATILE_KEYS
                else normalise(item, ids)
            )
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [normalise(item, ids) for item in value]
    if isinstance(value, str):
        return _ULID.sub(lambda m: ids.setdefault(m.group(0), f"ID{len(ids) + 1}"), value)
    return value


async def every_tool_script(call_tool: Call) -> list[Any]:
    """Every tool, its successes and its errors; the results in order, normalised."""
    seen: list[tuple[bool, dict[str, Any]]] = []

    async def step(name: str, **arguments: Any) -> dict[str, Any]:
        result = await call_tool(name, arguments)
        data = payload(result)
        seen.append((bool(result.is_error), data))
        return data

    first = await step(
        "write_message",
        session_id="s1",
        role="user",
        content="We chose PostgreSQL for the billing database.",
        metadata_json=json.dumps({"tags": ["project"], "memory_kind": "semantic"}),
    )
    mid = first["message"]["message_id"]
    second = await step(
        "write_message",
        session_id="s1",
        role="assistant",
        content="Noted: 請求データベースはPostgreSQL。",
        metadata_json=json.dumps({"relations": [{"type": "derived_from", "message_id": mid}]}),
    )
    mid2 = second["message"]["message_id"]
    await step(
        "update_message", message_id=mid, metadata_json='{"importance":90}', expected_revision=1
    )
    await step("update_message", message_id=mid, metadata_json='{"importance":90}')
    await step("update_message", message_id=mid, content="x", expected_revision=9)
    history = await step("read_messages", session_id="s1", limit=1)
    await step("read_messages", session_id="s1", limit=1, cursor=history["nextCursor"])
    await step("read_messages", view="content", message_id=mid2, content_limit=10)
    await step("read_messages", view="context", message_id=mid2)
    await step("read_messages", view="sessions")
    await step("read_messages", view="context", message_id="0" * 26)
    await step("search_messages", query="PostgreSQL", min_importance=80)
    await step("search_messages", query="請求データ")
    await step("write_message", session_id="s1", role="nobody")
    await step("write_message", session_id="s1", role="user", content="x", extra="y")
    await step("delete_message", message_id=mid2)
    await step("delete_message", message_id=mid2)
    await step("rebuild_index")
    await step("get_system_health")
    ids: dict[str, str] = {}
    return [normalise([is_error, data], ids) for is_error, data in seen]
