"""Review of `convmem serve`'s stdio front and its hand-over (issue 13), with real `convmem
serve` subprocesses whose open is held back (agent.yaml a FIFO, as in test_mcp_serve_front):
what hosts really do at start-up gets every answer exactly once, and every acknowledged write
is in the store afterwards.

- the whole start-up in one write (handshake, initialized, many tool calls), in both eras,
  with stdin closed before or after the open goes on;
- a host that closes stdin right after the handshake;
- a first line longer than the front looks at, and one longer than it keeps before the
  hand-over (the host's write blocks until the session reads on);
- the first request and a tool call written one byte at a time.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_mcp_serve_front import (
    CAPABILITIES_KEY,
    VERSION_KEY,
    HeldOpen,
    discover,
    initialize,
    line,
)

from convmem_engine.runtime.front import FIRST_LINE_BYTES, PRE_HANDOVER_BYTES
from convmem_engine.runtime.front_plan import answer_for
from convmem_engine.storage import Store

pytestmark = pytest.mark.posix  # FIFOs

INITIALIZED = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'
MODERN_META = {VERSION_KEY: "2026-07-28", CAPABILITIES_KEY: {}}


def call(request_id: object, name: str, arguments: dict[str, Any], modern: bool) -> bytes:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if modern:
        params["_meta"] = MODERN_META
    return line({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})


def writes(n: int, modern: bool, first_id: int = 2) -> list[bytes]:
    return [
        call(
            first_id + i,
            "write_message",
            {"session_id": "review", "role": "user", "content": f"message {i} ✓"},
            modern,
        )
        for i in range(n)
    ]


def answers_of(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(x) for x in raw.splitlines()]


def stored_contents(data_dir: Path) -> list[str]:
    with Store.open(data_dir) as store:
        return [m.content for m in store.messages.values()]


def check_one_answer_each(answers: list[dict[str, Any]], ids: list[object]) -> None:
    counted = Counter(json.dumps(a.get("id")) for a in answers)
    assert counted == Counter(json.dumps(i) for i in ids), counted
    for a in answers:
        assert "result" in a, a
        assert not a["result"].get("isError"), a


SLOW = pytest.mark.slow  # the other combinations: the default suite runs two of the four


@pytest.mark.parametrize(
    ("era", "eof_first"),
    [
        ("handshake", False),
        ("2026-07-28", True),
        pytest.param("handshake", True, marks=SLOW),
        pytest.param("2026-07-28", False, marks=SLOW),
    ],
)
def test_the_whole_start_up_in_one_write(tmp_path: Path, era: str, eof_first: bool) -> None:
    modern = era != "handshake"
    data_dir = tmp_path / "data"
    server = HeldOpen(data_dir)
    first = discover() if modern else initialize()
    calls = writes(30, modern)
    health = call(40, "get_system_health", {}, modern)
    lines = [first, *([] if modern else [INITIALIZED]), *calls, health]
    server.send(b"\n".join(lines))  # one write: HeldOpen.send adds the last newline
    found = answer_for(first)
    assert found is not None
    assert server.answer() == found[1]  # the front's, while the open is held
    if eof_first:
        assert server.proc.stdin is not None
        server.proc.stdin.close()
        server.proc.stdin = None  # finish() must not close it again
        server.release("enabled: false\n")
        assert server.proc.stdout is not None and server.proc.stderr is not None
        rest, err = server.proc.stdout.read(), server.proc.stderr.read()
        status = server.proc.wait(60)
        server.proc.stdout.close()
        server.proc.stderr.close()
    else:
        server.release("enabled: false\n")
        rest, err, status = server.finish()
    assert status == 0, err
    answers = answers_of(rest)
    check_one_answer_each(answers, [*range(2, 32), 40])  # no second handshake answer
    assert sorted(stored_contents(data_dir)) == sorted(f"message {i} ✓" for i in range(30))


def test_stdin_closed_right_after_the_handshake(tmp_path: Path) -> None:
    server = HeldOpen(tmp_path / "data")
    server.send(initialize(request_id="only"))
    found = answer_for(initialize(request_id="only"))
    assert found is not None
    assert server.answer() == found[1]
    assert server.proc.stdin is not None
    server.proc.stdin.close()
    server.proc.stdin = None
    server.release("enabled: false\n")
    assert server.proc.stdout is not None and server.proc.stderr is not None
    rest, err = server.proc.stdout.read(), server.proc.stderr.read()
    assert server.proc.wait(60) == 0, err
    server.proc.stdout.close()
    server.proc.stderr.close()
    assert rest == b"", "the SDK's duplicate of the handshake answer reached the host"


def _write_in_thread(server: HeldOpen, data: bytes) -> threading.Thread:
    """Write `data` and a newline from a thread (the pipe may fill while the open is held)."""
    thread = threading.Thread(target=server.send, args=(data,), daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    "size",
    [FIRST_LINE_BYTES + 10_000, pytest.param(3 * PRE_HANDOVER_BYTES, marks=SLOW)],
    ids=["long", "past-keep"],
)
def test_a_first_line_longer_than_the_front_reads(tmp_path: Path, size: int) -> None:
    """The first request is a handshake padded with a long client title: the front leaves it
    to the SDK, which answers it once; the calls after it are answered once each."""
    data_dir = tmp_path / "data"
    server = HeldOpen(data_dir)
    info = {"name": "host", "version": "1", "title": "t" * size}
    first = initialize(info=info)
    rest_lines = [INITIALIZED, *writes(5, modern=False)]
    writer = _write_in_thread(server, b"\n".join([first, *rest_lines]))
    server.release("enabled: false\n")
    writer.join(60)
    assert not writer.is_alive()
    out, err, status = server.finish()
    assert status == 0, err
    answers = answers_of(out)
    assert answers[0]["id"] == 1 and answers[0]["result"]["serverInfo"]["name"] == "convmem"
    check_one_answer_each(answers[1:], list(range(2, 7)))
    assert len(stored_contents(data_dir)) == 5


@SLOW
def test_a_garbage_first_line_past_what_the_front_keeps(tmp_path: Path) -> None:
    """3 MiB that are no JSON, then a handshake and calls: a parse error, then each answer
    once (the handshake by the SDK: the front only answers the first line)."""
    data_dir = tmp_path / "data"
    server = HeldOpen(data_dir)
    body = b"\n".join(
        [b"x" * (3 * PRE_HANDOVER_BYTES), initialize(), INITIALIZED, *writes(3, False)]
    )
    writer = _write_in_thread(server, body)
    server.release("enabled: false\n")
    writer.join(60)
    assert not writer.is_alive()
    out, err, status = server.finish()
    assert status == 0, err
    answers = answers_of(out)
    assert answers[0]["id"] is None and answers[0]["error"]["code"] == -32700
    assert answers[1]["id"] == 1 and "result" in answers[1]
    check_one_answer_each(answers[2:], [2, 3, 4])
    assert len(stored_contents(data_dir)) == 3


def test_the_first_request_and_a_call_written_a_byte_at_a_time(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = HeldOpen(data_dir)
    assert server.proc.stdin is not None
    first = initialize(request_id="tiny")
    for byte in first + b"\n" + INITIALIZED + b"\n":
        server.proc.stdin.write(bytes([byte]))
        server.proc.stdin.flush()
    found = answer_for(first)
    assert found is not None
    assert server.answer() == found[1]
    for byte in writes(1, modern=False)[0]:
        server.proc.stdin.write(bytes([byte]))
        server.proc.stdin.flush()
    server.send(b"")  # the call's newline
    server.release("enabled: false\n")
    assert json.loads(server.answer())["id"] == 2
    out, err, status = server.finish()
    assert status == 0, err
    assert out == b""
    assert stored_contents(data_dir) == ["message 0 ✓"]
