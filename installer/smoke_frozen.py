"""Smoke test of a one-folder PyInstaller build of ConvMem (installer/convmem.spec), any OS.

    python installer/smoke_frozen.py dist/ConvMem [--visible] [--timings N] [--app-data-dir D]

Needs only the `mcp` SDK in the running interpreter (the build venv has it). Everything runs in
fresh temporary folders; the user's own data dir and running apps are never touched.

1. `convmem-cli --help` prints the usage.
2. `convmem-cli serve`: the SDK's stdio client writes one message and reads it back.
3. `convmem-shim` with no app running starts the bundled `ConvMem` app (offscreen unless
   --visible), writes, reads and searches through it (in D with --app-data-dir, e.g. the
   default data folder of an installed copy, which the release workflow then checks survives
   the uninstaller); a control `status` through a second shim names the
   app's pid; a control `quit` ends it; a shim with `--start-timeout 0` then finds no app.
4. The data written through the app is read back by `convmem-cli serve` (the app released the
   lock and everything it acknowledged is on disk).
5. With --timings N: median wall times of N runs, frozen and from source (`python -m
   convmem_app`, its bytecode compiled first), taking turns: `convmem-shim --start-timeout 0`
   with no app (start, find nobody, exit 1), `convmem-cli --help`, and `convmem-cli serve`
   from its start to its answer to `initialize` on an empty data folder.

Exit status 0 when every check passed; each check prints one line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

IS_WINDOWS = sys.platform == "win32"
EXE = ".exe" if IS_WINDOWS else ""


class SmokeError(Exception):
    pass


def exe(dist: Path, name: str) -> Path:
    path = dist / f"{name}{EXE}"
    if not path.is_file():
        raise SmokeError(f"{path} is missing")
    return path


def child_env(work: Path, visible: bool) -> dict[str, str]:
    """Our environment (the stdio client passes only a few variables on its own), with private
    socket and settings folders on Linux/macOS and the offscreen Qt platform."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVMEM_")}
    for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(key, None)  # the frozen programs must not need them
    if not IS_WINDOWS:
        runtime = Path(tempfile.mkdtemp(prefix="cmsmk", dir="/tmp"))
        runtime.chmod(0o700)
        env["XDG_RUNTIME_DIR"] = str(runtime)
        env["XDG_CONFIG_HOME"] = str(work / "config")
    if not visible:
        env["QT_QPA_PLATFORM"] = "offscreen"
    return env


