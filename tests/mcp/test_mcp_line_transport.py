"""`serve_lines` over real sockets: many sessions at once over one service, and hostile input.

The server side runs `serve_lines` on one end of a real socketpair; clients are the SDK's
`Client` (both eras) over the other end, or raw bytes for input no client would send.
"""

from __future__ import annotations

import asyncio
import functools
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client import Client
from mcp.server import Server
from mcp_helpers import call, call_error, served_socket, socket_transport

from convmem_engine.domain import limits
from convmem_engine.mcp import MAX_LINE_BYTES, build_server
from convmem_engine.service import MemoryService


@pytest.fixture
def service(tmp_path: Path) -> Iterator[MemoryService]:
    svc = MemoryService.open(tmp_path / "data")
    try:
        yield svc
        assert svc.check() == []
    finally:
        svc.close()


def test_many_concurrent_sessions_lose_and_duplicate_nothing(service: MemoryService) -> None:
    server = build_server(service)
    sessions, writes = 8, 25

    async def one_session(index: int) -> None:
        mode = "legacy" if index % 2 else "auto"
        sid = f"session-{index}"
        async with (
            served_socket(server) as sock,
            Client(socket_transport(sock), mode=mode) as client,
        ):
            expected = "2025-11-25" if mode == "legacy" else "2026-07-28"
            assert client.protocol_version == expected

            async def write(n: int) -> str:
                body = f"{sid} message {n}"
                result = await call(
                    client, "write_message", session_id=sid, role="user", content=body
                )
                assert result["message"]["content"] == body
                seen = await call(
                    client,
                    "read_messages",
                    view="context",
                    message_id=result["message"]["message_id"],
                )
                assert seen["message"]["session_id"] == sid
                return str(result["message"]["message_id"])

            ids = await asyncio.gather(*(write(n) for n in range(writes)))
            assert len(set(ids)) == writes
            history = await call(client, "read_messages", session_id=sid, limit=1000)
            contents = sorted(m["content"] for m in history["history"])
            assert contents == sorted(f"{sid} message {n}" for n in range(writes))
            assert {m["message_id"] for m in history["history"]} == set(ids)

    async def scenario() -> None:
        await asyncio.gather(*(one_session(i) for i in range(sessions)))

    anyio.run(scenario)
    listed = service.read_messages(view="sessions", limit=1000)["sessions"]
    assert sorted(s["session_id"] for s in listed) == sorted(
        f"session-{i}" for i in range(sessions)
    )
    assert all(s["message_count"] == writes for s in listed)
    assert service.get_system_health()["active_messages"] == sessions * writes


def test_hostile_arguments_get_validation_errors_and_the_store_stays_intact(
    service: MemoryService,
) -> None:
    server = build_server(service)

    async def scenario() -> None:
        async with served_socket(server) as sock, Client(socket_transport(sock)) as client:
            kept = await call(client, "write_message", session_id="s", role="user", content="keep")
            from mcp.shared.exceptions import MCPError

            with pytest.raises(MCPError) as unknown:
                await client.call_tool("drop_database", {})
            assert "unknown tool" in str(unknown.value) and "drop_database" not in str(
                unknown.value
            )

            error = await call_error(
                client, "write_message", session_id="s", role="user", content="x", sneaky=1
            )
            assert "unknown argument sneaky" in error["message"]
            error = await call_error(client, "read_messages", limit="10")
            assert error["message"] == "limit: must be an integer"
            error = await call_error(client, "read_messages", limit=10.0)
            assert error["message"] == "limit: must be an integer"
            error = await call_error(client, "search_messages", query="q", limit=True)
            assert error["message"] == "limit: must be an integer"
            error = await call_error(client, "read_messages", limit=1001)
            assert error["message"] == "limit: must be between 1 and 1000"
            error = await call_error(client, "read_messages", view="everything")
            assert error["message"].startswith("view: must be one of history, content")
            error = await call_error(client, "delete_message", message_id="not-a-ulid")
            assert "message_id: must be a canonical 26-character ULID" in error["message"]

            too_long = "a" * (limits.CONTENT_MAX_BYTES + 1)
            error = await call_error(
                client, "write_message", session_id="s", role="user", content=too_long
            )
            assert error == {
                "code": "VALIDATION_ERROR",
                "message": "content: must be at most 1048576 UTF-8 bytes",
            }
            # Fewer characters than the limit, one byte too many: the service counts bytes.
            wide = "é" * (limits.CONTENT_MAX_BYTES // 2) + "a"
            error = await call_error(
                client, "write_message", session_id="s", role="user", content=wide
            )
            assert error["code"] == "VALIDATION_ERROR" and error["message"].startswith("content:")
            assert "é" not in error["message"]
            exact = "a" * limits.CONTENT_MAX_BYTES
            big = await call(client, "write_message", session_id="s", role="user", content=exact)

            history = await call(client, "read_messages", session_id="s")
            ids = [m["message_id"] for m in history["history"]]
            assert ids == [kept["message"]["message_id"], big["message"]["message_id"]]

    anyio.run(scenario)


async def _raw_exchange(server: Server[Any], payload: bytes) -> list[dict[str, Any]]:
    """Send raw bytes on one connection, close our side, return every answer line."""
    async with served_socket(server) as sock:
        reader, writer = await asyncio.open_connection(sock=sock, limit=64 * limits.MIB)
        writer.write(payload)
        await writer.drain()
        writer.write_eof()
        answers = []
        while line := await reader.readline():
            assert line.endswith(b"\n")
            answers.append(json.loads(line))
        writer.close()
    return answers


INIT = (
    b'{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":'
    b'"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}\n'
    b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
)


def _call_line(request_id: int, name: str, arguments: dict[str, Any]) -> bytes:
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }
    return json.dumps(body).encode() + b"\n"


