"""The shim's and autostart's Windows-only branches, with their logic run on every platform and
the OS calls behind small seams; the tests marked `windows` make the real calls (ci.yml's
Windows jobs): pipe names, frozen names, spawn flags and their fallback, the launch from a
packaged host, the msvcrt launch-lock protocol, binary stdio, the overlapped pipe client's
logic, the pipe owner check, and the Run entry's command line."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from convmem_app.shell import autostart
from convmem_app.shim import launcher as shim
from convmem_app.shim.paths import endpoint, pipe_user, windows_pipe_name, windows_pipe_path
from tests.shim.shim_helpers import AWKWARD_ARGUMENTS, split_windows_command_line

# ---- pipe names ------------------------------------------------------------------------------


def test_one_folder_has_one_pipe_name_however_it_is_spelled() -> None:
    name = windows_pipe_name(r"C:\Users\Ann\AppData\Local\ConvMem", "ann")
    assert name == windows_pipe_name("c:/users/ann/appdata/local/convmem", "ann")
    assert name == windows_pipe_name(r"C:\USERS\ANN\APPDATA\LOCAL\CONVMEM", "ann")
    assert name != windows_pipe_name(r"C:\Users\Ann\AppData\Local\ConvMem2", "ann")
    assert name != windows_pipe_name(r"C:\Users\Ann\AppData\Local\ConvMem", "bob")
    prefix, user, digest = name.split("-")
    assert (prefix, user) == ("convmem", "ann")
    assert len(digest) == 16 and int(digest, 16) >= 0
    assert windows_pipe_path(name) == rf"\\.\pipe\{name}"


def test_user_names_are_reduced_to_safe_characters() -> None:
    assert pipe_user("DOMAIN\\Zoë O'Brien") == "DOMAINZoëOBrien"
    assert pipe_user("x" * 40) == "x" * 32
    assert pipe_user("\\/:*?") == "user"
    assert "\\" not in windows_pipe_name("C:\\data", "CORP\\ann")


@pytest.mark.posix  # the Unix socket path
def test_elsewhere_the_endpoint_is_a_socket_in_a_private_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    path = Path(endpoint(tmp_path / "data"))
    assert path.parent == tmp_path / "convmem" and path.suffix == ".sock"
    assert (path.parent.stat().st_mode & 0o777) == 0o700


@pytest.mark.windows
def test_qt_listens_where_the_shim_connects(qapp: Any, tmp_path: Path) -> None:
    from PySide6.QtNetwork import QLocalServer

    name = endpoint(tmp_path)
    server = QLocalServer()
    server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
    try:
        assert server.listen(name), server.errorString()
        assert server.fullServerName().lower() == windows_pipe_path(name).lower()
    finally:
        server.close()


# ---- the frozen app's name ---------------------------------------------------------------------


def test_frozen_names(tmp_path: Path) -> None:
    assert shim.frozen_app_name(windows=True) == "ConvMem.exe"
    assert shim.frozen_app_name(windows=False) == "ConvMem"
    folder = tmp_path / "Programs" / "ConvMem"
    folder.mkdir(parents=True)
    for running in ("convmem-shim.exe", "convmem-cli.exe", "ConvMem.exe"):
        found = shim.frozen_app_executable(str(folder / running), windows=True)
        assert found == folder.resolve() / "ConvMem.exe"
    assert shim.frozen_app_name(sys.platform == "win32") == shim.FROZEN_APP_NAME


# ---- starting the app: flags, fallback, packaged hosts ----------------------------------------


class RecordingPopen:
    """Stands in for subprocess.Popen at the process-creation seam: records the flags asked
    for and refuses the ones a host's job object would refuse."""

    def __init__(self, refuse: set[int]) -> None:
        self.refuse = refuse
        self.calls: list[int] = []

    def __call__(self, command: list[str], creationflags: int, **options: Any) -> Any:
        self.calls.append(creationflags)
        if creationflags in self.refuse:
            raise PermissionError(5, "Access is denied")
        return "started"


def test_the_app_breaks_away_from_the_hosts_job_when_allowed() -> None:
    popen = RecordingPopen(refuse=set())
    assert shim.start_windows_process(["app"], {}, popen) == "started"
    assert popen.calls == [
        shim.DETACHED_PROCESS | shim.CREATE_NEW_PROCESS_GROUP | shim.CREATE_BREAKAWAY_FROM_JOB
    ]