def payload(result: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(result.content[0].text)
    if result.is_error:
        raise SmokeError(f"tool error: {data}")
    return data


async def write_and_read(params: StdioServerParameters, errlog: Any, session: str) -> str:
    async with Client(stdio_client(params, errlog=errlog)) as client:
        written = payload(
            await client.call_tool(
                "write_message",
                {"session_id": session, "role": "user", "content": f"hello from {session}"},
            )
        )
        message_id = str(written["message"]["message_id"])
        history = payload(await client.call_tool("read_messages", {"session_id": session}))
        contents = [m["content"] for m in history["history"]]
        if contents != [f"hello from {session}"]:
            raise SmokeError(f"read back {contents!r}")
        found = payload(
            await client.call_tool("search_messages", {"query": "hello", "session_id": session})
        )
        hits = [str(r["message_id"]) for r in found["results"]]
        if hits != [message_id]:
            raise SmokeError(f"search_messages found {hits!r}, not {message_id}")
        return message_id


async def search_rebuilt(
    params: StdioServerParameters, errlog: Any, session: str, message_id: str
) -> None:
    """On a store whose search.idx is gone: the index is rebuilt (the batch build, NumPy), then
    searched."""
    async with Client(stdio_client(params, errlog=errlog)) as client:
        deadline = time.monotonic() + 120
        while True:
            health = payload(await client.call_tool("get_system_health", {}))
            if health["memory_estimate"]["search_index_bytes"] > 0:
                break
            if time.monotonic() > deadline:
                raise SmokeError("the search index was not rebuilt within 120 s")
            await anyio.sleep(0.2)
        found = payload(
            await client.call_tool("search_messages", {"query": "hello", "session_id": session})
        )
        hits = [str(r["message_id"]) for r in found["results"]]
        if hits != [message_id]:
            raise SmokeError(f"search_messages after the rebuild found {hits!r}, not {message_id}")


async def read_session(params: StdioServerParameters, errlog: Any, session: str) -> list[str]:
    async with Client(stdio_client(params, errlog=errlog)) as client:
        history = payload(await client.call_tool("read_messages", {"session_id": session}))
        return [str(m["message_id"]) for m in history["history"]]


def control_through_shim(
    shim: Path, data_dir: Path, env: dict[str, str], command: str
) -> dict[str, Any]:
    """A control message to the running app through a fresh shim (the app recognises a
    connection whose first bytes are `{"convmem_control":`)."""
    process = subprocess.Popen(
        [str(shim), "--data-dir", str(data_dir), "--start-timeout", "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(json.dumps({"convmem_control": command}).encode() + b"\n")
    process.stdin.flush()
    line = process.stdout.readline()  # keep stdin open until the answer is here
    process.stdin.close()
    process.stdout.read()
    process.wait(30)
    if not line:
        raise SmokeError(f"no answer to control {command!r}")
    answer: dict[str, Any] = json.loads(line)
    if answer.get("convmem_control") != "ok":
        raise SmokeError(f"control {command!r} answered {answer!r}")
    return answer


def no_app_running(shim: Path, data_dir: Path, env: dict[str, str]) -> bool:
    done = subprocess.run(
        [str(shim), "--data-dir", str(data_dir), "--start-timeout", "0"],
        input=b"",
        capture_output=True,
        env=env,
        timeout=60,
    )
    return done.returncode == 1 and b"no ConvMem app is running" in done.stderr


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SmokeError(f"timed out waiting until {what}")
        time.sleep(0.1)


def process_executable(pid: int) -> str | None:
    if sys.platform.startswith("linux"):
        try:
            return os.path.realpath(f"/proc/{pid}/exe")
        except OSError:
            return None
    return None


def interleaved_medians(runs: list[tuple[list[str], dict[str, str]]], count: int) -> list[float]:
    """Median wall time in ms of each (command, env), the commands taking turns so that a
    busy machine slows them alike."""
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(count):
        for index, (command, env) in enumerate(runs):
            start = time.perf_counter()
            subprocess.run(command, input=b"", capture_output=True, env=env, timeout=60)
            times[index].append((time.perf_counter() - start) * 1000)
    return [statistics.median(series) for series in times]


INITIALIZE = (
    json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "smoke_frozen", "version": "1"},
            },
        }
    )
    + "\n"
).encode()


def interleaved_handshakes(
    runs: list[tuple[list[str], dict[str, str]]], data_dir: Path, count: int
) -> list[float]:
    """Median wall time in ms from the start of each `serve` command (given without its data
    folder) to its answer to `initialize`, the commands taking turns on one data folder."""
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(count):
        for index, (command, env) in enumerate(runs):
            start = time.perf_counter()
            process = subprocess.Popen(
                [*command, "--data-dir", str(data_dir)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
            )
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(INITIALIZE)
            process.stdin.flush()
            answer = process.stdout.readline()
            times[index].append((time.perf_counter() - start) * 1000)
            process.stdin.close()
            process.stdout.read()
            process.wait(60)
            if b'"id":1' not in answer.replace(b" ", b""):
                raise SmokeError(f"{command[0]} serve: no answer to initialize")
    return [statistics.median(series) for series in times]


def startup_figures(dist: Path, work: Path, env: dict[str, str], count: int) -> None:
    """Frozen against source, taking turns, medians of `count`: the shim with no app, the
    command line's `--help`, `serve`'s handshake. The source tree's bytecode is compiled first
    (as an installed copy has it; PYTHONDONTWRITEBYTECODE would make every start compile)."""
    root = Path(__file__).resolve().parent.parent
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "convmem_engine", "convmem_app"],
        cwd=root,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    source_env = dict(env)
    source_env["PYTHONPATH"] = str(root)
    source = [sys.executable, "-m", "convmem_app"]
    cli, shim = str(exe(dist, "convmem-cli")), str(exe(dist, "convmem-shim"))
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    tail = ["--data-dir", str(work / "nobody"), "--start-timeout", "0"]
    figures = {
        "convmem-shim start-to-exit with no app": interleaved_medians(
            [([shim, *tail], env), ([*source, "shim", *tail], source_env)], count
        ),
        "convmem-cli --help": interleaved_medians(
            [([cli, "--help"], env), ([*source, "--help"], source_env)], count
        ),
        "convmem-cli serve, start to the answer to initialize (empty store)": (
            interleaved_handshakes(
                [([cli, "serve"], env), ([*source, "serve"], source_env)],
                work / "handshakes",
                count,
            )
        ),
    }
    for what, (frozen, from_source) in figures.items():
        print(
            f"fig {what}, median of {count}: frozen {frozen:.0f} ms, source {from_source:.0f} ms"
            f" (ratio {frozen / from_source:.2f})"
        )
    if load is not None:
        print(
            f"fig load average before the figures: {load[0]:.2f}, after: {os.getloadavg()[0]:.2f}"
        )