def _write(request_id: int, content: str) -> bytes:
    return _call_line(
        request_id, "write_message", {"session_id": "raw", "role": "user", "content": content}
    )


def test_hostile_lines_each_get_an_error_and_the_session_goes_on(service: MemoryService) -> None:
    server = build_server(service)
    huge_line = (
        b'{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"write_message",'
        b'"arguments":{"session_id":"raw","role":"user","content":"'
        + b"z" * (16 * limits.MIB)
        + b'"}}}\n'
    )
    stream = b"".join(
        [
            INIT,
            _write(1, "first"),
            b"\xc3\x28 invalid utf-8\n",
            b"{not json at all\n",
            b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}\n',
            b'{"hello":"world","id":9}\n',
            b'[{"jsonrpc":"2.0","id":10,"method":"ping"}]\n',
            b'{"jsonrpc":"2.0","id":11,"method":"SECRET/method"}\n',
            b"\n   \n",
            huge_line,
            _write(2, "second"),
            b'\xef\xbb\xbf{"jsonrpc":"2.0","id":3,"method":"ping"}\r\n',
        ]
    )
    answers = anyio.run(_raw_exchange, server, stream)
    by_id = {a["id"]: a for a in answers if a["id"] is not None}
    anonymous = [a["error"] for a in answers if a["id"] is None]
    assert by_id["init"]["result"]["serverInfo"]["name"] == "convmem"
    assert "result" in by_id[1] and "result" in by_id[2] and by_id[3]["result"] == {}
    assert by_id["\ud800"]["result"] == {}  # valid JSON (JavaScript writes it): served
    assert by_id[9]["error"]["code"] == -32600
    assert by_id[11]["error"] == {"code": -32601, "message": "Method not found"}  # no echo
    assert by_id[77]["error"]["code"] == -32600
    assert str(MAX_LINE_BYTES) in by_id[77]["error"]["message"]
    assert sorted(e["code"] for e in anonymous) == [-32700, -32700, -32600]
    assert any("UTF-8" in e["message"] for e in anonymous)
    assert any("batch" in e["message"] for e in anonymous)
    contents = [m["content"] for m in service.read_messages(session_id="raw")["history"]]
    assert contents == ["first", "second"]


def test_oversized_line_split_across_many_reads_and_one_at_end_of_input(
    service: MemoryService,
) -> None:
    """The cap holds however the bytes arrive, with a small cap to keep the test quick; a
    line cut off by end of input is still answered."""
    server = build_server(service)

    async def scenario() -> list[dict[str, Any]]:
        from convmem_engine.mcp import serve_lines

        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=ours)
        out: list[bytes] = []

        async def send(data: bytes) -> None:
            out.append(data)

        task = asyncio.create_task(serve_lines(server, reader, send, max_line_bytes=1000))
        _, client = await asyncio.open_connection(sock=theirs)
        client.write(INIT)
        long_line = _write(5, "q" * 5000)
        for start in range(0, len(long_line), 7):  # tiny pieces: many reads per line
            client.write(long_line[start : start + 7])
            await client.drain()
        client.write(_write(6, "fits"))
        client.write(b'{"jsonrpc":"2.0","id":8,"method":"tools/call","params":' + b"9" * 3000)
        await client.drain()
        client.write_eof()
        await asyncio.wait_for(task, 30)
        client.close()
        writer.close()
        return [json.loads(line) for line in out]

    answers = anyio.run(scenario)
    by_id = {a["id"]: a for a in answers}
    assert by_id[5]["error"]["code"] == -32600
    assert by_id[8]["error"]["code"] == -32600
    assert "result" in by_id[6]
    assert [m["content"] for m in service.read_messages(session_id="raw")["history"]] == ["fits"]