def test_a_job_that_forbids_breaking_away_still_gets_the_app_started() -> None:
    flags = shim.windows_creation_flags()
    popen = RecordingPopen(refuse={flags[0]})
    assert shim.start_windows_process(["app"], {}, popen) == "started"
    assert popen.calls == flags
    assert flags[1] == shim.DETACHED_PROCESS | shim.CREATE_NEW_PROCESS_GROUP


def test_when_no_way_works_the_last_error_shows() -> None:
    popen = RecordingPopen(refuse=set(shim.windows_creation_flags()))
    with pytest.raises(PermissionError):
        shim.start_windows_process(["app"], {}, popen)


@pytest.mark.windows
def test_our_flag_numbers_are_windows_own() -> None:
    assert shim.DETACHED_PROCESS == subprocess.DETACHED_PROCESS  # type: ignore[attr-defined,unused-ignore]
    assert shim.CREATE_NEW_PROCESS_GROUP == subprocess.CREATE_NEW_PROCESS_GROUP  # type: ignore[attr-defined,unused-ignore]
    assert shim.CREATE_BREAKAWAY_FROM_JOB == subprocess.CREATE_BREAKAWAY_FROM_JOB  # type: ignore[attr-defined,unused-ignore]
    assert shim.CREATE_NO_WINDOW == subprocess.CREATE_NO_WINDOW  # type: ignore[attr-defined,unused-ignore]
    assert os.O_BINARY == shim.O_BINARY  # type: ignore[attr-defined,unused-ignore]


def test_from_a_packaged_host_the_app_starts_through_wmi() -> None:
    command = [r"C:\Program Files\ConvMem\ConvMem.exe", "--minimized", "--data-dir"]
    command.append(AWKWARD_ARGUMENTS[0])
    argv, env = shim.outside_package_invocation(command, r"C:\Users\Zoë", r"C:\Windows\system32")
    assert argv[0] == r"C:\Windows\system32\WindowsPowerShell\v1.0\powershell.exe"
    assert argv[1:4] == ["-NoProfile", "-NonInteractive", "-Command"]
    assert argv[4] == shim.WMI_LAUNCH_SCRIPT
    assert "Win32_Process" in argv[4] and "ConvMem" not in argv[4]  # no data in the script
    assert split_windows_command_line(env["CONVMEM_LAUNCH_COMMAND"]) == command
    assert env["CONVMEM_LAUNCH_CWD"] == r"C:\Users\Zoë"
    _argv, no_cwd = shim.outside_package_invocation(command, None, r"C:\Windows\system32")
    assert "CONVMEM_LAUNCH_CWD" not in no_cwd


def test_the_wmi_launch_result() -> None:
    assert shim.parse_wmi_launch(0, "pid 4242") == 4242
    with pytest.raises(shim.ShimError) as refused:
        shim.parse_wmi_launch(3, "error 9")
    message = str(refused.value)
    assert "Win32_Process.Create returned 9" in message
    assert "Start ConvMem from the Start menu first" in message
    for status, output in ((1, ""), (0, "pid"), (0, "nonsense here"), (0, "pid -1")):
        with pytest.raises(shim.ShimError, match="packaged \\(MSIX\\) app"):
            shim.parse_wmi_launch(status, output)
    assert "Start ConvMem from the Start menu" in shim.parse_wmi_launch_failure("Claude_1_x64__p")


def test_a_process_started_by_wmi_is_polled_through_its_handle() -> None:
    states: dict[int, int | None] = {7: None}
    process = shim._ProcessById(7, states.__getitem__)
    assert process.poll() is None
    states[7] = 3
    assert process.poll() == 3
    assert shim._ProcessById(None, states.__getitem__).poll() is None  # could not open: wait


@pytest.mark.windows
def test_the_windows_calls_the_launch_makes() -> None:
    from convmem_app.shim import winapi

    assert winapi.current_package_full_name() is None  # the CI runner's Python: not packaged
    system = winapi.system_directory()
    assert Path(system, "WindowsPowerShell", "v1.0", "powershell.exe").is_file()
    ours = winapi.open_process(os.getpid())
    assert ours is not None and winapi.exit_code(ours) is None
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(7)"], stdin=subprocess.PIPE
    )
    handle = winapi.open_process(child.pid)
    assert handle is not None and winapi.exit_code(handle) is None
    child.communicate(b"")
    assert winapi.exit_code(handle) == 7  # still readable after the process ended
    assert winapi.process_user_sid().startswith("S-1-5-")
    assert winapi.process_user_sid(os.getpid()) == winapi.process_user_sid()


