"""Helpers for the app tests: real app processes, real shims, real sockets."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from convmem_app.paths import endpoint

ROOT = Path(__file__).resolve().parent.parent.parent


def child_env() -> dict[str, str]:
    """The stdio client passes only a few variables to the child: pass ours explicitly."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("CONVMEM_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["QT_QPA_PLATFORM"] = "offscreen"
    return env


def shim_args(data_dir: Path, *extra: str) -> list[str]:
    return ["-m", "convmem_app", "shim", "--data-dir", str(data_dir), *extra]


def start_app(data_dir: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "convmem_app", "app", "--data-dir", str(data_dir), *extra]
    with log.open("ab") as err:
        return subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=child_env(), cwd=ROOT
        )


def control(data_dir: Path, command: str, timeout: float = 5.0) -> dict[str, Any] | None:
    """One control message to the app for `data_dir` over a plain AF_UNIX socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(endpoint(data_dir))
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        sock.sendall(json.dumps({"convmem_control": command}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    answer = json.loads(data) if data else None
    return answer if isinstance(answer, dict) else None


def wait_listening(data_dir: Path, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = control(data_dir, "status")
        if answer is not None and answer.get("state") == "running":
            return answer
        time.sleep(0.05)
    raise AssertionError("the app did not start listening")


def wait_gone(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} is still running")


@asynccontextmanager
async def shim_client(data_dir: Path, errlog: Any, *extra: str):  # type: ignore[no-untyped-def]
    params = StdioServerParameters(
        command=sys.executable, args=shim_args(data_dir, *extra), env=child_env(), cwd=str(ROOT)
    )
    async with Client(stdio_client(params, errlog=errlog)) as client:
        yield client


def payload(result: types.CallToolResult) -> dict[str, Any]:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    data: dict[str, Any] = json.loads(block.text)
    return data


async def call(client: Client, name: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(name, arguments)
    data = payload(result)
    assert result.is_error is False, data
    return data
