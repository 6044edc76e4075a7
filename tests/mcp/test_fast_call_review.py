"""Review of the `tools/call` fast path (issue 13) through a real `convmem serve` over pipes:

- hundreds of calls written at once, far past the session's in-flight cap, while the host does
  not read its output (the server's stdout fills, reading pauses, the host's writes block):
  once the host reads again every call is answered exactly once and every acknowledged write
  is in the store;
- calls cancelled right after they were sent (racing their answers): no answer twice, every
  call not cancelled answered, every answered write stored, the session still serving;
- the same id twice in flight, and a call whose id is a string that looks like another's
  integer id: nothing hangs, nothing is answered twice per request.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from mcp_helpers import child_env, serve_args
from raw_serve import RawServe

from convmem_engine.mcp.line_transport import MAX_IN_FLIGHT
from convmem_engine.storage import Store

INIT = (
    b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
    b'"capabilities":{},"clientInfo":{"name":"review","version":"1"}}}\n'
    b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
)


def write_call(request_id: object, content: str) -> bytes:
    arguments = {"session_id": "review", "role": "user", "content": content}
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "write_message", "arguments": arguments},
    }
    return json.dumps(body).encode() + b"\n"


def cancel(request_id: object) -> bytes:
    body = {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": request_id, "reason": "review"},
    }
    return json.dumps(body).encode() + b"\n"


def written_id(answer: dict[str, Any]) -> str:
    assert "result" in answer, answer
    result = answer["result"]
    assert not result.get("isError"), result
    data = json.loads(result["content"][0]["text"])
    assert data["status"] == "OK", data
    return str(data["message"]["message_id"])


def stored(data_dir: Path) -> dict[str, str]:
    with Store.open(data_dir) as store:
        return {m.message_id: m.content for m in store.messages.values()}


def test_many_calls_past_the_cap_while_the_host_does_not_read(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    n = 16 * MAX_IN_FLIGHT
    # ~4 KB per request line, ~200 bytes per answer: the answers overflow stdout's 64 KiB pipe
    # and the requests everything the server may buffer (what the front keeps before the
    # hand-over, the read-ahead, the cap)
    body = INIT + b"".join(write_call(i, f"m{i} " + "é" * 650) for i in range(1, n + 1))
    proc = subprocess.Popen(
        [sys.executable, *serve_args(data_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    assert proc.stdin is not None
    stdin, proc.stdin = proc.stdin, None  # written by the host's thread only
    done = threading.Event()

    def host_writes() -> None:
        stdin.write(body)  # blocks while the server, at its cap, stops reading
        stdin.close()
        done.set()

    writer = threading.Thread(target=host_writes, daemon=True)
    writer.start()
    # The host reads nothing for a while (the server's answers back up), then everything.
    done.wait(3)
    out, err = proc.communicate(timeout=600)
    writer.join(60)
    assert proc.returncode == 0, err[-2000:]
    answers = [json.loads(x) for x in out.splitlines()]
    counted = Counter(a["id"] for a in answers)
    assert counted == Counter(range(n + 1)), [k for k, v in counted.items() if v != 1]
    ids = {a["id"]: written_id(a) for a in answers if a["id"] != 0}
    contents = stored(data_dir)
    assert {contents[mid].split()[0] for mid in ids.values()} == {f"m{i}" for i in range(1, n + 1)}
    assert len(contents) == n


def test_calls_cancelled_as_they_are_sent(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = RawServe(data_dir, tmp_path / "serve.err")
    n = 3 * MAX_IN_FLIGHT
    cancelled = set(range(1, n + 1, 2))
    burst = b"".join(
        write_call(i, f"c{i}") + (cancel(i) if i in cancelled else b"") for i in range(1, n + 1)
    )
    server.send(burst)
    others: list[dict[str, Any]] = []
    due = set(range(1, n + 1)) - cancelled
    while not due <= {a["id"] for a in others}:  # in any order
        others.append(server.next_answer())
    # the session still serves after the storm
    assert "result" in server.request("ping")
    status = server.close()
    assert status == 0
    while True:  # whatever was still on its way before the end of output
        item = server.lines.get_nowait()
        if item is None:
            break
        assert isinstance(item, dict), item
        others.append(item)
    counted = Counter(a["id"] for a in others)
    assert all(v == 1 for v in counted.values()), counted
    assert set(counted) <= set(range(1, n + 1))
    assert set(range(1, n + 1)) - cancelled <= set(counted)
    contents = stored(data_dir)
    for a in others:  # every answered write is durable
        assert contents[written_id(a)] == f"c{a['id']}"
    # a cancelled call that was not answered may or may not have been stored; nothing else is
    assert set(contents.values()) <= {f"c{i}" for i in range(1, n + 1)}


def test_the_same_id_twice_in_flight_and_a_string_twin(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = RawServe(data_dir, tmp_path / "serve.err")
    server.send(write_call(7, "first") + write_call(7, "second") + write_call("7", "twin"))
    assert "result" in server.request("ping")
    status = server.close()
    assert status == 0
    answers: list[dict[str, Any]] = []
    while True:
        item = server.lines.get_nowait()
        if item is None:
            break
        assert isinstance(item, dict), item
        answers.append(item)
    # three requests: at most three answers, none of them for another id
    assert len(answers) <= 3 and all(str(a["id"]) == "7" for a in answers), answers
    contents = stored(data_dir)
    for a in answers:
        if "result" in a and not a["result"].get("isError"):
            assert written_id(a) in contents
    assert set(contents.values()) <= {"first", "second", "twin"}
