"""The official MCP Inspector (npm `@modelcontextprotocol/inspector`, its CLI) against ConvMem.

Issue 13 asks that the fast paths change nothing a client sees: "the MCP Inspector and the
official SDK client in both eras must see no difference". Each Inspector CLI run starts the
server, makes one handshake and one request, and exits, so every request here is among the first
a process answers: on `convmem serve` the standard-library front answers it (`runtime/front.py`)
while the store opens, and in the app the pipe's lane and the tools/call fast path do. The same
requests go to `convmem serve` with both turned off (`CONVMEM_FRONT_CALLS=0`,
`CONVMEM_MCP_FAST_PATH=0`: the SDK answers everything), and the Inspector's outputs must be the
same once the new message's id and times are named by order of appearance. So must the app's
through `convmem-shim`, and `convmem serve --http`'s with the bearer token (without it the
Inspector is refused). Both protocol eras (`--protocol-era legacy`: initialize; `modern`:
2026-07-28's server/discover), and `--strict`: the tool schemas have no portability problem the
Inspector knows of.

Slow (`-m slow`): the first run installs Node 22 and the Inspector from the npm registry into a
cache folder (~25 s); skipped when npm is not installed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from app_helpers import ROOT, RunningApp, shim_args

from convmem_engine.tools import MEMORY_TOOLS
from tests.served_http import Served

pytestmark = [pytest.mark.slow, pytest.mark.posix]

INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"
NODE = "node@22.23.3"  # the Inspector needs Node >= 22; the npm package brings its binary
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "convmem-tests"

SDK_ONLY = {"CONVMEM_FRONT_CALLS": "0", "CONVMEM_MCP_FAST_PATH": "0"}

WRITE = {
    "session_id": "inspector",
    "role": "user",
    "content": "the Inspector writes a memory",
    "metadata_json": json.dumps({"tags": ["probe"], "importance": 70, "summary": "a probe"}),
}


def call(tool: str, arguments: dict[str, Any] | None = None) -> list[str]:
    found = ["--method", "tools/call", "--tool-name", tool]
    return found if arguments is None else [*found, "--tool-args-json", json.dumps(arguments)]


# (name, Inspector arguments): a session's worth of the memory tools, each in a run of its own.
STEPS: list[tuple[str, list[str]]] = [
    ("list", ["--method", "tools/list", "--strict"]),
    ("write", call("write_message", WRITE)),
    ("refused", call("write_message", {**WRITE, "role": "robot"})),
    ("too_long", call("write_message", {**WRITE, "session_id": "s" * 257})),
    ("search", call("search_messages", {"query": "Inspector memory"})),
    ("read", call("read_messages", {"session_id": "inspector"})),
    ("health", call("get_system_health")),
    ("unknown_tool", call("no_such_tool")),
]
# Named by order of appearance: the same id or time in two outputs gets the same name.
NAMED = ("message_id", "timestamp", "updated_at")


def _install() -> Path:
    """The Inspector's CLI, installed once into the cache folder; skip without npm."""
    folder = CACHE / f"mcp-inspector-{INSPECTOR.rsplit('@', 1)[1]}"
    cli = folder / "node_modules" / ".bin" / "mcp-inspector"
    if cli.exists():
        return folder
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: the MCP Inspector comes from the npm registry")
    folder.mkdir(parents=True, exist_ok=True)
    quiet = ["--silent", "--no-audit", "--no-fund"]
    subprocess.run(
        [npm, "install", *quiet, "--prefix", str(folder), NODE, INSPECTOR], check=True, timeout=600
    )
    assert cli.exists()
    return folder


@pytest.fixture(scope="module")
def inspector() -> Path:
    return _install()


def run_inspector(
    folder: Path, era: str, server: list[str], args: list[str], env: dict[str, str], home: Path
) -> tuple[int, dict[str, Any], str]:
    """One Inspector CLI run: (exit status, its JSON output, its stderr)."""
    bin_dir = folder / "node_modules" / ".bin"
    command = [str(bin_dir / "mcp-inspector"), "--cli", "--protocol-era", era, "--format", "json"]
    for key, value in env.items():
        command += ["-e", f"{key}={value}"]
    command += args
    if server:
        command += ["--", *server]  # after "--": the server's own options stay its own
    # The Inspector keeps a catalog and a client config under HOME: a fresh one per test.
    outer = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(home)}
    done = subprocess.run(command, capture_output=True, timeout=120, env=outer, cwd=ROOT)
    output = json.loads(done.stdout) if done.stdout.strip() else {}
    stderr = done.stderr.decode(errors="replace")
    if done.returncode != 0:  # the Inspector's own error envelope is stderr's last line
        output["inspector_error"] = json.loads(stderr.strip().splitlines()[-1])["error"]
    return done.returncode, output, stderr


