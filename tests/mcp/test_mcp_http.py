"""The HTTP transport on a real loopback port: the SDK's Streamable HTTP client in both eras,
raw requests for every refusal (401, 403, 421, 405, 404, 413), the token file, the logs."""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from http_helpers import (
    HEALTH,
    LiveHttp,
    every_tool_script,
    http_client,
    raw_request,
    rpc,
    tool_call,
)
from mcp_helpers import ERAS, call, serve_client

from convmem_engine.mcp.http_config import DEFAULT_PORT, HttpBindError, HttpConfig, max_body_bytes
from convmem_engine.mcp.http_token import (
    ENV_VAR,
    TOKEN_FILE_NAME,
    HttpToken,
    TokenError,
    valid_token,
)
from convmem_engine.mcp.http_transport import HttpListener
from convmem_engine.mcp.line_transport import MAX_LINE_BYTES
from convmem_engine.tools import MEMORY_TOOLS


@pytest.fixture
def live(tmp_path: Path) -> Any:
    with LiveHttp(tmp_path / "data") as server:
        yield server


def _store_state(live: LiveHttp) -> tuple[int, list[str]]:
    """What a rejected request must not change: the log size and every message id."""
    health = live.service.get_system_health()
    ids = [
        m["message_id"]
        for s in live.service.read_messages(view="sessions")["sessions"]
        for m in live.service.read_messages(session_id=s["session_id"], limit=100)["history"]
    ]
    return health["log_size"], ids


def _health_ok(live: LiveHttp) -> None:
    answer = raw_request(live.port, json.dumps(HEALTH).encode(), token=live.token.value())
    assert answer.status == 200
    assert json.loads(answer.json()["result"]["content"][0]["text"])["status"] == "OK"


# -- MCP over HTTP ----------------------------------------------------------------------------


def test_every_tool_in_both_eras_gives_the_stdio_results(tmp_path: Path) -> None:
    results: dict[str, list[Any]] = {}
    errlog = (tmp_path / "stdio-stderr.txt").open("w")

    async def over_stdio(mode: str) -> None:
        async with serve_client(tmp_path / f"stdio-{mode}", mode, errlog) as client:
            results[f"stdio-{mode}"] = await every_tool_script(client.call_tool)

    async def over_http(live: LiveHttp, mode: str) -> None:
        async with http_client(live.url, live.token.value(), mode) as client:
            expected = "2025-11-25" if mode == "legacy" else "2026-07-28"
            assert client.protocol_version == expected
            listed = await client.list_tools()
            assert [t.name for t in listed.tools] == [t.name for t in MEMORY_TOOLS]
            results[f"http-{mode}"] = await every_tool_script(client.call_tool)

    try:
        for mode in ERAS:
            anyio.run(over_stdio, mode)
            with LiveHttp(tmp_path / f"http-{mode}") as live:
                anyio.run(over_http, live, mode)
    finally:
        errlog.close()
    reference = results["stdio-auto"]
    assert len(reference) == 19
    for name, got in results.items():
        assert got == reference, name


@pytest.mark.parametrize("version", [None, "2025-11-25", "2025-06-18"])
def test_bare_tools_call_without_initialize_or_session(live: LiveHttp, version: str | None) -> None:
    headers = {} if version is None else {"MCP-Protocol-Version": version}
    body = tool_call("write_message", session_id="bare", role="user", content="no handshake")
    answer = raw_request(live.port, body, token=live.token.value(), headers=headers)
    assert answer.status == 200
    assert answer.headers["content-type"] == "application/json"
    assert "mcp-session-id" not in answer.headers
    result = answer.json()["result"]
    assert result["isError"] is False
    assert json.loads(result["content"][0]["text"])["status"] == "OK"


def test_bare_tools_call_in_the_2026_era(live: LiveHttp) -> None:
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = rpc(
        "tools/call",
        {
            "name": "write_message",
            "arguments": {"session_id": "m", "role": "user", "content": "hi"},
            "_meta": meta,
        },
    )
    headers = {
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "write_message",
    }
    answer = raw_request(live.port, body, token=live.token.value(), headers=headers)
    assert answer.status == 200, answer.body
    assert answer.headers["content-type"] == "application/json"
    assert "mcp-session-id" not in answer.headers
    assert json.loads(answer.json()["result"]["content"][0]["text"])["status"] == "OK"
    assert live.service.read_messages(session_id="m")["history"][0]["content"] == "hi"


