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

import pytest
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


def ping(server: RawServe, others: list[dict[str, Any]]) -> dict[str, Any]:
    """The answer to a ping; answers to other requests that come before it go to `others`."""
    server.send(b'{"jsonrpc":"2.0","id":"review-ping","method":"ping"}\n')
    answer: dict[str, Any] = server.answer_to("review-ping", others)
    return answer


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
    # the session still serves after the storm (a cancelled call's late answer may come first)
    assert "result" in ping(server, others)
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
    answers: list[dict[str, Any]] = []
    assert "result" in ping(server, answers)
    status = server.close()
    assert status == 0
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


# ---- the fast path and the SDK, byte for byte, on lines no SDK client writes ----------------

SESSIONS = b'{"name":"read_messages","arguments":{"view":"sessions"}}'


def raw(request_id: bytes, params: bytes = SESSIONS, method: bytes = b"tools/call") -> bytes:
    """A tools/call line as it is written, byte for byte."""
    head = b'{"jsonrpc":"2.0","id":' + request_id + b',"method":"' + method + b'"'
    return head + b',"params":' + params + b"}"


def read_with(arguments: bytes, extra: bytes = b"") -> bytes:
    return b'{"name":"read_messages","arguments":' + arguments + extra + b"}"


def write_with(session: bytes, content: bytes) -> bytes:
    arguments = b'{"session_id":"' + session + b'","role":"user","content":"' + content + b'"}'
    return b'{"name":"write_message","arguments":' + arguments + b"}"


RAW_CALLS = [
    # ids at and past the 64-bit edges, and odd spellings of numbers
    raw(b"9223372036854775807"),
    raw(b"9223372036854775808"),
    raw(b"18446744073709551616"),
    raw(b"-9223372036854775809"),
    raw(b"-0"),
    raw(b"1E2"),
    raw(b"10.0"),
    # string ids: empty, non-ASCII, escapes, a lone surrogate
    raw(b'""'),
    raw('"é✓"'.encode()),
    raw(b'"a\\"b\\u00e9"'),
    raw(b'"\\ud800"'),
    # spacing and key order, escapes in the method and the tool name, duplicate keys
    b'{ "params" : { "arguments" : { "view" : "sessions" } , "name" : "read_messages" } ,'
    b' "method" : "tools/call" , "id" : 101 , "jsonrpc" : "2.0" }',
    raw(b"102", method=b"tools\\/call"),
    raw(b"103", b'{"name":"read\\u005fmessages","arguments":{"view":"sessions"}}'),
    raw(b'104,"id":105'),
    raw(b"106", b'{"name":"no_such_tool","name":"read_messages","arguments":{"view":"sessions"}}'),
    raw(b"107", read_with(b'{"view":"x","view":"sessions"}')),
    # arguments null, absent, not an object; a lone surrogate and NULs in arguments
    raw(b"108", read_with(b"null")),
    raw(b"109", b'{"name":"get_system_health"}'),
    raw(b"110", read_with(b'"view"')),
    raw(b"111", write_with(b"s", b"a\\ud800b")),
    raw(b"112", write_with(b"s\\u0000", b"nul \\u0000 in it")),
    # progress tokens, _meta and task requests of odd kinds
    raw(
        b"113",
        read_with(b'{"view":"sessions"}', b',"_meta":{"progressToken":18446744073709551616}'),
    ),
    raw(b"114", read_with(b'{"view":"sessions"}', b',"_meta":null')),
    raw(b"115", read_with(b'{"view":"sessions"}', b',"task":{"ttl":1000}')),
    # a huge integer and a deep nesting inside the arguments
    raw(b"116", read_with(b'{"view":"history","session_id":"s","limit":100000000000000000000000}')),
    raw(b"117", read_with(b'{"view":' + b"[" * 3000 + b"]" * 3000 + b"}")),
]


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_odd_lines_get_the_same_bytes_from_the_fast_path_and_the_sdk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, era: str
) -> None:
    from test_fast_call import MODERN, fixed, legacy_script, modern_script, transcript

    if era == "legacy":  # the handshake of the legacy script, then each odd line alone
        script = [*legacy_script()[1:4], *(fixed(raw + b"\n") for raw in RAW_CALLS)]
    else:  # discover, then each line with the envelope as the first key of its params
        envelope = b'"params":{"_meta":' + json.dumps(MODERN).encode() + b","
        lines = [raw.replace(b'"params":{', envelope, 1) for raw in RAW_CALLS]
        script = [*modern_script()[:2], *(fixed(raw + b"\n") for raw in lines)]
    sdk = transcript(tmp_path, "sdk", script, False, monkeypatch)
    fast = transcript(tmp_path, "fast", script, True, monkeypatch)
    assert len(fast) == len(sdk)
    for ours, theirs in zip(fast, sdk, strict=True):
        assert ours == theirs