def serve_command(data_dir: Path) -> list[str]:
    """`convmem serve`, its log (INFO: what the front answered) appended to data_dir's
    sibling `serve.log`."""
    log = shlex.quote(str(data_dir.with_name(data_dir.name + "-serve.log")))
    serve = [sys.executable, "-m", "convmem_app", "serve", "--data-dir", str(data_dir)]
    return ["/bin/sh", "-c", f'exec "$0" "$@" 2>>{log}', *serve, "--log-level", "INFO"]


def front_answers(data_dir: Path) -> list[int]:
    """How many requests after the handshake the front answered, per run, from the log."""
    log = data_dir.with_name(data_dir.name + "-serve.log").read_text()
    runs = log.count("serving ")
    answered = [int(n) for n in re.findall(r"front: answered (\d+) request\(s\)", log)]
    return answered + [0] * (runs - len(answered))


def server_env(**extra: str) -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1", **extra}


def session(
    folder: Path,
    era: str,
    server: list[str],
    env: dict[str, str],
    home: Path,
    extra: list[str] | None = None,
) -> dict[str, tuple[int, Any]]:
    """Every step of `STEPS` in order, each in a run of its own: {name: (status, output)}.
    `extra`: more Inspector options (an HTTP server's URL and header; `server` then empty)."""
    outputs: dict[str, tuple[int, Any]] = {}
    for name, args in STEPS:
        status, output, stderr = run_inspector(
            folder, era, server, [*args, *(extra or [])], env, home
        )
        if name == "list":
            # --strict: exit 6 and the problems on stderr for any error-severity one.
            assert status == 0, stderr
        outputs[name] = (status, _decoded(output))
    return outputs


def _decoded(output: dict[str, Any]) -> Any:
    """The Inspector's JSON with each text content block's JSON parsed in place."""
    result = output.get("result")
    if isinstance(result, dict):
        for block in result.get("content", []):
            if block.get("type") == "text":
                block["text"] = json.loads(block["text"])
    return output


def normalised(outputs: dict[str, tuple[int, Any]]) -> dict[str, tuple[int, Any]]:
    names: dict[tuple[str, object], str] = {}

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if key in NAMED and isinstance(item, str | int):
                    item = names.setdefault((key, item), f"<{key} {len(names)}>")
                out[key] = walk(item)
            return out
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    return {name: (status, walk(output)) for name, (status, output) in outputs.items()}


def text_of(outputs: dict[str, tuple[int, Any]], name: str) -> Any:
    _status, output = outputs[name]
    blocks = output["result"]["content"]
    assert len(blocks) == 1
    return blocks[0]["text"]


def check_session(outputs: dict[str, tuple[int, Any]]) -> None:
    """What the spec says each step returns, as the Inspector reports it."""
    status, listed = outputs["list"]
    names = [tool["name"] for tool in listed["result"]["tools"]]
    assert names == [tool.name for tool in MEMORY_TOOLS]  # the seven, in the reference's order
    written = text_of(outputs, "write")
    assert written["status"] == "OK"
    assert written["message"]["content"] == WRITE["content"]
    assert written["message"]["metadata"]["tags"] == ["probe"]
    message_id = written["message"]["message_id"]
    assert re.fullmatch(r"[0-9A-HJKMNP-TV-Z]{26}", message_id)
    for refused, field in (("refused", "role"), ("too_long", "session_id")):
        status, output = outputs[refused]
        assert status != 0  # the Inspector's "tool returned isError" exit
        assert output["inspector_error"]["code"] == "tool_is_error"
        assert output["result"]["isError"] is True
        error = text_of(outputs, refused)["error"]
        assert error["code"] == "VALIDATION_ERROR"
        assert error["message"].startswith(f"{field}:")
    found = text_of(outputs, "search")["results"]
    assert [hit["message_id"] for hit in found] == [message_id]
    history = text_of(outputs, "read")["history"]
    assert [item["message_id"] for item in history] == [message_id]
    health = text_of(outputs, "health")
    assert health["status"] == "OK"
    assert health["active_messages"] == 1
    status, output = outputs["unknown_tool"]  # the Inspector looks it up in tools/list first
    assert status != 0
    assert output["inspector_error"]["code"] == "tool_not_found"