def test_end_of_input_waits_for_answers_then_returns(service: MemoryService) -> None:
    server = build_server(service)
    stream = INIT + b"".join(_write(i, f"w{i}") for i in range(1, 41))
    answers = anyio.run(_raw_exchange, server, stream)
    assert sorted(a["id"] for a in answers if a["id"] != "init") == list(range(1, 41))
    assert len(service.read_messages(session_id="raw")["history"]) == 40


def test_peer_that_vanishes_ends_the_session(service: MemoryService) -> None:
    """If sending fails (the peer is gone), serve_lines returns instead of hanging."""
    server = build_server(service)

    async def scenario() -> None:
        from convmem_engine.mcp import serve_lines

        reader = asyncio.StreamReader()
        reader.feed_data(INIT + _write(1, "lost answer"))

        async def send(data: bytes) -> None:
            raise ConnectionResetError("peer gone")

        await asyncio.wait_for(serve_lines(server, reader, send), 30)

    anyio.run(scenario)


def test_largest_valid_request_fits_under_the_line_cap(service: MemoryService) -> None:
    """1 MiB of content in which every character is escaped (\\u0001: 6 bytes each) plus a
    large metadata_json is still one acceptable line."""
    content = "\x01" * limits.CONTENT_MAX_BYTES
    metadata = json.dumps({"summary": "\x02" * limits.SUMMARY_MAX_BYTES, "tags": ["t"]})
    line = _call_line(
        1,
        "write_message",
        {"session_id": "raw", "role": "user", "content": content, "metadata_json": metadata},
    )
    assert 6 * limits.CONTENT_MAX_BYTES < len(line) < MAX_LINE_BYTES
    answers = anyio.run(_raw_exchange, build_server(service), INIT + line)
    result = next(a for a in answers if a["id"] == 1)["result"]
    assert result.get("isError") is not True
    [stored] = service.read_messages(session_id="raw")["history"]
    assert stored["content"] == content


def test_a_host_that_stops_reading_stops_the_session_reading(service: MemoryService) -> None:
    """While `max_in_flight` answers are unsent (the host does not read its output), the
    session reads no further requests; once the host reads again, every request is answered."""
    from convmem_engine.mcp import serve_chunks

    server = build_server(service)
    cap, total = 4, 200
    lines = [INIT] + [_write(i, f"w{i}") for i in range(1, total + 1)]
    fed = 0
    out: list[bytes] = []
    host_reads = anyio.Event()

    async def read_chunk() -> bytes:
        nonlocal fed
        if fed == len(lines):
            return b""
        fed += 1
        return lines[fed - 1]

    async def send(data: bytes) -> None:
        await host_reads.wait()  # the host is not reading: the send blocks
        out.append(data)

    async def scenario() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                functools.partial(serve_chunks, server, read_chunk, send, max_in_flight=cap)
            )
            # Wait until the session, the server and the worker threads have nothing to do.
            for _ in range(50):
                await anyio.wait_all_tasks_blocked()
                await anyio.sleep(0.01)
            # The initialize request plus at most `cap` further requests were read; without
            # the cap every one of the 200 would be read and its answer held in memory.
            assert fed <= 1 + cap + 1
            assert out == []
            host_reads.set()
        answered = {json.loads(line)["id"] for line in out}
        assert answered == {"init", *range(1, total + 1)}

    anyio.run(scenario)
    assert len(service.read_messages(session_id="raw", limit=1000)["history"]) == total


def test_in_flight_cap_of_one_still_serves_a_whole_session(service: MemoryService) -> None:
    from convmem_engine.mcp import serve_lines

    server = build_server(service)

    async def scenario() -> list[dict[str, Any]]:
        reader = asyncio.StreamReader()
        reader.feed_data(INIT + b"".join(_write(i, f"w{i}") for i in range(1, 21)))
        reader.feed_eof()
        out: list[bytes] = []

        async def send(data: bytes) -> None:
            out.append(data)

        await asyncio.wait_for(serve_lines(server, reader, send, max_in_flight=1), 30)
        return [json.loads(line) for line in out]

    answers = anyio.run(scenario)
    assert [a["id"] for a in answers] == ["init", *range(1, 21)]
    with pytest.raises(ValueError):
        bad = functools.partial(serve_lines, server, None, None, max_in_flight=0)  # type: ignore[arg-type]
        anyio.run(bad)
