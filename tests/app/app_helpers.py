"""Helpers for the app tests: real app processes, real shims, real sockets."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from convmem_app.shim import launcher
from convmem_app.shim.paths import endpoint

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
    """One control message to the app for `data_dir`: over a plain AF_UNIX socket, or on
    Windows over its named pipe through the shim's own pipe client."""
    message = json.dumps({"convmem_control": command}).encode() + b"\n"
    data = b""
    if sys.platform == "win32":
        try:
            conn = launcher.connect(endpoint(data_dir), timeout)
        except launcher.NotListening:
            return None
        try:
            conn.send(message)
            while not data.endswith(b"\n"):
                chunk = conn.recv()
                if not chunk:
                    break
                data += chunk
        finally:
            conn.close()
    else:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            try:
                sock.connect(endpoint(data_dir))
            except (FileNotFoundError, ConnectionRefusedError):
                return None
            sock.sendall(message)
            while not data.endswith(b"\n"):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
    answer = json.loads(data) if data else None
    return answer if isinstance(answer, dict) else None


@dataclass
class RunningApp:
    """A `convmem app` process (the `running_app` fixture). Here, not in conftest.py: test
    modules import it, and `conftest` names whichever suite's conftest pytest loaded last."""

    process: subprocess.Popen[bytes]
    data_dir: Path
    log: Path

    def quit(self) -> int:
        control(self.data_dir, "quit")
        return self.process.wait(30)


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


# ---- raw JSON-RPC lines, for hosts that speak to a shim or the pipe byte by byte ----

INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def request(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def initialize_request(client_name: str) -> dict[str, Any]:
    client = {"name": client_name, "version": "0"}
    params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": client}
    return request(1, "initialize", params)


def write_call(request_id: int, session: str, content: str) -> dict[str, Any]:
    arguments = {"session_id": session, "role": "user", "content": content}
    return request(request_id, "tools/call", {"name": "write_message", "arguments": arguments})


def lines(*messages: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(m).encode() + b"\n" for m in messages)


def raw_shim(data_dir: Path, *extra: str) -> subprocess.Popen[bytes]:
    """A shim whose stdin and stdout the test reads and writes itself."""
    return subprocess.Popen(
        [sys.executable, *shim_args(data_dir, *extra)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
        cwd=ROOT,
    )


def run_shim(data_dir: Path, *extra: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """A shim run to its end with `stdin` as its whole input."""
    return subprocess.run(
        [sys.executable, *shim_args(data_dir, *extra)],
        input=stdin,
        capture_output=True,
        env=child_env(),
        cwd=ROOT,
        timeout=60,
    )