def assert_same_but_health_figures(
    long_lived: dict[str, tuple[int, Any]], sdk: dict[str, tuple[int, Any]]
) -> None:
    """Health describes the store's files and counters: a server that stays up between the
    runs (the app, HTTP) has its store open throughout (no snapshot at each exit, its own
    sequence), and one that answers early may do so while its search index loads, so health is
    compared by its fields and its message counts, not its sizes; everything else exactly."""
    ours, theirs = text_of(long_lived, "health"), text_of(sdk, "health")
    assert ours.keys() == theirs.keys()
    for key in ("status", "format_version", "active_messages", "session_count", "last_error"):
        assert ours[key] == theirs[key], key
    assert ours["memory_estimate"].keys() == theirs["memory_estimate"].keys()
    rest = {name: found for name, found in long_lived.items() if name != "health"}
    assert normalised(rest) == normalised({k: v for k, v in sdk.items() if k != "health"})


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_serve_answers_the_inspector_as_the_sdk_does(
    inspector: Path, era: str, tmp_path: Path
) -> None:
    fast = session(inspector, era, serve_command(tmp_path / "fast"), server_env(), tmp_path)
    sdk = session(inspector, era, serve_command(tmp_path / "sdk"), server_env(**SDK_ONLY), tmp_path)
    check_session(sdk)
    check_session(fast)
    # (health by fields: the front may answer it while the search index still loads, so its
    # memory figures depend on timing; with the SDK alone the index is always ready first)
    assert_same_but_health_figures(fast, sdk)
    # The front answered each run's requests after the handshake (tools/list, and the tool
    # call: the Inspector lists the tools first) in the fast runs, none in the SDK-only ones.
    # (The unknown tool never reaches the server: the Inspector finds it missing in the list.)
    assert front_answers(tmp_path / "fast") == [1, 2, 2, 2, 2, 2, 2, 1]
    assert front_answers(tmp_path / "sdk") == [0] * len(STEPS)


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_app_through_the_shim_answers_the_inspector_as_the_sdk_does(
    inspector: Path, era: str, running_app: RunningApp, tmp_path: Path
) -> None:
    shim = [sys.executable, *shim_args(running_app.data_dir)]
    env = server_env(XDG_RUNTIME_DIR=os.environ["XDG_RUNTIME_DIR"])
    through_app = session(inspector, era, shim, env, tmp_path)
    sdk = session(inspector, era, serve_command(tmp_path / "sdk"), server_env(**SDK_ONLY), tmp_path)
    check_session(through_app)
    assert_same_but_health_figures(through_app, sdk)


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_http_answers_the_inspector_as_stdio_does_and_refuses_it_without_the_token(
    inspector: Path, era: str, tmp_path: Path
) -> None:
    token = "inspector-" + "t" * 40
    with Served(tmp_path / "http", tmp_path / "http.log", "--no-stdio", token=token) as served:
        http = ["--transport", "http", "--server-url", served.url]
        bearer = ["--header", f"Authorization: Bearer {token}"]
        over_http = session(inspector, era, [], {}, tmp_path, extra=[*http, *bearer])
        # Without the token: refused (401), and the Inspector, finding no stored login and
        # told not to start one, reports that it needs authorisation; nothing is written.
        status, output, stderr = run_inspector(
            inspector,
            era,
            [],
            [*call("write_message", WRITE), *http, "--stored-auth-only"],
            {},
            tmp_path,
        )
        assert status != 0
        assert output["inspector_error"]["code"] == "auth_required", stderr
        status, output, stderr = run_inspector(
            inspector, era, [], [*dict(STEPS)["read"], *http, *bearer], {}, tmp_path
        )
        assert status == 0, stderr
        assert len(_decoded(output)["result"]["content"][0]["text"]["history"]) == 1
    sdk = session(inspector, era, serve_command(tmp_path / "sdk"), server_env(**SDK_ONLY), tmp_path)
    check_session(over_http)
    assert_same_but_health_figures(over_http, sdk)
    assert WRITE["content"] not in (tmp_path / "http.log").read_text()  # no content logged
