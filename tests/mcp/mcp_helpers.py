"""Shared helpers for the MCP tests: start `convmem serve`, call tools, read results."""

from __future__ import annotations

import json
import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

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


def payload(result: types.CallToolResult) -> dict[str, Any]:
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    data: dict[str, Any] = json.loads(block.text)
    return data


async def call(client: Client, name: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(name, arguments)
    data = payload(result)
    assert result.is_error is False, data
    return data


async def call_error(client: Client, name: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(name, arguments)
    data = payload(result)
    assert result.is_error is True, data
    assert data["status"] == "ERROR"
    assert set(data["error"]) == {"code", "message"}
    return data["error"]  # type: ignore[no-any-return]