def run(dist: Path, visible: bool, timings: int, app_data_dir: Path | None = None) -> None:
    dist = dist.resolve()
    cli, shim, app = exe(dist, "convmem-cli"), exe(dist, "convmem-shim"), exe(dist, "ConvMem")
    work = Path(tempfile.mkdtemp(prefix="convmem-smoke-"))
    env = child_env(work, visible)
    errlog_path = work / "stderr.log"
    app_dir = app_data_dir.resolve() if app_data_dir else work / "app-data"
    app_may_run = False
    try:
        with errlog_path.open("w") as errlog:
            usage = subprocess.run([str(cli), "--help"], capture_output=True, env=env, timeout=60)
            if usage.returncode != 0 or b"convmem serve" not in usage.stdout:
                raise SmokeError(f"convmem-cli --help: status {usage.returncode}")
            print("ok  convmem-cli --help prints the usage")

            serve_dir = work / "serve-data"
            serve = StdioServerParameters(
                command=str(cli), args=["serve", "--data-dir", str(serve_dir)], env=env
            )
            written = anyio.run(write_and_read, serve, errlog, "frozen-serve")
            print("ok  convmem-cli serve: write_message + read_messages + search over stdio")
            (serve_dir / "search.idx").unlink()  # (written at the clean close)
            anyio.run(search_rebuilt, serve, errlog, "frozen-serve", written)
            print("ok  convmem-cli serve rebuilds a search index it lost, and searches it")

            through_shim = StdioServerParameters(
                command=str(shim), args=["--data-dir", str(app_dir)], env=env
            )
            started = time.perf_counter()
            app_may_run = True
            # A fresh session: a given --app-data-dir may hold earlier runs' messages.
            session = f"frozen-shim-{os.urandom(6).hex()}"
            message_id = anyio.run(write_and_read, through_shim, errlog, session)
            elapsed = time.perf_counter() - started
            status = control_through_shim(shim, app_dir, env, "status")
            pid = int(status["pid"])
            running = process_executable(pid)
            if running is not None and Path(running) != app.resolve():
                raise SmokeError(f"the shim started {running}, not {app}")
            print(
                f"ok  convmem-shim started the bundled app (pid {pid}"
                f"{', ' + Path(running).name if running else ''}) and wrote + read through it"
                f" ({elapsed:.1f} s from a cold start)"
            )
            control_through_shim(shim, app_dir, env, "quit")
            wait_for(lambda: no_app_running(shim, app_dir, env), 60, "the app has quit")
            app_may_run = False
            print("ok  control quit ended the app; a shim with --start-timeout 0 finds no app")

            reread = StdioServerParameters(
                command=str(cli), args=["serve", "--data-dir", str(app_dir)], env=env
            )
            ids = anyio.run(read_session, reread, errlog, session)
            if ids != [message_id]:
                raise SmokeError(f"after the app quit, serve read {ids!r}")
            print("ok  convmem-cli serve reads what the app acknowledged (lock released)")

            if timings:
                startup_figures(dist, work, env, timings)
    except BaseException:
        log = errlog_path.read_text(errors="replace") if errlog_path.exists() else ""
        if log.strip():
            print("--- stderr of the frozen programs ---\n" + log[-4000:], file=sys.stderr)
        raise
    finally:
        if app_may_run:  # a check failed while the app ran: ask it to quit
            with contextlib.suppress(Exception):
                control_through_shim(shim, app_dir, env, "quit")
        shutil.rmtree(work, ignore_errors=True)
        if "XDG_RUNTIME_DIR" in env and not IS_WINDOWS:
            shutil.rmtree(env["XDG_RUNTIME_DIR"], ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Smoke-test a one-folder ConvMem build.")
    parser.add_argument("dist", type=Path, help="the folder PyInstaller made (dist/ConvMem)")
    parser.add_argument("--visible", action="store_true", help="run the app on the real screen")
    parser.add_argument("--timings", type=int, default=0, metavar="N", help="startup figures")
    parser.add_argument(
        "--app-data-dir", type=Path, help="data folder for the app checks (default: temporary)"
    )
    args = parser.parse_args(argv)
    try:
        run(args.dist, args.visible, args.timings, args.app_data_dir)
    except SmokeError as exc:
        print(f"FAIL {exc}", file=sys.stderr)
        return 1
    print("smoke test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
