"""The app as users run it: a real `convmem app` process (offscreen), real shims, real sockets.

Many hosts at once through the SDK's stdio client, a shim killed mid-request, a graceful quit
while a host is writing, reopen: every acknowledged write is there. The shim's auto-start from
a cold state (also many shims at once), the second instance, the socket's permissions and the
shim's contract on stdout / stderr / exit status.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import anyio
import pytest
from app_helpers import (
    INITIALIZED,
    ROOT,
    RunningApp,
    child_env,
    control,
    initialize_request,
    lines,
    raw_shim,
    run_shim,
    shim_client,
    wait_gone,
    wait_listening,
    write_call,
)
from tool_results import call

from convmem_app.shim.paths import endpoint
from convmem_engine.service import MemoryService

# The app over its AF_UNIX socket, SIGTERM, fork/setuid, socket modes: POSIX only (the
# Windows named pipe is proved by tests/shim and the `windows` tests).
pytestmark = pytest.mark.posix

HOSTS = 16
INITIALIZE = initialize_request("raw-host")


def stored_ids(data_dir: Path) -> set[str]:
    service = MemoryService.open(data_dir)
    try:
        ids: set[str] = set()
        sessions = service.read_messages(view="sessions", limit=1000)["sessions"]
        for entry in sessions:
            history = service.read_messages(session_id=entry["session_id"], limit=1000)
            ids.update(m["message_id"] for m in history["history"])
        assert service.check() == []
        return ids
    finally:
        service.close()


def test_many_hosts_kill_one_quit_while_writing_reopen(
    running_app: RunningApp, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    data_dir = running_app.data_dir
    acknowledged: set[str] = set()
    errlog = (tmp_path / "shims.log").open("w")
    request.addfinalizer(errlog.close)

    async def host(
        index: int, connected: anyio.Event, all_in: anyio.Event, counter: list[int]
    ) -> None:
        async with shim_client(data_dir, errlog) as client:
            counter[0] += 1
            if counter[0] == HOSTS:
                connected.set()
            await all_in.wait()
            session = f"host-{index}"
            for n in range(3):
                result = await call(
                    client, "write_message", session_id=session, role="user", content=f"m{n}"
                )
                acknowledged.add(result["message"]["message_id"])
            history = await call(client, "read_messages", session_id=session)
            assert [m["content"] for m in history["history"]] == ["m0", "m1", "m2"]

    async def scenario() -> None:
        connected, all_in, counter = anyio.Event(), anyio.Event(), [0]
        async with anyio.create_task_group() as group:
            for index in range(HOSTS):
                group.start_soon(host, index, connected, all_in, counter)
            with anyio.fail_after(60):
                await connected.wait()
            status = await anyio.to_thread.run_sync(control, data_dir, "status")
            assert status is not None and status["hosts"] == HOSTS
            all_in.set()

    anyio.run(scenario)
    assert len(acknowledged) == 3 * HOSTS

    # A shim killed while its write is on its way: the app carries on with everyone else.
    victim = raw_shim(data_dir)
    assert victim.stdin is not None
    victim.stdin.write(lines(INITIALIZE, INITIALIZED, write_call(2, "victim", "lost?")))
    victim.stdin.flush()
    victim.kill()
    victim.communicate()

    # Quit (SIGTERM) while a host keeps writing: what was acknowledged is durable.
    async def writer_until_quit() -> None:
        async with shim_client(data_dir, errlog) as client:
            for n in range(10_000):
                try:
                    result = await call(
                        client, "write_message", session_id="late", role="user", content=f"{n}"
                    )
                except Exception:
                    return  # the app quit: this write was not acknowledged
                acknowledged.add(result["message"]["message_id"])
                if n == 5:
                    running_app.process.send_signal(signal.SIGTERM)
            raise AssertionError("the app never quit")

    anyio.run(writer_until_quit)
    assert running_app.process.wait(30) == 0
    assert not Path(endpoint(data_dir)).exists()
    stored = stored_ids(data_dir)
    assert acknowledged <= stored
    assert len(acknowledged) >= 3 * HOSTS + 6


@pytest.mark.linux  # counts the app processes through /proc
def test_shim_starts_the_app_from_cold(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    data_dir = tmp_path / "cold"
    errlog = (tmp_path / "shim.log").open("w")
    request.addfinalizer(errlog.close)
    pids: list[int] = []

    async def one(index: int) -> None:
        async with shim_client(data_dir, errlog) as client:
            result = await call(
                client, "write_message", session_id="cold", role="user", content=f"c{index}"
            )
            assert result["status"] == "OK"

    async def scenario() -> None:
        async with anyio.create_task_group() as group:  # several shims at the same moment
            for index in range(4):
                group.start_soon(one, index)

    try:
        anyio.run(scenario)
        status = wait_listening(data_dir)
        pids.append(int(status["pid"]))
        assert os.getsid(pids[0]) != os.getsid(0), "the app must run in its own session"
        apps = [
            pid for pid in os.listdir("/proc") if pid.isdigit() and _is_app_for(int(pid), data_dir)
        ]
        assert apps == [str(pids[0])], "exactly one app was started"
    finally:
        control(data_dir, "quit")
        for pid in pids:
            wait_gone(pid)
    assert len(stored_ids(data_dir)) == 4


def _is_app_for(pid: int, data_dir: Path) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"app" in argv and str(data_dir).encode() in argv


def test_second_instance_hands_over_and_exits_zero(running_app: RunningApp) -> None:
    second = subprocess.run(
        [sys.executable, "-m", "convmem_app", "app", "--data-dir", str(running_app.data_dir)],
        capture_output=True,
        env=child_env(),
        cwd=ROOT,
        timeout=60,
    )
    assert second.returncode == 0
    assert b"already running" in second.stderr
    status = control(running_app.data_dir, "status")
    assert status is not None and status["window_visible"] is True
    assert running_app.process.poll() is None


def test_socket_is_private(running_app: RunningApp) -> None:
    path = Path(endpoint(running_app.data_dir))
    info = path.lstat()
    assert stat.S_ISSOCK(info.st_mode)
    assert info.st_uid == os.getuid()
    assert stat.S_IMODE(info.st_mode) & 0o077 == 0
    folder = path.parent.lstat()
    assert folder.st_uid == os.getuid()
    assert stat.S_IMODE(folder.st_mode) == 0o700
    if os.getuid() != 0:
        return
    # As root we can also prove it: a process of another user cannot reach the socket.
    # (The forked child only drops privileges, connects and exits, so Python 3.12's warning
    # about forking a threaded process does not apply.)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked child only
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(str(path))
            code = 0
        except PermissionError:
            code = 13
        finally:
            os._exit(code)
    _pid, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 13


def test_shim_answers_requests_sent_before_stdin_closed(running_app: RunningApp) -> None:
    shim = raw_shim(running_app.data_dir)
    out, err = shim.communicate(
        lines(INITIALIZE, INITIALIZED, write_call(2, "eof", "written then closed")), timeout=60
    )
    assert shim.returncode == 0, err
    assert err == b""
    replies = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in replies] == [1, 2]
    assert json.loads(replies[1]["result"]["content"][0]["text"])["status"] == "OK"


def test_shim_ends_stdout_when_the_app_quits(running_app: RunningApp) -> None:
    shim = raw_shim(running_app.data_dir)
    assert shim.stdin is not None and shim.stdout is not None
    shim.stdin.write(lines(INITIALIZE))
    shim.stdin.flush()
    assert json.loads(shim.stdout.readline())["id"] == 1
    assert running_app.quit() == 0
    assert shim.stdout.read() == b""  # end of stream, nothing else
    assert shim.wait(30) == 1
    assert shim.stderr is not None
    err = shim.stderr.read().decode()
    assert err.count("\n") == 1 and err.startswith("convmem-shim: ")
    shim.stdin.close()
    shim.stdout.close()
    shim.stderr.close()


def test_shim_without_app_and_without_start_fails_with_one_line(tmp_path: Path) -> None:
    result = run_shim(tmp_path / "none", "--start-timeout", "0", stdin=lines(INITIALIZE))
    assert result.returncode == 1
    assert result.stdout == b""
    assert result.stderr.count(b"\n") == 1 and b"no ConvMem app is running" in result.stderr


def test_shim_names_a_refused_socket_directory_and_the_fix(
    tmp_path: Path, private_dirs: Path
) -> None:
    planted = private_dirs / "convmem"
    (tmp_path / "elsewhere").mkdir()
    planted.symlink_to(tmp_path / "elsewhere")
    result = run_shim(tmp_path / "data", "--start-timeout", "0", stdin=lines(INITIALIZE))
    assert result.returncode == 1
    assert result.stdout == b""
    assert result.stderr.decode() == (
        f"convmem-shim: socket directory {planted} is not a directory owned by this user: "
        "remove it, or set XDG_RUNTIME_DIR to a private folder of yours\n"
    )


def test_shim_usage_error_is_one_line(tmp_path: Path) -> None:
    result = run_shim(tmp_path, "--bogus")
    assert result.returncode == 2
    assert result.stdout == b""
    assert result.stderr.count(b"\n") == 1


@pytest.mark.linux  # finds the started app through /proc
def test_shim_reports_an_app_that_cannot_start(tmp_path: Path) -> None:
    # The data dir is locked by another process that is no ConvMem app: the started app shows
    # BUSY (and stays to show it); the shim gives up after its start timeout with one line.
    data_dir = tmp_path / "held"
    holder = MemoryService.open(data_dir)
    try:
        result = run_shim(data_dir, "--start-timeout", "3")
    finally:
        holder.close()
    assert result.returncode == 1
    assert result.stdout == b""
    assert result.stderr.count(b"\n") == 1 and b"did not open its pipe" in result.stderr
    # The app it started shows the BUSY error; once the lock is free it can be retried. Here
    # we only make sure it goes away when asked.
    for pid in os.listdir("/proc"):
        if pid.isdigit() and _is_app_for(int(pid), data_dir):
            os.kill(int(pid), signal.SIGTERM)
            wait_gone(int(pid))


def test_a_crash_never_blocks_the_next_start(running_app: RunningApp, tmp_path: Path) -> None:
    data_dir = running_app.data_dir
    running_app.process.kill()  # no chance to clean up: the socket file stays behind
    running_app.process.wait(30)
    assert Path(endpoint(data_dir)).exists()
    errlog = (tmp_path / "after-crash.log").open("w")

    async def scenario() -> None:
        async with shim_client(data_dir, errlog) as client:  # starts a fresh app
            result = await call(client, "write_message", session_id="s", role="user", content="x")
            assert result["status"] == "OK"

    try:
        anyio.run(scenario)
        status = wait_listening(data_dir)
    finally:
        errlog.close()
        answer = control(data_dir, "quit")
    assert answer is not None
    wait_gone(int(status["pid"]))
