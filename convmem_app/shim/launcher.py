"""`convmem-shim`: the command LLM hosts run. Bridges its stdio to the ConvMem app's local pipe.

Standard library only (no Qt, no `mcp`, no engine): it must start in a few milliseconds.

- Data dir: `--data-dir`, else `CONVMEM_DATA_DIR`, else the platform default; the pipe name
  comes from `convmem_app.shim.paths.endpoint` (a Unix socket in a private 0700 directory, or a
  Windows named pipe).
- The endpoint must be served by a process of our own user (Linux/macOS: the socket's peer
  credentials, the socket's and its private directory's owner; Windows: the user SID of the
  pipe's server process): another user could create a pipe of the same, predictable name
  first. Anything else is refused with a clear message.
- Nobody listening: start the app detached (`convmem app --minimized --data-dir D`) and wait
  for its pipe, at most `--start-timeout` seconds (default 15, env
  `CONVMEM_SHIM_START_TIMEOUT`; 0 = never start the app). Shims starting at the same moment
  take a launch lock so only one of them starts an app. Started by an MSIX-packaged host
  (Claude Desktop's current Windows installer), whose children write new AppData entries into
  the host's private copy, the app is started outside the package (through WMI), or the user
  is told to start ConvMem first.
- Bytes pass both ways unchanged, one thread per direction. The shim only looks at the line
  structure to know which requests are still unanswered.
- Host closes stdin: the socket is NOT half-closed (the app's QLocalSocket would take that for
  a disconnect and drop the answers). The shim keeps forwarding until every request it passed
  on has been answered (or `--drain-timeout`, default 5 s, env
  `CONVMEM_SHIM_DRAIN_TIMEOUT`), then closes the connection and exits 0. So
  `printf '<requests>' | convmem-shim` gets all its answers.
- The app closes the connection: stdout is closed so the host sees end of stream, one line on
  stderr, exit 1. Every problem is one line on stderr and a non-zero exit; stdout carries
  protocol bytes only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, NoReturn, Protocol

from convmem_app.shim.paths import endpoint, resolve_data_dir, windows_pipe_path

START_TIMEOUT_DEFAULT = 15.0
DRAIN_TIMEOUT_DEFAULT = 5.0
CHUNK = 65536
IS_WINDOWS = sys.platform == "win32"


def frozen_app_name(windows: bool = IS_WINDOWS) -> str:
    """The bundled tray app (installer/convmem.spec). Not `convmem.exe`: Windows names are
    case-insensitive and the console command line is `convmem-cli.exe`."""
    return "ConvMem.exe" if windows else "ConvMem"


FROZEN_APP_NAME = frozen_app_name()

_RESPONSE_HEAD = re.compile(
    rb'\{"jsonrpc":"2\.0","id":("(?:[^"\\]|\\.)*"|-?(?:0|[1-9]\d*)),"(result|error|method)"'
)
"""The head of a line as the SDKs write one (compact, `jsonrpc` then `id`): the id's JSON text,
then what the line is. A request has `method`; an answer, `result` or `error`."""


class ShimError(Exception):
    """A problem the user must see: one line on stderr, non-zero exit."""


class NotListening(Exception):
    """No app listens on the endpoint (yet)."""


class Connection(Protocol):
    def send(self, data: bytes) -> None: ...
    def recv(self) -> bytes: ...  # b"" at end of stream
    def close(self) -> None: ...


# ---- connecting -----------------------------------------------------------------------------


def refuse_foreign_owner(endpoint_name: str, owner: str) -> ShimError:
    """The error for an endpoint served or owned by someone else (never connect to it)."""
    return ShimError(
        f"refusing {endpoint_name}: it belongs to {owner}, not to you. Another user may be "
        "pretending to be ConvMem; quit that program or use another --data-dir"
    )


def peer_uid(sock: Any) -> int | None:
    """The user id of the process at the other end of a connected Unix socket (Linux:
    SO_PEERCRED; macOS: LOCAL_PEERCRED); None where the system does not tell."""
    import socket

    if hasattr(socket, "SO_PEERCRED"):
        data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", data)
        return int(uid)
    if sys.platform == "darwin":
        sol_local, local_peercred = 0, 0x001  # <sys/un.h>
        data = sock.getsockopt(sol_local, local_peercred, 76)  # struct xucred
        return int(struct.unpack_from("=I", data, 4)[0])  # cr_version, then cr_uid
    return None


def check_socket_file(path: str, uid: int) -> None:
    """The socket must be a socket owned by `uid`, in a directory owned by `uid` that no one
    else may enter (0700: nobody else can have planted the socket)."""
    folder = os.path.dirname(path)
    try:
        folder_info = os.lstat(folder)
        info = os.lstat(path)
    except FileNotFoundError:
        raise NotListening from None
    if folder_info.st_uid != uid:
        raise refuse_foreign_owner(f"the socket directory {folder}", f"uid {folder_info.st_uid}")
    if stat.S_IMODE(folder_info.st_mode) & 0o077:
        raise ShimError(
            f"refusing the socket directory {folder}: other users may write to it "
            f"(mode {stat.S_IMODE(folder_info.st_mode):o}, must be 700)"
        )
    if not stat.S_ISSOCK(info.st_mode):
        raise ShimError(f"refusing {path}: it is not a socket")
    if info.st_uid != uid:
        raise refuse_foreign_owner(f"the socket {path}", f"uid {info.st_uid}")


class _UnixConnection:
    def __init__(self, path: str, uid: int | None = None) -> None:
        import socket

        uid = os.getuid() if uid is None else uid
        check_socket_file(path, uid)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise NotListening from exc
        except OSError as exc:
            sock.close()
            raise ShimError(f"cannot connect to the app's socket {path}: {exc.strerror}") from exc
        try:
            served_by = peer_uid(sock)
        except OSError:
            served_by = None
        if served_by is not None and served_by != uid:
            sock.close()
            raise refuse_foreign_owner(f"the socket {path}", f"a process of uid {served_by}")
        self._sock = sock

    def send(self, data: bytes) -> None:
        self._sock.sendall(data)

    def recv(self) -> bytes:
        return self._sock.recv(CHUNK)

    def close(self) -> None:
        self._sock.close()


OpenConnection = Callable[[Any, Callable[[], Any], str], Any]


class _LoopConnection:
    """A stream client on a private asyncio loop, with a blocking face (send/recv/close).

    On Windows: a Proactor loop and an overlapped named-pipe client (a plain
    `open(r"\\\\.\\pipe\\X", "r+b")` handle is synchronous: a thread blocked reading it would
    block the other thread's write). The loop and the opener are parameters, so the same code
    runs in tests anywhere (a selector loop and a Unix socket)."""

    def __init__(
        self,
        path: str,
        timeout: float,
        loop_factory: Callable[[], Any],
        open_connection: OpenConnection,
        verify: Callable[[Any], None] | None = None,
    ) -> None:
        import asyncio
        import queue

        self._asyncio = asyncio
        self._incoming: queue.Queue[bytes] = queue.Queue()
        self._loop = loop_factory()
        self._can_write = asyncio.Event()
        self._lost = threading.Event()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._connect(path, open_connection), self._loop)
        try:
            self._transport = future.result(timeout)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            self._stop_loop()
            raise NotListening from exc
        except TimeoutError as exc:
            future.cancel()
            self._stop_loop()
            raise ShimError(f"the app's pipe {path} stayed busy for {timeout:g} s") from exc
        except OSError as exc:
            self._stop_loop()
            raise ShimError(f"cannot connect to the app's pipe {path}: {exc}") from exc
        if verify is not None:
            try:
                verify(self._transport)
            except BaseException:
                self.close()
                raise

    async def _connect(self, path: str, open_connection: OpenConnection) -> Any:
        import asyncio

        shim = self

        class _Protocol(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:
                shim._can_write.set()

            def data_received(self, data: bytes) -> None:
                shim._incoming.put(data)

            def connection_lost(self, exc: Exception | None) -> None:
                shim._incoming.put(b"")
                shim._can_write.set()
                shim._lost.set()

            def pause_writing(self) -> None:
                shim._can_write.clear()

            def resume_writing(self) -> None:
                shim._can_write.set()

        transport, _protocol = await open_connection(
            self._asyncio.get_running_loop(), _Protocol, path
        )
        return transport

    async def _write(self, data: bytes) -> None:
        await self._can_write.wait()
        if self._transport.is_closing():
            raise BrokenPipeError("the app's pipe is closed")
        self._transport.write(data)

    def send(self, data: bytes) -> None:
        self._asyncio.run_coroutine_threadsafe(self._write(data), self._loop).result()

    def recv(self) -> bytes:
        return self._incoming.get()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._transport.close)
        self._lost.wait(2.0)  # the transport closes its handle on a later loop iteration
        self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(2.0)
        if not self._thread.is_alive():
            self._loop.close()


def check_pipe_server(
    path: str,
    server_pid: int,
    sid_of: Callable[[int | None], str],
) -> None:
    """The named pipe's server process must run as our user: compare the user SIDs of its token
    and ours (`sid_of(None)`). A process we may not even query is someone else's."""
    try:
        theirs = sid_of(server_pid)
    except OSError as exc:
        raise refuse_foreign_owner(
            f"the pipe {path}", f"process {server_pid}, which we may not inspect ({exc})"
        ) from None
    ours = sid_of(None)
    if theirs != ours:
        raise refuse_foreign_owner(f"the pipe {path}", f"process {server_pid} of user {theirs}")


def _verify_windows_pipe(path: str) -> Callable[[Any], None]:
    def verify(transport: Any) -> None:
        from convmem_app.shim import winapi

        handle = transport.get_extra_info("pipe").handle
        check_pipe_server(path, winapi.pipe_server_pid(handle), winapi.process_user_sid)

    return verify


def _open_pipe(loop: Any, factory: Callable[[], Any], path: str) -> Any:
    return loop.create_pipe_connection(factory, path)


def connect(name: str, timeout: float = 5.0) -> Connection:
    """Connect to the app's endpoint; NotListening when no app is there."""
    if IS_WINDOWS:
        import asyncio

        path = windows_pipe_path(name)
        return _LoopConnection(
            path,
            timeout,
            asyncio.ProactorEventLoop,  # type: ignore[attr-defined,unused-ignore]
            _open_pipe,
            _verify_windows_pipe(path),
        )
    return _UnixConnection(name)


# ---- starting the app -----------------------------------------------------------------------


def frozen_app_executable(executable: str | None = None, windows: bool = IS_WINDOWS) -> Path:
    """In a bundled build (installer/convmem.spec) the windowed tray app, `ConvMem[.exe]`,
    sits in the same folder as every other ConvMem executable."""
    running = Path(executable or sys.executable).resolve()
    return running.parent / frozen_app_name(windows)


def app_command(data_dir: Path) -> list[str]:
    """The command that starts the tray app for `data_dir`, minimised."""
    tail = ["--minimized", "--data-dir", str(data_dir)]
    if getattr(sys, "frozen", False):
        return [str(frozen_app_executable()), *tail]
    return [sys.executable, "-m", "convmem_app", "app", *tail]


# Windows process creation flags (winbase.h); numbers, so the logic is testable anywhere.
DETACHED_PROCESS = 0x00000008  # no console: the app is windowed, the shim's console is the host's
CREATE_NEW_PROCESS_GROUP = 0x00000200  # the host's Ctrl+C does not reach the app
CREATE_BREAKAWAY_FROM_JOB = 0x01000000  # outlive a host that kills its job's processes
CREATE_NO_WINDOW = 0x08000000


def windows_creation_flags() -> list[int]:
    """The flag sets to try in order: break away from the host's job object when the job allows
    it, else stay in it (the app then ends with the host, but it starts)."""
    base = DETACHED_PROCESS | CREATE_NEW_PROCESS_GROUP
    return [base | CREATE_BREAKAWAY_FROM_JOB, base]


class Process(Protocol):
    def poll(self) -> int | None: ...


def start_windows_process(
    command: list[str], options: dict[str, Any], popen: Callable[..., Any]
) -> Process:
    """Start `command` detached; when the host's job forbids breaking away (access denied),
    start it again without asking to."""
    attempts = windows_creation_flags()
    for index, flags in enumerate(attempts):
        try:
            process: Process = popen(command, creationflags=flags, **options)
            return process
        except OSError:
            if index == len(attempts) - 1:
                raise
    raise AssertionError("unreachable")


# Started by a packaged (MSIX) host, we start the app through WMI: Win32_Process.Create runs it
# from the WMI service, outside the host's package (its AppData redirection), job and console.
# The command line travels in the environment, never inside the script text.
WMI_LAUNCH_SCRIPT = (
    "$ErrorActionPreference = 'Stop'; "
    "$a = @{ CommandLine = $env:CONVMEM_LAUNCH_COMMAND }; "
    "if ($env:CONVMEM_LAUNCH_CWD) { $a.CurrentDirectory = $env:CONVMEM_LAUNCH_CWD }; "
    "$r = Invoke-CimMethod -ClassName Win32_Process -MethodName Create -Arguments $a; "
    "if ($r.ReturnValue -ne 0) { [Console]::Out.Write('error ' + $r.ReturnValue); exit 3 }; "
    "[Console]::Out.Write('pid ' + $r.ProcessId)"
)


def outside_package_invocation(
    command: list[str], cwd: str | None, system_dir: str
) -> tuple[list[str], dict[str, str]]:
    """The PowerShell command (by absolute path: a packaged host may hand its children an empty
    WINDIR and a PATHEXT of `.CPL`) and the environment variables that start `command` through
    WMI."""
    import ntpath
    import subprocess

    powershell = ntpath.join(system_dir, "WindowsPowerShell", "v1.0", "powershell.exe")
    argv = [powershell, "-NoProfile", "-NonInteractive", "-Command", WMI_LAUNCH_SCRIPT]
    env = {"CONVMEM_LAUNCH_COMMAND": subprocess.list2cmdline(command)}
    if cwd:
        env["CONVMEM_LAUNCH_CWD"] = cwd
    return argv, env


def parse_wmi_launch(returncode: int, stdout: str) -> int:
    """The new process id from the launch script's output, or a ShimError."""
    words = stdout.strip().split()
    if returncode == 0 and len(words) == 2 and words[0] == "pid" and words[1].isdigit():
        return int(words[1])
    detail = f"Win32_Process.Create returned {words[1]}" if words[:1] == ["error"] else ""
    raise ShimError(
        "this host runs as a packaged (MSIX) app, and starting ConvMem outside its package "
        f"failed{' (' + detail + ')' if detail else ''}. Start ConvMem from the Start menu "
        "first (or turn on its Start at login), then restart the host's MCP server"
    )


class _ProcessById:
    """A process we did not start ourselves (WMI did): polled through a handle opened on its id
    at once, so that its exit status stays readable after it ends (None: unknown, keep
    waiting until the start timeout)."""

    def __init__(self, handle: int | None, exit_code: Callable[[int], int | None]) -> None:
        self._handle = handle
        self._exit_code = exit_code

    def poll(self) -> int | None:
        return None if self._handle is None else self._exit_code(self._handle)


def packaged_host_message(package: str) -> str:
    return (
        f"started by a packaged (MSIX) host ({package}): its programs write new AppData "
        "folders into the host's private copy"
    )


def spawn_app(data_dir: Path) -> Process:
    """Start the app detached from us: own session / no console, stdio to the null device;
    outside the host's package when the host is a packaged Windows app."""
    import subprocess

    command = app_command(data_dir)
    env = dict(os.environ)
    if not getattr(sys, "frozen", False):
        # The app runs from the home folder (it must not keep the host's working folder busy),
        # so make sure it finds this very package however we were started.
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    options: dict[str, Any] = {
        "stdin": subprocess.DEVNULL,
        "stdout": subprocess.DEVNULL,
        "stderr": subprocess.DEVNULL,
        "close_fds": True,
        "cwd": _home(),
        "env": env,
    }
    try:
        if IS_WINDOWS:
            from convmem_app.shim import winapi

            package = winapi.current_package_full_name()
            if package is not None:
                return _spawn_outside_package(command, options, package)
            return start_windows_process(command, options, subprocess.Popen)
        return subprocess.Popen(command, start_new_session=True, **options)
    except OSError as exc:
        raise ShimError(f"cannot start the ConvMem app ({command[0]}): {exc.strerror}") from exc


def _spawn_outside_package(command: list[str], options: dict[str, Any], package: str) -> Process:
    import subprocess

    from convmem_app.shim import winapi

    argv, extra = outside_package_invocation(command, options["cwd"], winapi.system_directory())
    try:
        done = subprocess.run(
            argv,
            env=dict(options["env"], **extra),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            creationflags=CREATE_NO_WINDOW,
        )
    except (OSError, subprocess.TimeoutExpired):
        raise ShimError(parse_wmi_launch_failure(package)) from None
    try:
        pid = parse_wmi_launch(done.returncode, done.stdout)
    except ShimError as exc:
        raise ShimError(f"{packaged_host_message(package)}; {exc}") from None
    return _ProcessById(winapi.open_process(pid), winapi.exit_code)


def parse_wmi_launch_failure(package: str) -> str:
    try:
        parse_wmi_launch(1, "")
    except ShimError as exc:
        return f"{packaged_host_message(package)}; {exc}"
    raise AssertionError("unreachable")


def _home() -> str | None:
    try:
        return str(Path.home())
    except (RuntimeError, KeyError):
        return None


class Locker(Protocol):
    """One exclusive, non-blocking lock on an open file (OSError when someone else holds it)."""

    def try_lock(self, fd: int) -> None: ...
    def unlock(self, fd: int) -> None: ...


class FlockLocker:
    """Linux/macOS: flock(2); closing the descriptor releases it."""

    def try_lock(self, fd: int) -> None:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def unlock(self, fd: int) -> None:
        pass


class MsvcrtLocker:
    """Windows: a byte-range lock on the file's first byte (`msvcrt.locking` locks from the
    current position), released explicitly before the handle closes (Windows wants that)."""

    def __init__(self, msvcrt: Any) -> None:
        self._msvcrt = msvcrt

    def try_lock(self, fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        self._msvcrt.locking(fd, self._msvcrt.LK_NBLCK, 1)

    def unlock(self, fd: int) -> None:
        with suppress(OSError):
            os.lseek(fd, 0, os.SEEK_SET)
            self._msvcrt.locking(fd, self._msvcrt.LK_UNLCK, 1)


def launch_lock_path(name: str, windows: bool = IS_WINDOWS, temp_dir: str | None = None) -> str:
    """Next to the socket (in the private socket directory); on Windows, where the endpoint is
    a pipe name, in the user's temporary folder."""
    if windows:
        import ntpath
        import tempfile

        return ntpath.join(temp_dir or tempfile.gettempdir(), f"{name}.launch")
    return f"{name}.launch"


def _default_locker() -> Locker:
    if IS_WINDOWS:
        import msvcrt

        return MsvcrtLocker(msvcrt)
    return FlockLocker()


@contextmanager
def launch_lock(
    name: str, deadline: float, locker: Locker | None = None, path: str | None = None
) -> Iterator[None]:
    """Serialise app launches for one endpoint across shims (bounded by `deadline`)."""
    locker = locker or _default_locker()
    fd = os.open(path or launch_lock_path(name), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                locker.try_lock(fd)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    raise ShimError(
                        "another convmem-shim kept starting the app for too long"
                    ) from None
                time.sleep(0.02)
        try:
            yield
        finally:
            locker.unlock(fd)
    finally:
        os.close(fd)  # closing the descriptor releases a lock still held


def connect_or_start(name: str, data_dir: Path, start_timeout: float) -> Connection:
    try:
        return connect(name)
    except NotListening:
        pass
    if start_timeout <= 0:
        raise ShimError(f"no ConvMem app is running for data dir {data_dir}")
    deadline = time.monotonic() + start_timeout
    with launch_lock(name, deadline):
        try:
            return connect(name)  # another shim started it while we waited for the lock
        except NotListening:
            pass
        process = spawn_app(data_dir)
        delay = 0.01
        while True:
            try:
                return connect(name)
            except NotListening:
                pass
            status = process.poll()
            if status not in (None, 0):  # 0: it handed over to a running app; keep trying
                raise ShimError(
                    f"the ConvMem app exited with status {status} before it was ready; "
                    f"run `convmem app --data-dir {data_dir}` to see why"
                )
            if time.monotonic() >= deadline:
                raise ShimError(
                    f"the ConvMem app did not open its pipe within {start_timeout:g} s "
                    "(it may be showing an error: data dir in use or damaged)"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


# ---- pumping --------------------------------------------------------------------------------


Key = bytes
"""An id as the shim compares ids: its JSON text, canonical (`json.dumps(id, ensure_ascii=False)`
in UTF-8), so `"\\u00e9"` and `"é"`, or `-0` and `0`, are one id, as they are to the app."""


def _canonical_id(value: object) -> Key:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _head_id(raw: bytes) -> Key:
    """The key of an id's JSON text as `_RESPONSE_HEAD` found it. Most ids (an integer, a
    string without escapes) already are their canonical text: no parsing."""
    if raw[:1] == b'"':
        if b"\\" not in raw:
            return raw
    elif raw != b"-0":
        return raw
    return _canonical_id(json.loads(raw))


class _Lines:
    """One direction's byte stream, cut into lines; the ids each chunk's lines carry."""

    def __init__(self, requests: bool) -> None:
        self._requests = requests
        self._partial = bytearray()

    def ids(self, data: bytes) -> list[Key]:
        """The ids of the requests (or of the answers) on the lines `data` completes.

        Lines are found in place (no copy of a whole 1 MiB request); a line that starts as the
        SDKs write it (`{"jsonrpc":"2.0","id":...,"method"` / `"result"` / `"error"`) is read
        from its head alone, anything else is parsed whole."""
        buffer = self._partial
        if buffer:
            buffer += data
            if b"\n" not in data:
                return []
            text = bytes(buffer)
        else:
            if data[-1:] == b"\n" and data.find(b"\n") == len(data) - 1:
                return self._one_line(data)  # the usual chunk: one whole line
            text = data
        requests = self._requests
        ids: list[Key] = []
        start = 0
        while (end := text.find(b"\n", start)) >= 0:
            head = _RESPONSE_HEAD.match(text, start, min(end, start + 256))
            if head is not None:
                if (head.group(2) == b"method") == requests:
                    ids.append(_head_id(head.group(1)))
            else:
                ids.extend(self._parsed_ids(text[start:end]))
            start = end + 1
        buffer[:] = text[start:]
        return ids

    def _one_line(self, line: bytes) -> list[Key]:
        head = _RESPONSE_HEAD.match(line, 0, 256)
        if head is None:
            return self._parsed_ids(line)
        if (head.group(2) == b"method") == self._requests:
            return [_head_id(head.group(1))]
        return []

    def _parsed_ids(self, line: bytes) -> list[Key]:
        try:
            message = json.loads(line)
        except ValueError:
            return []
        ids = []
        for item in message if isinstance(message, list) else [message]:
            if isinstance(item, dict) and "id" in item and ("method" in item) == self._requests:
                ids.append(_canonical_id(item["id"]))
        return ids


class _Outstanding:
    """Ids of the requests the host sent that the app has not answered yet.

    Each pump thread finds the ids in its bytes before passing them on (no lock held: each
    direction has its own `_Lines`), and records them here. Only the drain waits for the set
    to empty; answers notify only while it waits."""

    def __init__(self) -> None:
        self._ids: set[Key] = set()
        self._cond = threading.Condition()
        self._waiting = False
        self.from_host = _Lines(requests=True)
        self.from_app = _Lines(requests=False)

    def host_sent(self, data: bytes) -> None:
        self.asked(self.from_host.ids(data))

    def app_sent(self, data: bytes) -> None:
        self.answered(self.from_app.ids(data))

    def asked(self, ids: list[Key]) -> None:
        if ids:
            with self._cond:
                self._ids.update(ids)

    def answered(self, ids: list[Key]) -> None:
        if ids:
            with self._cond:
                self._ids.difference_update(ids)
                if self._waiting:
                    self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait_empty(self, deadline: float, stop: threading.Event) -> None:
        with self._cond:
            self._waiting = True
            try:
                while self._ids and not stop.is_set():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    self._cond.wait(remaining)
            finally:
                self._waiting = False


O_BINARY = 0x8000  # <fcntl.h> of the Microsoft C runtime (os.O_BINARY on Windows)


def binary_stdio(setmode: Callable[[int, int], object], fds: tuple[int, ...] = (0, 1)) -> None:
    """Windows: protocol bytes pass unchanged (no CRLF translation, no Ctrl+Z end of file)."""
    for fd in fds:
        setmode(fd, O_BINARY)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def pump(conn: Connection, drain_timeout: float, stdin_fd: int = 0, stdout_fd: int = 1) -> int:
    outstanding = _Outstanding()
    stdin_closed = threading.Event()
    app_closed = threading.Event()
    host_gone = threading.Event()
    changed = threading.Event()

    def host_to_app() -> None:
        while True:
            try:
                data = os.read(stdin_fd, CHUNK)
            except OSError:
                data = b""
            if not data:
                stdin_closed.set()
                break
            outstanding.host_sent(data)
            try:
                conn.send(data)
            except OSError:
                app_closed.set()
                break
        changed.set()
        outstanding.wake()

    def app_to_host() -> None:
        while True:
            try:
                data = conn.recv()
            except OSError:
                data = b""
            if not data:
                app_closed.set()
                break
            answered = outstanding.from_app.ids(data)  # before the host can send more
            try:
                _write_all(stdout_fd, data)
            except OSError:
                host_gone.set()
                break
            outstanding.answered(answered)  # once written: the drain may end after it
        changed.set()
        outstanding.wake()

    for target in (host_to_app, app_to_host):
        threading.Thread(target=target, daemon=True, name=target.__name__).start()
    changed.wait()
    ended = threading.Event()
    if stdin_closed.is_set() and not app_closed.is_set() and not host_gone.is_set():
        stop = threading.Event()

        def watch() -> None:
            while not (app_closed.is_set() or host_gone.is_set() or ended.is_set()):
                time.sleep(0.05)
            stop.set()
            outstanding.wake()

        threading.Thread(target=watch, daemon=True).start()
        outstanding.wait_empty(time.monotonic() + drain_timeout, stop)
    ended.set()
    conn.close()
    if app_closed.is_set() and not stdin_closed.is_set():
        _close_quietly(stdout_fd)
        raise ShimError("the ConvMem app closed the connection (it quit or restarted)")
    if host_gone.is_set() and not stdin_closed.is_set():
        raise ShimError("the host closed convmem-shim's stdout")
    return 0


def _close_quietly(fd: int) -> None:
    with suppress(OSError):
        os.close(fd)


# ---- command line ---------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ShimError(f"usage: {message}")

    def print_help(self, file: Any = None) -> None:
        super().print_help(sys.stderr)  # stdout is reserved for protocol bytes


def _seconds(value: str | None, default: float, name: str) -> float:
    if value is None or value == "":
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise ShimError(f"{name} must be a number of seconds") from None
    if not seconds >= 0:
        raise ShimError(f"{name} must be zero or more seconds")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="convmem-shim", description="Bridge stdio to the ConvMem app.")
    parser.add_argument("--data-dir", help="data directory (default: CONVMEM_DATA_DIR or ...)")
    parser.add_argument("--start-timeout", help="seconds to wait for a started app (0: no start)")
    parser.add_argument("--drain-timeout", help="seconds to wait for answers after stdin closes")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        start_timeout = _seconds(
            args.start_timeout or os.environ.get("CONVMEM_SHIM_START_TIMEOUT"),
            START_TIMEOUT_DEFAULT,
            "--start-timeout",
        )
        drain_timeout = _seconds(
            args.drain_timeout or os.environ.get("CONVMEM_SHIM_DRAIN_TIMEOUT"),
            DRAIN_TIMEOUT_DEFAULT,
            "--drain-timeout",
        )
        if IS_WINDOWS:
            import msvcrt

            binary_stdio(msvcrt.setmode)  # type: ignore[attr-defined,unused-ignore]
        data_dir = resolve_data_dir(args.data_dir)
        try:
            name = endpoint(data_dir)
        except OSError as exc:
            raise ShimError(str(exc)) from exc  # SocketDirError: which folder, why, the fix
        conn = connect_or_start(name, data_dir, start_timeout)
        return pump(conn, drain_timeout)
    except ShimError as exc:
        print(f"convmem-shim: {exc}", file=sys.stderr, flush=True)
        return 2 if str(exc).startswith("usage:") else 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