def test_initialize_issues_no_session_id(live: LiveHttp) -> None:
    body = rpc(
        "initialize",
        {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    )
    answer = raw_request(live.port, body, token=live.token.value())
    assert answer.status == 200
    assert answer.json()["result"]["serverInfo"]["name"]
    assert "mcp-session-id" not in answer.headers


# -- refusals ---------------------------------------------------------------------------------


def test_every_refusal_leaves_the_store_unchanged_and_the_server_serving(live: LiveHttp) -> None:
    write = tool_call("write_message", session_id="r", role="user", content="must not land")
    token = live.token.value()
    live.service.write_message(session_id="keep", role="user", content="already here")
    before = _store_state(live)
    limit = live.listener.config.body_limit
    cases: list[tuple[int, dict[str, Any]]] = [
        (401, {}),
        (401, {"token": "x" * 43}),
        (401, {"token": token[:-1] + ("A" if token[-1] != "A" else "B")}),
        (401, {"headers": {"Authorization": f"Basic {token}"}}),
        (401, {"target": f"/mcp?access_token={token}"}),
        (401, {"target": f"/mcp?token={token}"}),
        (403, {"token": token, "headers": {"Origin": "http://evil.example"}}),
        (403, {"token": token, "headers": {"Origin": f"http://127.0.0.1:{live.port + 1}"}}),
        (421, {"token": token, "host": "evil.example"}),
        (421, {"token": token, "host": f"attacker.example:{live.port}"}),
        (405, {"token": token, "method": "GET", "body": None}),
        (405, {"token": token, "method": "DELETE", "body": None}),
        (405, {"token": token, "method": "PUT"}),
        (404, {"token": token, "target": "/other"}),
        (413, {"token": token, "body": write + b" " * (limit + 1 - len(write))}),
        (413, {"token": token, "body": write + b" " * (limit + 1 - len(write)), "chunked": True}),
    ]
    for status, options in cases:
        body = options.pop("body", write)
        answer = raw_request(live.port, body, **options)
        assert answer.status == status, (status, options, answer.body[:200])
        assert answer.headers["content-type"] == "application/json"
        error = answer.json()["error"]
        assert error["message"] and token not in error["message"]
        if status == 401:
            assert answer.headers["www-authenticate"].startswith("Bearer")
        if status == 405:
            assert answer.headers["allow"] == "POST"
        assert _store_state(live) == before, (status, options)
        _health_ok(live)
    assert _store_state(live) == before


def test_413_is_answered_before_reading_a_declared_body(live: LiveHttp) -> None:
    limit = live.listener.config.body_limit
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{live.port}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json\r\nAuthorization: Bearer {live.token.value()}\r\n"
        f"Content-Length: {limit + 1}\r\n\r\n"
    )
    from http_helpers import read_response

    with socket.create_connection(("127.0.0.1", live.port), timeout=30) as sock:
        sock.sendall(head.encode())  # and not one byte of the body
        assert read_response(sock).status == 413
    _health_ok(live)


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_of_exactly_the_limit_is_served(live: LiveHttp, chunked: bool) -> None:
    limit = live.listener.config.body_limit
    assert limit == max_body_bytes() == MAX_LINE_BYTES
    content = "é" * 100_000
    body = tool_call("write_message", session_id="big", role="user", content=content)
    body += b" " * (limit - len(body))  # JSON allows trailing whitespace
    assert len(body) == limit
    answer = raw_request(live.port, body, token=live.token.value(), chunked=chunked)
    assert answer.status == 200, answer.body[:300]
    assert json.loads(answer.json()["result"]["content"][0]["text"])["status"] == "OK"
    assert live.service.read_messages(session_id="big")["history"][0]["content"] == content


def test_the_body_limit_admits_the_configured_images() -> None:
    twenty_mib = 20 * 1024 * 1024
    limit = max_body_bytes(twenty_mib)
    assert limit - MAX_LINE_BYTES >= len(__import__("base64").b64encode(b"\0" * twenty_mib))
    assert limit == MAX_LINE_BYTES + 27_962_028
    with pytest.raises(ValueError):
        max_body_bytes(-1)