@pytest.mark.windows
def test_wmi_starts_a_process_outside_our_tree(tmp_path: Path) -> None:
    from convmem_app.shim import winapi

    marker = tmp_path / "started.txt"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ok')"]
    argv, env = shim.outside_package_invocation(command, str(tmp_path), winapi.system_directory())
    done = subprocess.run(
        argv, env=dict(os.environ, **env), capture_output=True, text=True, timeout=120
    )
    pid = shim.parse_wmi_launch(done.returncode, done.stdout)
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.read_text() == "ok"
    assert pid != os.getpid()


# ---- the launch lock ----------------------------------------------------------------------------


class EmulatedMsvcrt:
    """msvcrt.locking's contract on a POSIX file: lock or unlock `n` bytes from the current
    position, LK_NBLCK failing at once when another process holds them. Real byte-range locks
    (fcntl.lockf), so another process really contends; every call is recorded with the
    position it was made at."""

    LK_UNLCK, LK_NBLCK = 0, 2

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def locking(self, fd: int, mode: int, nbytes: int) -> None:
        import fcntl

        position = os.lseek(fd, 0, os.SEEK_CUR)
        self.calls.append(("lock" if mode == self.LK_NBLCK else "unlock", position, nbytes))
        if mode == self.LK_NBLCK:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, nbytes, 0, os.SEEK_CUR)
        else:
            fcntl.lockf(fd, fcntl.LOCK_UN, nbytes, 0, os.SEEK_CUR)


def test_the_lock_file_lives_in_temp_on_windows(tmp_path: Path) -> None:
    name = windows_pipe_name("C:\\data", "ann")
    path = shim.launch_lock_path(name, windows=True, temp_dir=r"C:\Users\ann\AppData\Local\Temp")
    assert path == rf"C:\Users\ann\AppData\Local\Temp\{name}.launch"
    assert shim.launch_lock_path("/run/x/abc.sock", windows=False) == "/run/x/abc.sock.launch"


@pytest.mark.posix  # emulates msvcrt with POSIX locks (fcntl)
def test_the_msvcrt_lock_protocol(tmp_path: Path) -> None:
    msvcrt = EmulatedMsvcrt()
    locker = shim.MsvcrtLocker(msvcrt)
    path = str(tmp_path / "pipe.launch")
    with shim.launch_lock("pipe", time.monotonic() + 5, locker, path):
        other = os.open(path, os.O_RDWR)  # another handle: ours stays at offset 0
        os.write(other, b"moved")
        os.close(other)
    # One byte at offset 0, and unlocked (at offset 0) before the handle closed.
    assert msvcrt.calls == [("lock", 0, 1), ("unlock", 0, 1)]


