"""Shared helpers for the MCP tests: start `convmem serve`, call tools, read results."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.message import SessionMessage
from tool_results import call, payload

__all__ = ["call", "payload"]  # re-exported: the MCP tests import them from here

ROOT = Path(__file__).resolve().parent.parent.parent
ERAS = ("legacy", "auto")  # the initialize handshake; 2026-07-28 via server/discover


def child_env() -> dict[str, str]:
    """The stdio client passes only a few variables to the child: pass ours explicitly."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("CONVMEM_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def serve_args(data_dir: Path, *extra: str) -> list[str]:
    return ["-m", "convmem_app", "serve", "--data-dir", str(data_dir), *extra]


def serve_params(data_dir: Path, *, prefix: list[str] | None = None) -> StdioServerParameters:
    command = sys.executable
    args = serve_args(data_dir)
    if prefix:
        command, args = prefix[0], [*prefix[1:], sys.executable, *args]
    return StdioServerParameters(command=command, args=args, env=child_env(), cwd=str(ROOT))


@asynccontextmanager
async def serve_client(data_dir: Path, mode: str, errlog: Any, *, prefix: list[str] | None = None):  # type: ignore[no-untyped-def]
    transport = stdio_client(serve_params(data_dir, prefix=prefix), errlog=errlog)
    async with Client(transport, mode=mode) as client:
        yield client


async def call_error(client: Client, name: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(name, arguments)
    data = payload(result)
    assert result.is_error is True, data
    assert data["status"] == "ERROR"
    assert set(data["error"]) == {"code", "message"}
    return data["error"]  # type: ignore[no-any-return]


@asynccontextmanager
async def socket_transport(sock: socket.socket):  # type: ignore[no-untyped-def]
    """A client-side MCP transport over one end of a real socket (newline-delimited JSON)."""
    reader, writer = await asyncio.open_connection(sock=sock, limit=64 * 1024 * 1024)
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)

    async def pump_in() -> None:
        async with to_session:
            while line := await reader.readline():
                message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                await to_session.send(SessionMessage(message))

    async def pump_out() -> None:
        async with from_session:
            async for item in from_session:
                data = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                writer.write(data.encode() + b"\n")
                await writer.drain()

    async with anyio.create_task_group() as tg:
        tg.start_soon(pump_in)
        tg.start_soon(pump_out)
        try:
            yield read_stream, write_stream
        finally:
            write_stream.close()
            writer.close()
            tg.cancel_scope.cancel()


@asynccontextmanager
async def served_socket(server: Any):  # type: ignore[no-untyped-def]
    """Run `serve_lines` on one end of a socketpair; yield the other end."""
    from convmem_engine.mcp import serve_lines

    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)

    async def send(data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    async def session() -> None:
        try:
            await serve_lines(server, reader, send)
        finally:
            writer.close()  # the session is over: hang up, as a real listener does

    task = asyncio.create_task(session())
    try:
        yield theirs
    finally:
        await asyncio.wait_for(task, 30)