def test_json_that_is_not_a_message_is_refused_without_echoing_it(live: LiveHttp) -> None:
    secret = "s3cr3t-input-value"
    for body in (
        b'{"jsonrpc":"2.0","idx":1,"x":"' + secret.encode() + b'"}',
        b"[1,2",
        b'"' + secret.encode() + b'"',
    ):
        answer = raw_request(live.port, body, token=live.token.value())
        assert answer.status == 400, body
        assert secret not in answer.body.decode()
    _health_ok(live)


def test_sdk_client_without_or_with_a_wrong_token_is_refused(live: LiveHttp) -> None:
    async def attempt(token: str | None) -> None:
        async with http_client(live.url, token, "legacy") as client:
            await client.list_tools()

    for token in (None, "w" * 43):
        with pytest.raises(Exception) as caught:
            anyio.run(attempt, token)
        assert "401" in repr(caught.value) or "Unauthorized" in repr(caught.value)
    _health_ok(live)


def test_logs_carry_no_token_no_query_string_and_no_content(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with LiveHttp(tmp_path / "data") as live:
        token = live.token.value()
        raw_request(
            live.port,
            tool_call("write_message", session_id="s", role="user", content="secret-content"),
            token=token,
        )
        raw_request(live.port, json.dumps(HEALTH).encode(), target=f"/mcp?token={token}&q=needle")
        raw_request(live.port, json.dumps(HEALTH).encode(), token=token, target="/mcp?q=needle")
        raw_request(live.port, json.dumps(HEALTH).encode(), token="wrong-" + "w" * 40)
        for malformed in (  # uvicorn refuses these itself (400) and logs a warning
            f"GET /mcp?token={token}&q=needle HTTP/1.1 extra\r\nHost: x\r\n\r\n",
            f"POST /mcp?q=needle HTTP/1.1\r\nHost: x\r\nContent-Length: {token}\r\n\r\n",
        ):
            with socket.create_connection(("127.0.0.1", live.port), timeout=30) as sock:
                sock.sendall(malformed.encode())
                assert sock.recv(100).startswith(b"HTTP/1.1 400")
    formatter = logging.Formatter("%(name)s %(message)s")  # with tracebacks, if any
    text = "\n".join(formatter.format(r) for r in caplog.records)
    assert "POST /mcp 200" in text and "POST /mcp 401" in text
    for secret in (token, "needle", "secret-content", "wrong-"):
        assert secret not in text


# -- the token --------------------------------------------------------------------------------


def test_the_token_is_generated_once_user_only_and_survives_restarts(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    token = HttpToken(data_dir, {}).value()
    assert valid_token(token) and len(token) >= 43
    path = data_dir / TOKEN_FILE_NAME
    assert path.read_text().strip() == token
    if sys.platform != "win32":
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert HttpToken(data_dir, {}).value() == token
    assert [p.name for p in data_dir.iterdir()] == [TOKEN_FILE_NAME]  # no temp file left


def test_regenerate_replaces_the_token_and_the_old_one_stops_working(live: LiveHttp) -> None:
    old = live.token.value()
    new = live.token.regenerate()
    assert new != old and valid_token(new)
    assert (live.data_dir / TOKEN_FILE_NAME).read_text().strip() == new
    assert raw_request(live.port, json.dumps(HEALTH).encode(), token=old).status == 401
    assert raw_request(live.port, json.dumps(HEALTH).encode(), token=new).status == 200
    assert HttpToken(live.data_dir, {}).value() == new


@pytest.mark.posix  # POSIX permissions and symlinks
def test_an_untrusted_token_file_is_replaced_never_followed(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    target = tmp_path / "elsewhere"
    target.write_text("A" * 43 + "\n")
    (data_dir / TOKEN_FILE_NAME).symlink_to(target)
    token = HttpToken(data_dir, {}).value()
    assert token != "A" * 43
    assert not (data_dir / TOKEN_FILE_NAME).is_symlink()
    assert target.read_text() == "A" * 43 + "\n"  # the planted target is untouched

    loose = data_dir / TOKEN_FILE_NAME
    loose.write_text("B" * 43 + "\n")
    os.chmod(loose, 0o644)
    token = HttpToken(data_dir, {}).value()
    assert token != "B" * 43 and stat.S_IMODE(loose.stat().st_mode) == 0o600

    loose.write_text("not a token\n")
    os.chmod(loose, 0o600)
    assert valid_token(HttpToken(data_dir, {}).value())


def test_the_environment_token_wins_and_cannot_be_regenerated(tmp_path: Path) -> None:
    env_token = "e" * 40
    with LiveHttp(tmp_path / "data", environ={ENV_VAR: env_token}) as live:
        assert live.token.from_environment
        assert raw_request(live.port, json.dumps(HEALTH).encode(), token=env_token).status == 200
        with pytest.raises(TokenError, match=ENV_VAR):
            live.token.regenerate()
    assert not (tmp_path / "data" / TOKEN_FILE_NAME).exists()


@pytest.mark.parametrize("bad", ["short", "has space " * 5, "é" * 40, "x" * 600])
def test_a_bad_environment_token_is_refused_without_echo(tmp_path: Path, bad: str) -> None:
    with pytest.raises(TokenError) as caught:
        HttpToken(tmp_path, {ENV_VAR: bad})
    assert ENV_VAR in str(caught.value) and bad not in str(caught.value)


# -- binding ----------------------------------------------------------------------------------


def test_a_busy_port_is_a_clear_error_naming_the_port(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        listener = HttpListener(HttpToken(tmp_path, {}), HttpConfig(port=port))
        with pytest.raises(HttpBindError) as caught:
            listener.bind()
        assert caught.value.port == port and str(port) in str(caught.value)
        assert "in use" in str(caught.value)
        assert listener.sockets == []


def test_loopback_only_unless_explicitly_allowed() -> None:
    assert HttpConfig().hosts == ("127.0.0.1", "::1") and HttpConfig().port == DEFAULT_PORT
    assert HttpConfig(hosts=("localhost",)).loopback_only
    with pytest.raises(ValueError, match="explicit flag"):
        HttpConfig(hosts=("0.0.0.0",))
    with pytest.raises(ValueError, match="explicit flag"):
        HttpConfig(hosts=("192.168.1.10",))
    assert not HttpConfig(hosts=("0.0.0.0",), allow_non_loopback=True).loopback_only


def test_both_loopback_addresses_are_served(live: LiveHttp) -> None:
    hosts = live.listener.hosts
    assert hosts[0] == "127.0.0.1"
    if socket.has_ipv6 and "::1" in hosts:
        body = json.dumps(HEALTH).encode()
        head = (
            f"POST /mcp HTTP/1.1\r\nHost: [::1]:{live.port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json\r\nAuthorization: Bearer {live.token.value()}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        from http_helpers import read_response

        with socket.create_connection(("::1", live.port), timeout=30) as sock:
            sock.sendall(head + body)
            assert read_response(sock).status == 200


def test_stopping_releases_the_port(tmp_path: Path) -> None:
    with LiveHttp(tmp_path / "data") as live:
        port = live.port
        _health_ok(live)
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))


def test_concurrent_http_clients_lose_nothing(live: LiveHttp) -> None:
    writers, each = 6, 15

    async def writer(n: int) -> None:
        async with http_client(
            live.url, live.token.value(), "legacy" if n % 2 else "auto"
        ) as client:
            for i in range(each):
                await call(
                    client, "write_message", session_id=f"w{n}", role="user", content=f"{n}-{i}"
                )

    async def all_writers() -> None:
        async with anyio.create_task_group() as tg:
            for n in range(writers):
                tg.start_soon(writer, n)

    anyio.run(all_writers)
    for n in range(writers):
        history = live.service.read_messages(session_id=f"w{n}", limit=100)["history"]
        assert [m["content"] for m in history] == [f"{n}-{i}" for i in range(each)]
    assert live.service.check() == []


def test_listening_sockets_say_tcp_so_asyncio_turns_nagle_off(live: LiveHttp) -> None:
    """A proto-0 socket would not get TCP_NODELAY from asyncio and every answer would wait for
    the client's delayed ACK (~40 ms a request)."""
    assert live.listener.sockets
    assert all(sock.proto == socket.IPPROTO_TCP for sock in live.listener.sockets)
