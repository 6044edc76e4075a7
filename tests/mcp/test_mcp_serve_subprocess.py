"""`convmem serve` as users run it: a real subprocess driven by the SDK's stdio client.

Every tool and every error code, in both protocol eras; the lock, stdout hygiene, EOF and
SIGTERM. BUSY and CORRUPT_STORE cannot come from a tool call on a healthy open store (the store
raises them when it is opened), so they are checked where they happen: at `convmem serve`
start-up, as one line on stderr and the exit status.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp_helpers import ERAS, call, call_error, child_env, serve_args, serve_client

from convmem_engine.domain import limits
from convmem_engine.service import MemoryService
from convmem_engine.tools import MEMORY_TOOLS


def run(coro: Any) -> Any:
    return anyio.run(coro)


@pytest.mark.parametrize("mode", ERAS)
def test_every_tool_end_to_end(tmp_path: Path, mode: str) -> None:
    data_dir = tmp_path / "data"
    errlog = (tmp_path / "stderr.txt").open("w")

    async def scenario() -> None:
        async with serve_client(data_dir, mode, errlog) as client:
            expected = "2025-11-25" if mode == "legacy" else "2026-07-28"
            assert client.protocol_version == expected
            assert client.instructions and "search_messages" in client.instructions
            listed = await client.list_tools()
            assert [t.name for t in listed.tools] == [t.name for t in MEMORY_TOOLS]
            for tool in listed.tools:
                assert tool.input_schema["additionalProperties"] is False
                assert tool.annotations is not None and tool.annotations.open_world_hint is False

            first = await call(
                client,
                "write_message",
                session_id="s1",
                role="user",
                content="We chose PostgreSQL for the billing database.",
                metadata_json=json.dumps({"tags": ["project"], "memory_kind": "semantic"}),
            )
            assert first["status"] == "OK"
            mid = first["message"]["message_id"]
            assert first["message"]["revision"] == 1
            second = await call(
                client,
                "write_message",
                session_id="s1",
                role="assistant",
                content="Noted: 請求データベースはPostgreSQL。",
                metadata_json=json.dumps(
                    {"relations": [{"type": "derived_from", "message_id": mid}]}
                ),
            )
            mid2 = second["message"]["message_id"]

            updated = await call(
                client,
                "update_message",
                message_id=mid,
                metadata_json=json.dumps({"importance": 90}),
                expected_revision=1,
            )
            assert updated["changed"] is True and updated["message"]["revision"] == 2
            same = await call(
                client, "update_message", message_id=mid, metadata_json='{"importance":90}'
            )
            assert same["changed"] is False and same["message"]["revision"] == 2

            history = await call(client, "read_messages", session_id="s1", limit=1)
            assert [m["message_id"] for m in history["history"]] == [mid]
            page2 = await call(
                client, "read_messages", session_id="s1", limit=1, cursor=history["nextCursor"]
            )
            assert [m["message_id"] for m in page2["history"]] == [mid2]
            assert "nextCursor" not in page2

            piece = await call(
                client, "read_messages", view="content", message_id=mid2, content_limit=10
            )
            assert piece["content_range"]["complete"] is False
            context = await call(client, "read_messages", view="context", message_id=mid2)
            assert context["message"]["message_id"] == mid2
            assert context["relations"][0]["message"]["message_id"] == mid
            sessions = await call(client, "read_messages", view="sessions")
            assert [s["session_id"] for s in sessions["sessions"]] == ["s1"]

            found = await call(client, "search_messages", query="PostgreSQL", min_importance=80)
            assert [r["message_id"] for r in found["results"]] == [mid]
            found_ja = await call(client, "search_messages", query="請求データ")
            assert [r["message_id"] for r in found_ja["results"]] == [mid2]

            assert await call(client, "delete_message", message_id=mid2) == {"status": "OK"}
            gone = await call(client, "delete_message", message_id=mid2)
            assert gone == {"status": "NOT_FOUND"}

            rebuilt = await call(client, "rebuild_index")
            assert rebuilt["status"] == "OK" and rebuilt["messages_indexed"] == 1
            health = await call(client, "get_system_health")
            assert health["status"] == "OK" and health["active_messages"] == 1

    run(scenario)
    errlog.close()
    # Nothing of the content reaches the log.
    assert "PostgreSQL" not in (tmp_path / "stderr.txt").read_text()
    with MemoryService.open(data_dir) as svc:
        assert svc.check() == []
        assert len(svc.read_messages(session_id="s1")["history"]) == 1


@pytest.mark.parametrize("mode", ERAS)
def test_error_codes_end_to_end(tmp_path: Path, mode: str) -> None:
    errlog = (tmp_path / "stderr.txt").open("w")

    async def scenario() -> None:
        async with serve_client(tmp_path / "data", mode, errlog) as client:
            secret = "s3cr3t-value"
            error = await call_error(client, "write_message", session_id="s", role=secret)
            assert error["code"] == "VALIDATION_ERROR"
            assert "content: required" in error["message"] and "role:" in error["message"]
            assert secret not in error["message"]

            error = await call_error(
                client, "write_message", session_id="s", role="user", content="x", extra=secret
            )
            assert error["code"] == "VALIDATION_ERROR" and "unknown argument" in error["message"]

            error = await call_error(
                client,
                "write_message",
                session_id="s",
                role="user",
                content="x",
                metadata_json=json.dumps({"importance": 101, "note": secret}),
            )
            assert error["code"] == "VALIDATION_ERROR" and secret not in error["message"]

            written = await call(client, "write_message", session_id="s", role="user", content="a")
            mid = written["message"]["message_id"]
            missing = "0" * 26
            error = await call_error(client, "update_message", message_id=missing, content="b")
            assert error["code"] == "NOT_FOUND"
            error = await call_error(client, "read_messages", view="context", message_id=missing)
            assert error["code"] == "NOT_FOUND"
            error = await call_error(
                client, "update_message", message_id=mid, content="b", expected_revision=7
            )
            assert error["code"] == "CONFLICT"
            error = await call_error(
                client, "read_messages", view="content", message_id=mid, expected_revision=3
            )
            assert error["code"] == "CONFLICT"

    try:
        run(scenario)
    finally:
        errlog.close()


@pytest.mark.linux  # prlimit
def test_io_error_end_to_end(tmp_path: Path) -> None:
    """A real write failure: the file-size limit (RLIMIT_FSIZE) stops the log from growing."""
    if not Path("/usr/bin/prlimit").exists():
        pytest.skip("needs prlimit (util-linux)")
    errlog = (tmp_path / "stderr.txt").open("w")
    data_dir = tmp_path / "data"
    MemoryService.open(data_dir).close()  # create the store first, under no limit
    limit = sum(f.stat().st_size for f in data_dir.iterdir() if f.is_file()) + 256 * 1024

    async def scenario() -> None:
        prefix = ["/usr/bin/prlimit", f"--fsize={limit}"]
        async with serve_client(data_dir, "auto", errlog, prefix=prefix) as client:
            kept = await call(client, "write_message", session_id="s", role="user", content="ok")
            error = await call_error(
                client, "write_message", session_id="s", role="user", content="x" * 400_000
            )
            assert error["code"] == "IO_ERROR"
            health = await call(client, "get_system_health")
            assert health["status"] == "DEGRADED" and health["last_error"]
            history = await call(client, "read_messages", session_id="s")
            assert [m["message_id"] for m in history["history"]] == [kept["message"]["message_id"]]

    try:
        run(scenario)
    finally:
        errlog.close()


def _spawn(data_dir: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *serve_args(data_dir, *extra)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )


def _finish(proc: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    """The rest of stdout and stderr, then the exit. Not `communicate()`: it reads the raw pipe
    and would miss what `readline()` already buffered."""
    assert proc.stdout is not None and proc.stderr is not None
    rest = proc.stdout.read()
    err = proc.stderr.read()
    proc.wait(timeout=60)
    if proc.stdin is not None:
        proc.stdin.close()
    proc.stdout.close()
    proc.stderr.close()
    return rest, err


def test_held_lock_gives_one_line_and_status_2(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with MemoryService.open(data_dir):
        proc = subprocess.run(
            [sys.executable, *serve_args(data_dir)],
            input=b"",
            capture_output=True,
            env=child_env(),
            timeout=60,
        )
    assert proc.returncode == 2
    assert proc.stdout == b""
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("convmem serve: BUSY: ")
    assert "locked by another process" in lines[0]


def test_corrupt_store_gives_one_line_and_status_1(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with MemoryService.open(data_dir) as svc:
        svc.write_message(session_id="s", role="user", content="hello")
    for name in ("snapshot.bin",):
        (data_dir / name).unlink(missing_ok=True)
    log = data_dir / "active.log"
    raw = bytearray(log.read_bytes())
    raw[-3] ^= 0xFF  # inside the last complete record's payload: a CRC mismatch
    log.write_bytes(bytes(raw))
    proc = subprocess.run(
        [sys.executable, *serve_args(data_dir)],
        input=b"",
        capture_output=True,
        env=child_env(),
        timeout=60,
    )
    assert proc.returncode == 1 and proc.stdout == b""
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("convmem serve: CORRUPT_STORE: ")


def _request(request_id: int, method: str, params: dict[str, Any]) -> bytes:
    body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    return json.dumps(body).encode() + b"\n"


INIT = (
    _request(
        0,
        "initialize",
        {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        },
    )
    + b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
)


def _write_call(request_id: int, content: str) -> bytes:
    arguments = {"session_id": "w", "role": "user", "content": content}
    return _request(request_id, "tools/call", {"name": "write_message", "arguments": arguments})


def test_stdin_eof_answers_pending_requests_and_exits_cleanly(tmp_path: Path) -> None:
    """A client that writes its requests and closes stdin at once still gets every answer;
    stdout holds nothing but JSON-RPC lines."""
    data_dir = tmp_path / "data"
    malformed = (
        b'{"jsonrpc":"2.0","id":90,"method":"tools/call","params":{"name":"write_message",'
        b'"arguments":"SECRET-A"}}\n'
        b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":["SECRET-B"]}}\n'
    )
    requests = INIT + malformed + b"".join(_write_call(i, f"m{i}") for i in range(1, 21))
    proc = subprocess.run(
        [sys.executable, *serve_args(data_dir, "--log-level", "debug")],
        input=requests,
        capture_output=True,
        env=child_env(),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert sorted(a["id"] for a in answers) == [*range(21), 90]
    assert all("result" in a for a in answers if a["id"] != 90)
    assert b"m1" not in proc.stderr and b"SECRET" not in proc.stderr  # even at DEBUG
    with MemoryService.open(data_dir) as svc:
        assert len(svc.read_messages(session_id="w")["history"]) == 20


@pytest.mark.posix  # SIGTERM, SIGINT
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_writes_keeps_every_acknowledged_write(
    tmp_path: Path, signum: signal.Signals
) -> None:
    data_dir = tmp_path / "data"
    proc = _spawn(data_dir)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(INIT)
    total = 400
    for i in range(1, total + 1):
        proc.stdin.write(_write_call(i, f"durable {i}"))
    proc.stdin.flush()
    acknowledged: dict[int, str] = {}
    deadline = time.monotonic() + 60
    while len(acknowledged) < 30 and time.monotonic() < deadline:
        answer = json.loads(proc.stdout.readline())
        if answer["id"]:
            acknowledged[answer["id"]] = json.loads(answer["result"]["content"][0]["text"])[
                "message"
            ]["message_id"]
    proc.send_signal(signum)
    rest, err = _finish(proc)
    for line in rest.splitlines():
        answer = json.loads(line)
        if answer.get("id") and "result" in answer:
            text = answer["result"]["content"][0]["text"]
            acknowledged[answer["id"]] = json.loads(text)["message"]["message_id"]
    assert proc.returncode == 0, err.decode()
    assert len(acknowledged) > 30  # requests in progress at the signal were still answered
    with MemoryService.open(data_dir) as svc:
        stored = {m["message_id"] for m in svc.read_messages(session_id="w", limit=1000)["history"]}
        assert svc.check() == []
    assert set(acknowledged.values()) <= stored


def test_stdout_carries_only_protocol_even_when_code_prints(tmp_path: Path) -> None:
    """A stray print() inside the server process lands on stderr, not in the MCP stream."""
    code = (
        "import sys, builtins\n"
        "from convmem_app.cli import main\n"
        "import convmem_engine.mcp.server as s\n"
        "orig = s.build_server\n"
        "def noisy(service):\n"
        "    print('stray output')\n"
        "    return orig(service)\n"
        "s.build_server = noisy\n"
        f"sys.exit(main(['serve', '--data-dir', {str(tmp_path / 'data')!r}]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=INIT + _request(1, "tools/list", {}),
        capture_output=True,
        env=child_env(),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"stray output" in proc.stderr
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [a["id"] for a in answers] == [0, 1]


def test_hostile_lines_over_real_stdio(tmp_path: Path) -> None:
    """The 16 MiB line, invalid UTF-8 and non-JSON on the real stdin: each answered, then the
    next request is served and the store is intact."""
    big = b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"write_message",'
    big += b'"arguments":{"session_id":"h","role":"user","content":"'
    big += b"x" * (16 * limits.MIB) + b'"}}}\n'
    stream = (
        INIT
        + _write_call(1, "before")
        + b"\xff\xfe\xfd\n"
        + b"this is not json\n"
        + big
        + _write_call(2, "after")
    )
    proc = subprocess.run(
        [sys.executable, *serve_args(tmp_path / "data")],
        input=stream,
        capture_output=True,
        env=child_env(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    errors = [a for a in answers if "error" in a]
    assert sorted((a["id"] is None, a["error"]["code"]) for a in errors) == [
        (False, -32600),
        (True, -32700),
        (True, -32700),
    ]
    assert next(a for a in errors if a["id"] is not None)["id"] == 5
    assert {a["id"] for a in answers if "result" in a} == {0, 1, 2}
    with MemoryService.open(tmp_path / "data") as svc:
        contents = [m["content"] for m in svc.read_messages(session_id="w")["history"]]
        assert contents == ["before", "after"]
        assert svc.check() == []


def _serve_raw(data_dir: Path, stream: bytes) -> list[dict[str, Any]]:
    """Feed raw lines to a real `convmem serve`; its answers (stdout holds nothing else)."""
    proc = subprocess.run(
        [sys.executable, *serve_args(data_dir)],
        input=stream,
        capture_output=True,
        env=child_env(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_lone_surrogate_in_an_argument_is_a_validation_error_under_the_request_id(
    tmp_path: Path,
) -> None:
    """Issue 15 defect 4: "\\ud800" is valid JSON (JavaScript hosts write it); it was answered
    -32700 with id null, so the host could not match the answer and hung."""
    write = (
        b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"write_message",'
        b'"arguments":{"session_id":"w","role":"user","content":"%s"}}}\n'
    )
    read = (
        b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"read_messages",'
        b'"arguments":{"session_id":"w\\udc00"}}}\n'
    )
    stream = INIT + write % (1, b"SECRET \\ud800 text") + read + write % (2, b"fine")
    answers = _serve_raw(tmp_path / "data", stream)
    assert sorted(a["id"] for a in answers) == [0, 1, 2, 3]
    by_id = {a["id"]: a for a in answers}
    for request_id, field in ((1, "content"), (3, "session_id")):
        result = by_id[request_id]["result"]
        assert result["isError"] is True
        error = json.loads(result["content"][0]["text"])["error"]
        assert error == {
            "code": "VALIDATION_ERROR",
            "message": f"{field}: must be valid UTF-8 text",
        }
    assert by_id[2]["result"]["isError"] is False
    with MemoryService.open(tmp_path / "data") as svc:
        assert [m["content"] for m in svc.read_messages(session_id="w")["history"]] == ["fine"]
        assert svc.check() == []


def test_every_request_gets_an_answer_whatever_its_id(tmp_path: Path) -> None:
    """Issue 15 defect 6: ids that are not a string or an integer were taken for notifications
    and never answered. JSON-RPC: a number id is answered with that id, an unusable one with
    null; string and integer ids (however large) are served."""
    odd_ids = {
        b"1.5": 1.5,
        b"2.0": 2.0,
        b"-0.25e1": -2.5,
        b"1e400": None,
        b"true": None,
        b"false": None,
        b"null": None,
        b"{}": None,
        b'{"id":1}': None,
        b"[]": None,
        b"[7]": None,
    }
    lines = [b'{"jsonrpc":"2.0","id":%s,"method":"ping"}\n' % raw for raw in odd_ids]
    lines.append(b'{"jsonrpc":"2.0","method":"tools/list","id":[1]}\n')  # id after method
    big = 2**80
    served = [b'{"jsonrpc":"2.0","id":%d,"method":"ping"}\n' % big]
    served.append(b'{"jsonrpc":"2.0","id":"\\u00e9t\\u00e9","method":"ping"}\n')
    answers = _serve_raw(tmp_path / "data", INIT + b"".join(lines) + b"".join(served))
    assert len(answers) == 1 + len(lines) + len(served)  # one answer for every line
    errors = [a for a in answers if "error" in a]
    assert all(a["error"]["code"] == -32600 for a in errors)
    assert all("id must be a string or an integer" in a["error"]["message"] for a in errors)
    assert sorted(map(repr, (a["id"] for a in errors))) == sorted(
        map(repr, [*odd_ids.values(), None])
    )
    results = {json.dumps(a["id"]): a["result"] for a in answers if "result" in a}
    assert results[str(big)] == {} and results['"\\u00e9t\\u00e9"'] == {}


def test_default_data_dir_comes_from_environment(tmp_path: Path) -> None:
    env = child_env()
    env["CONVMEM_DATA_DIR"] = str(tmp_path / "from-env")
    proc = subprocess.run(
        [sys.executable, "-m", "convmem_app", "serve"],
        input=INIT + _write_call(1, "hello"),
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert os.path.exists(tmp_path / "from-env" / "active.log")


@pytest.mark.slow
@pytest.mark.posix  # SIGTERM, SIGINT
def test_repeated_sigterm_at_random_moments_never_loses_an_acknowledged_write(
    tmp_path: Path,
) -> None:
    import random

    from reliability_log import Tally

    rng = random.Random(20261130)
    data_dir = tmp_path / "data"
    acknowledged: set[str] = set()
    tally = Tally("SIGTERM of convmem serve during pipelined writes (clean stop)")
    with tally:
        for round_ in range(12):
            proc = _spawn(data_dir)
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(INIT)
            for i in range(1, 301):
                proc.stdin.write(_write_call(i, f"round {round_} write {i}"))
            proc.stdin.flush()
            wanted = rng.randrange(0, 200)
            seen = 0
            while seen <= wanted:
                answer = json.loads(proc.stdout.readline())
                if answer["id"]:
                    acknowledged.add(
                        json.loads(answer["result"]["content"][0]["text"])["message"]["message_id"]
                    )
                seen += 1
            proc.send_signal(signal.SIGTERM)
            rest, err = _finish(proc)
            tally.cases += 1
            tally.crashed += proc.returncode != 0
            assert proc.returncode == 0, err.decode()
            for line in rest.splitlines():
                answer = json.loads(line)
                if answer.get("id") and "result" in answer:
                    text = answer["result"]["content"][0]["text"]
                    acknowledged.add(json.loads(text)["message"]["message_id"])
            with MemoryService.open(data_dir) as svc:
                history = svc.read_messages(session_id="w", limit=1000)
                stored = {m["message_id"] for m in history["history"]}
                while "nextCursor" in history:
                    cursor = history["nextCursor"]
                    history = svc.read_messages(session_id="w", limit=1000, cursor=cursor)
                    stored |= {m["message_id"] for m in history["history"]}
                tally.crashed += svc.check() != []
            tally.lost = len(acknowledged - stored)
            assert acknowledged <= stored


def test_serve_never_loads_qt(tmp_path: Path) -> None:
    """`convmem serve` runs headless: after a full session, no Qt module was imported."""
    code = (
        "import sys\n"
        "from convmem_app.cli import main\n"
        f"status = main(['serve', '--data-dir', {str(tmp_path / 'data')!r}])\n"
        "qt = sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'shiboken6'))\n"
        "print(status, qt, file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=INIT + _write_call(1, "x"),
        capture_output=True,
        env=child_env(),
        timeout=60,
    )
    assert proc.stderr.decode().strip().splitlines()[-1] == "0 []"
    assert len(proc.stdout.splitlines()) == 2