@pytest.mark.posix  # emulates msvcrt with POSIX locks (fcntl)
def test_a_held_launch_lock_makes_others_wait_then_give_up(tmp_path: Path) -> None:
    path = str(tmp_path / "pipe.launch")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({path!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.lockf(fd, fcntl.LOCK_EX, 1, 0, os.SEEK_SET)\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline() == "held\n"
        msvcrt = EmulatedMsvcrt()
        with (
            pytest.raises(shim.ShimError, match="kept starting the app"),
            shim.launch_lock("pipe", time.monotonic() + 0.3, shim.MsvcrtLocker(msvcrt), path),
        ):
            pass
        tries = [call for call in msvcrt.calls if call[0] == "lock"]
        assert len(tries) > 1 and set(tries) == {("lock", 0, 1)}  # retried, same byte
        holder.stdin.close()
        holder.wait(30)
        with shim.launch_lock("pipe", time.monotonic() + 5, shim.MsvcrtLocker(msvcrt), path):
            pass
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


@pytest.mark.windows
def test_the_real_msvcrt_lock_excludes_a_second_holder(tmp_path: Path) -> None:
    path = str(tmp_path / "pipe.launch")
    with (
        shim.launch_lock("pipe", time.monotonic() + 5, path=path),
        pytest.raises(shim.ShimError),
        shim.launch_lock("pipe", time.monotonic() + 0.3, path=path),
    ):
        pass
    with shim.launch_lock("pipe", time.monotonic() + 5, path=path):
        pass


# ---- binary stdio --------------------------------------------------------------------------------


def test_stdio_is_switched_to_binary() -> None:
    calls: list[tuple[int, int]] = []
    shim.binary_stdio(lambda fd, mode: calls.append((fd, mode)))
    assert calls == [(0, shim.O_BINARY), (1, shim.O_BINARY)]


@pytest.mark.windows
def test_protocol_bytes_pass_unchanged_through_windows_stdio() -> None:
    code = (
        "import msvcrt, os, sys\n"
        "from convmem_app.shim.launcher import binary_stdio\n"
        "binary_stdio(msvcrt.setmode)\n"
        "data = os.read(0, 100)\n"
        "os.write(1, data)\n"
    )
    payload = b'{"a":"\\r\\n"}\r\n\x1a\n'
    done = subprocess.run([sys.executable, "-c", code], input=payload, capture_output=True)
    assert done.stdout == payload


# ---- the overlapped pipe client's logic, on a Unix socket ------------------------------------


@pytest.fixture
def echo_server(short_tmp: Path) -> Iterator[str]:
    """A real Unix socket server that echoes every byte back (in a short folder: macOS's
    tmp_path is too long for a socket path)."""
    path = str(short_tmp / "echo.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen()
    stop = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            while not stop.is_set():
                data = conn.recv(65536)
                if not data or data == b"bye\n":
                    return
                conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path
    stop.set()
    server.close()
    thread.join(5)


def _open_unix(loop: Any, factory: Any, path: str) -> Any:
    return loop.create_unix_connection(factory, path)


@pytest.mark.posix  # a Unix socket and a selector loop stand in for the pipe
def test_the_loop_client_carries_large_data_both_ways(echo_server: str) -> None:
    conn = shim._LoopConnection(echo_server, 5.0, asyncio.SelectorEventLoop, _open_unix)
    try:
        blob = os.urandom(4 * 1024 * 1024)  # far past the transport's high-water mark
        sender = threading.Thread(target=conn.send, args=(blob,))
        sender.start()
        received = bytearray()
        while len(received) < len(blob):
            received += conn.recv()
        sender.join(30)
        assert bytes(received) == blob
        conn.send(b"bye\n")
        assert conn.recv() == b""  # the server closed: end of stream
    finally:
        conn.close()


def test_the_loop_client_reports_nobody_listening(tmp_path: Path) -> None:
    with pytest.raises(shim.NotListening):
        shim._LoopConnection(
            str(tmp_path / "none.sock"), 5.0, asyncio.SelectorEventLoop, _open_unix
        )


@pytest.mark.posix  # a Unix socket and a selector loop stand in for the pipe
def test_the_loop_client_closes_when_verification_refuses(echo_server: str) -> None:
    seen: list[Any] = []

    def refuse(transport: Any) -> None:
        seen.append(transport)
        raise shim.refuse_foreign_owner("the pipe X", "process 9 of user S-1-5-21-9")

    with pytest.raises(shim.ShimError, match="belongs to process 9 of user S-1-5-21-9"):
        shim._LoopConnection(echo_server, 5.0, asyncio.SelectorEventLoop, _open_unix, refuse)
    assert seen and seen[0].is_closing()


@pytest.mark.windows
def test_the_overlapped_client_on_a_real_pipe(tmp_path: Path) -> None:
    """A named-pipe server (asyncio's Proactor) of our own, the shim's client, a round trip,
    and the owner check through GetNamedPipeServerProcessId and the token SIDs."""
    name = endpoint(tmp_path)
    path = windows_pipe_path(name)
    loop = asyncio.ProactorEventLoop()  # type: ignore[attr-defined,unused-ignore]

    class Echo(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.transport.write(data)

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servers = asyncio.run_coroutine_threadsafe(
        loop.start_serving_pipe(Echo, path),  # type: ignore[attr-defined]
        loop,
    ).result(10)
    try:
        conn = shim.connect(name)
        try:
            conn.send(b'{"x":1}\n')
            assert conn.recv() == b'{"x":1}\n'
        finally:
            conn.close()
    finally:
        for server in servers:
            loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


# ---- the pipe owner check ------------------------------------------------------------------


def test_a_pipe_served_by_our_user_passes() -> None:
    sids = {None: "S-1-5-21-1-1001", 4242: "S-1-5-21-1-1001"}
    shim.check_pipe_server(r"\\.\pipe\convmem-ann-x", 4242, sids.__getitem__)


def test_a_pipe_served_by_another_user_is_refused() -> None:
    sids = {None: "S-1-5-21-1-1001", 4242: "S-1-5-21-1-1002"}
    with pytest.raises(shim.ShimError) as refused:
        shim.check_pipe_server(r"\\.\pipe\convmem-ann-x", 4242, sids.__getitem__)
    message = str(refused.value)
    assert "process 4242 of user S-1-5-21-1-1002" in message
    assert "not to you" in message and "another --data-dir" in message


def test_a_pipe_server_we_may_not_inspect_is_refused() -> None:
    def sid_of(pid: int | None) -> str:
        if pid is None:
            return "S-1-5-21-1-1001"
        raise PermissionError(5, "Access is denied")

    with pytest.raises(shim.ShimError, match="which we may not inspect"):
        shim.check_pipe_server(r"\\.\pipe\convmem-ann-x", 4242, sid_of)


# ---- "Start at login" on Windows: the Run entry ----------------------------------------------


class MemoryRunKey:
    """The HKCU Run key at the registry seam: name -> value."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def set(self, name: str, value: str) -> None:
        self.values[name] = value

    def delete(self, name: str) -> None:
        self.values.pop(name, None)


@pytest.mark.parametrize("data_dir", AWKWARD_ARGUMENTS[:-2])
def test_the_run_entry_starts_exactly_our_command(
    data_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "Program Files" / "ConvMem"
    folder.mkdir(parents=True)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", str(folder / "convmem-cli"))
    run_key = MemoryRunKey()
    autostart.enable(Path(data_dir), run_key)
    value = run_key.values[autostart.ENTRY_NAME]
    assert split_windows_command_line(value) == shim.app_command(Path(data_dir))
    autostart.disable(run_key)
    assert run_key.values == {}
    autostart.disable(run_key)  # absent: no error


def test_the_run_value_quotes_for_windows() -> None:
    for argument in AWKWARD_ARGUMENTS:
        command = [r"C:\Program Files\ConvMem\ConvMem.exe", "--data-dir", argument]
        assert split_windows_command_line(autostart.run_value(command)) == command


@pytest.mark.windows
def test_our_splitter_agrees_with_windows() -> None:
    import ctypes

    shell32 = ctypes.WinDLL("shell32")  # type: ignore[attr-defined,unused-ignore]
    shell32.CommandLineToArgvW.restype = ctypes.POINTER(ctypes.c_wchar_p)
    for argument in AWKWARD_ARGUMENTS:
        line = autostart.run_value([r"C:\Program Files\ConvMem\ConvMem.exe", "-x", argument])
        count = ctypes.c_int()
        argv = shell32.CommandLineToArgvW(line, ctypes.byref(count))
        real = [argv[i] for i in range(count.value)]
        ctypes.windll.kernel32.LocalFree(argv)  # type: ignore[attr-defined,unused-ignore]
        assert split_windows_command_line(line) == real


@pytest.mark.windows
def test_the_real_run_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import winreg

    monkeypatch.setattr(autostart, "ENTRY_NAME", f"ConvMemTest{os.getpid()}")
    autostart.enable(tmp_path / "data dir")
    try:
        with winreg.OpenKey(winreg.HKEY_CURRENT_USER, autostart.RUN_KEY) as key:  # type: ignore[attr-defined,unused-ignore]
            value, kind = winreg.QueryValueEx(key, autostart.ENTRY_NAME)  # type: ignore[attr-defined,unused-ignore]
        assert kind == winreg.REG_SZ  # type: ignore[attr-defined,unused-ignore]
        assert split_windows_command_line(value) == shim.app_command(tmp_path / "data dir")
    finally:
        autostart.disable()
    with (
        pytest.raises(FileNotFoundError),
        winreg.OpenKey(winreg.HKEY_CURRENT_USER, autostart.RUN_KEY) as key,  # type: ignore[attr-defined,unused-ignore]
    ):
        winreg.QueryValueEx(key, autostart.ENTRY_NAME)  # type: ignore[attr-defined,unused-ignore]
