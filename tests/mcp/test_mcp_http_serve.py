"""`convmem serve --http` as users run it: a real subprocess on a random free loopback port,
driven by the SDK's Streamable HTTP client and by raw requests."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from http_helpers import HEALTH, http_client, raw_request, tool_call, wait_accepting
from mcp_helpers import ERAS, call, child_env, serve_args

from convmem_engine.mcp.http_config import max_body_bytes
from convmem_engine.mcp.http_token import ENV_VAR, TOKEN_FILE_NAME
from convmem_engine.service import MemoryService
from tests.served_http import Served, free_port

pytestmark = pytest.mark.posix  # SIGTERM


def _accepting(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_every_tool_in_both_eras_then_sigterm_releases_the_port(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with Served(data_dir, tmp_path / "serve.log", "--no-stdio") as served:
        assert f"MCP over HTTP at {served.url}" in served.log.read_text()
        for mode in ERAS:
            anyio.run(_every_tool, served, mode)
        assert served.proc.poll() is None  # stdin (/dev/null) at EOF did not stop it
        assert served.stop() == 0
    with socket.socket() as again:  # the port is free at once
        again.bind(("127.0.0.1", served.port))
    log = served.log.read_text()
    assert served.token not in log and "via legacy" not in log
    with Served(data_dir, tmp_path / "again.log", "--no-stdio") as restarted:
        assert restarted.token == served.token  # the token survives a restart
        health = json.dumps(HEALTH).encode()
        assert raw_request(restarted.port, health, token=served.token).status == 200
        assert restarted.stop() == 0


async def _every_tool(served: Served, mode: str) -> None:
    async with http_client(served.url, served.token, mode) as client:
        content = f"via {mode}"
        written = await call(client, "write_message", session_id=mode, role="user", content=content)
        mid = written["message"]["message_id"]
        await call(client, "update_message", message_id=mid, metadata_json='{"importance":70}')
        history = await call(client, "read_messages", session_id=mode)
        assert history["history"][0]["revision"] == 2
        found = await call(client, "search_messages", query=content)
        assert [r["message_id"] for r in found["results"]] == [mid]
        await call(client, "read_messages", view="context", message_id=mid)
        await call(client, "delete_message", message_id=mid)
        await call(client, "rebuild_index")
        assert (await call(client, "get_system_health"))["status"] == "OK"


def test_stdio_and_http_at_once_lose_nothing(tmp_path: Path) -> None:
    """`convmem serve --http` keeps its stdio session: a stdio host and HTTP clients write at
    once into one store."""
    data_dir = tmp_path / "data"
    port = free_port()
    errlog = (tmp_path / "stderr.txt").open("w")
    each = 25

    async def scenario() -> None:
        from mcp.client import Client
        from mcp.client.stdio import StdioServerParameters, stdio_client

        params = StdioServerParameters(
            command=sys.executable,
            args=serve_args(data_dir, "--http", "--port", str(port)),
            env=child_env(),
        )
        async with Client(stdio_client(params, errlog=errlog), mode="auto") as stdio:
            await anyio.to_thread.run_sync(wait_accepting, port)
            token = (data_dir / TOKEN_FILE_NAME).read_text().strip()
            url = f"http://127.0.0.1:{port}/mcp"

            async def over_stdio() -> None:
                for i in range(each):
                    await call(
                        stdio, "write_message", session_id="stdio", role="user", content=f"s{i}"
                    )

            async def over_http(n: int) -> None:
                async with http_client(url, token, "legacy" if n else "auto") as client:
                    for i in range(each):
                        await call(
                            client,
                            "write_message",
                            session_id=f"http{n}",
                            role="user",
                            content=f"h{i}",
                        )

            async with anyio.create_task_group() as tg:
                tg.start_soon(over_stdio)
                tg.start_soon(over_http, 0)
                tg.start_soon(over_http, 1)
        # the stdio client closed stdin: `convmem serve --http` (with stdio) ends there

    try:
        anyio.run(scenario)
    finally:
        errlog.close()
    with MemoryService.open(data_dir) as svc:  # the lock was released: the process ended
        for session, prefix in (("stdio", "s"), ("http0", "h"), ("http1", "h")):
            history = svc.read_messages(session_id=session, limit=100)["history"]
            assert [m["content"] for m in history] == [f"{prefix}{i}" for i in range(each)]
        assert svc.check() == []


def test_environment_token(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    env = child_env()
    env[ENV_VAR] = "t" * 48
    proc = subprocess.Popen(
        [sys.executable, *serve_args(data_dir, "--http", "--no-stdio", "--port", str(port))],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        wait_accepting(port)
        body = json.dumps(HEALTH).encode()
        assert raw_request(port, body, token="t" * 48).status == 200
        assert raw_request(port, body, token="u" * 48).status == 401
        assert not (data_dir / TOKEN_FILE_NAME).exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert b"t" * 48 not in err and ENV_VAR.encode() in err


def test_refusals_body_limit_and_stdin_eof_over_the_real_process(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with Served(tmp_path / "data", log, "--no-stdio", stdin=subprocess.PIPE) as served:
        assert served.proc.stdin is not None
        served.proc.stdin.close()  # stdin at EOF does not stop --no-stdio
        limit = max_body_bytes()
        write = tool_call("write_message", session_id="s", role="user", content="over the limit")
        assert raw_request(served.port, write).status == 401
        assert (
            raw_request(served.port, write, token=served.token, host="evil.example").status == 421
        )
        origin = {"Origin": "http://evil.example"}
        assert raw_request(served.port, write, token=served.token, headers=origin).status == 403
        big = write + b" " * (limit + 1 - len(write))
        assert raw_request(served.port, big, token=served.token).status == 413
        assert raw_request(served.port, big, token=served.token, chunked=True).status == 413
        fits = tool_call("write_message", session_id="s", role="user", content="just fits")
        fits += b" " * (limit - len(fits))
        answer = raw_request(served.port, fits, token=served.token, chunked=True)
        assert answer.status == 200
        assert raw_request(served.port, None, method="GET", token=served.token).status == 405
        assert served.proc.poll() is None
        assert served.stop() == 0
    with MemoryService.open(tmp_path / "data") as svc:
        assert [m["content"] for m in svc.read_messages(session_id="s")["history"]] == ["just fits"]


def test_a_busy_port_exits_3_naming_the_port(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable,
                *serve_args(tmp_path / "data", "--http", "--no-stdio", "--port", str(port)),
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=child_env(),
            timeout=60,
        )
    assert proc.returncode == 3
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and str(port) in lines[0] and "in use" in lines[0]
    with MemoryService.open(tmp_path / "data"):  # the lock was released
        pass


@pytest.mark.parametrize(
    ("extra", "status", "text"),
    [
        (["--no-stdio"], 2, "--no-stdio needs --http"),
        (["--http", "--no-stdio", "--host", "0.0.0.0"], 3, "explicit flag"),
    ],
)
def test_usage_errors(tmp_path: Path, extra: list[str], status: int, text: str) -> None:
    proc = subprocess.run(
        [sys.executable, *serve_args(tmp_path / "data", *extra, "--port", str(free_port()))],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=child_env(),
        timeout=60,
    )
    assert proc.returncode == status
    assert text in proc.stderr.decode()


def test_a_non_loopback_bind_needs_the_flag_and_warns(tmp_path: Path) -> None:
    served = Served(
        tmp_path / "data",
        tmp_path / "serve.log",
        "--no-stdio",
        "--host",
        "0.0.0.0",
        "--allow-non-loopback",
    )
    try:
        assert "WARNING: HTTP is reachable from other machines on 0.0.0.0" in served.log.read_text()
        assert (
            raw_request(served.port, json.dumps(HEALTH).encode(), token=served.token).status == 200
        )
    finally:
        assert served.stop() == 0
