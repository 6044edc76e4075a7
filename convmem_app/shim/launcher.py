"""`convmem-shim`: the command LLM hosts run. Bridges its stdio to the ConvMem app's local pipe.

Standard library only (no Qt, no `mcp`, no engine): it must start in a few milliseconds.

- Data dir: `--data-dir`, else `CONVMEM_DATA_DIR`, else the platform default; the pipe name
  comes from `convmem_app.shim.paths.endpoint` (a Unix socket in a private 0700 directory, or a
  Windows named pipe).
- Nobody listening: start the app detached (`convmem app --minimized --data-dir D`) and wait
  for its pipe, at most `--start-timeout` seconds (default 15, env
  `CONVMEM_SHIM_START_TIMEOUT`; 0 = never start the app). Shims starting at the same moment
  take a launch lock so only one of them starts an app.
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
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, NoReturn, Protocol

from convmem_app.shim.paths import endpoint, resolve_data_dir, windows_pipe_path

START_TIMEOUT_DEFAULT = 15.0
DRAIN_TIMEOUT_DEFAULT = 5.0
CHUNK = 65536
IS_WINDOWS = sys.platform == "win32"
# The bundled tray app (installer/convmem.spec). Not `convmem.exe`: Windows names are
# case-insensitive and the console command line is `convmem-cli.exe`.
FROZEN_APP_NAME = "ConvMem.exe" if IS_WINDOWS else "ConvMem"

_RESPONSE_HEAD = re.compile(
    rb'\{"jsonrpc":"2\.0","id":("(?:[^"\\]|\\.)*"|-?\d+),"(result|error|method)"'
)


class ShimError(Exception):
    """A problem the user must see: one line on stderr, non-zero exit."""


class NotListening(Exception):
    """No app listens on the endpoint (yet)."""


class Connection(Protocol):
    def send(self, data: bytes) -> None: ...
    def recv(self) -> bytes: ...  # b"" at end of stream
    def close(self) -> None: ...


# ---- connecting -----------------------------------------------------------------------------


class _UnixConnection:
    def __init__(self, path: str) -> None:
        import socket

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise NotListening from exc
        except OSError as exc:
            sock.close()
            raise ShimError(f"cannot connect to the app's socket {path}: {exc.strerror}") from exc
        self._sock = sock

    def send(self, data: bytes) -> None:
        self._sock.sendall(data)

    def recv(self) -> bytes:
        return self._sock.recv(CHUNK)

    def close(self) -> None:
        self._sock.close()


class _WindowsPipeConnection:
    """An overlapped named-pipe client on a private Proactor loop, with a blocking face.

    A plain `open(r'\\\\.\\pipe\\X', 'r+b')` handle is synchronous: a thread blocked reading it
    would block the other thread's write. asyncio's Proactor uses overlapped I/O."""

    def __init__(self, path: str, timeout: float) -> None:
        import asyncio
        import queue

        self._asyncio = asyncio
        self._incoming: queue.Queue[bytes] = queue.Queue()
        self._loop = asyncio.ProactorEventLoop()  # type: ignore[attr-defined,unused-ignore]
        self._can_write = asyncio.Event()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._connect(path), self._loop)
        try:
            self._transport = future.result(timeout)
        except FileNotFoundError as exc:
            self._stop_loop()
            raise NotListening from exc
        except TimeoutError as exc:
            future.cancel()
            self._stop_loop()
            raise ShimError(f"the app's pipe {path} stayed busy for {timeout:g} s") from exc
        except OSError as exc:
            self._stop_loop()
            raise ShimError(f"cannot connect to the app's pipe {path}: {exc}") from exc

    async def _connect(self, path: str) -> Any:
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

            def pause_writing(self) -> None:
                shim._can_write.clear()

            def resume_writing(self) -> None:
                shim._can_write.set()

        loop = self._asyncio.get_running_loop()
        transport, _protocol = await loop.create_pipe_connection(  # type: ignore[attr-defined,unused-ignore]
            _Protocol, path
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
        self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(2.0)


def connect(name: str, timeout: float = 5.0) -> Connection:
    """Connect to the app's endpoint; NotListening when no app is there."""
    if IS_WINDOWS:
        return _WindowsPipeConnection(windows_pipe_path(name), timeout)
    return _UnixConnection(name)


# ---- starting the app -----------------------------------------------------------------------


def frozen_app_executable() -> Path:
    """In a bundled build (installer/convmem.spec) the windowed tray app, `ConvMem[.exe]`,
    sits in the same folder as every other ConvMem executable."""
    return Path(sys.executable).resolve().parent / FROZEN_APP_NAME


def app_command(data_dir: Path) -> list[str]:
    """The command that starts the tray app for `data_dir`, minimised."""
    tail = ["--minimized", "--data-dir", str(data_dir)]
    if getattr(sys, "frozen", False):
        return [str(frozen_app_executable()), *tail]
    return [sys.executable, "-m", "convmem_app", "app", *tail]


def spawn_app(data_dir: Path) -> Any:
    """Start the app detached from us: own session / no console, stdio to the null device."""
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
            flags = (
                subprocess.DETACHED_PROCESS  # type: ignore[attr-defined,unused-ignore]
                | subprocess.CREATE_NEW_PROCESS_GROUP  # type: ignore[attr-defined,unused-ignore]
            )
            breakaway = 0x01000000  # CREATE_BREAKAWAY_FROM_JOB: outlive a host's job object
            try:
                return subprocess.Popen(command, creationflags=flags | breakaway, **options)
            except OSError:  # the job forbids breaking away
                return subprocess.Popen(command, creationflags=flags, **options)
        return subprocess.Popen(command, start_new_session=True, **options)
    except OSError as exc:
        raise ShimError(f"cannot start the ConvMem app ({command[0]}): {exc.strerror}") from exc


def _home() -> str | None:
    try:
        return str(Path.home())
    except (RuntimeError, KeyError):
        return None


@contextmanager
def launch_lock(name: str, deadline: float) -> Iterator[None]:
    """Serialise app launches for one endpoint across shims (bounded by `deadline`)."""
    if IS_WINDOWS:
        import tempfile

        path = os.path.join(tempfile.gettempdir(), f"{name}.launch")
    else:
        path = f"{name}.launch"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                _try_lock(fd)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    raise ShimError(
                        "another convmem-shim kept starting the app for too long"
                    ) from None
                time.sleep(0.02)
        yield
    finally:
        if IS_WINDOWS:  # Windows wants byte-range locks released before the handle closes
            import msvcrt

            with suppress(OSError):
                os.lseek(fd, 0, os.SEEK_SET)
                msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)  # type: ignore[attr-defined,unused-ignore]
        os.close(fd)  # closing the descriptor releases the lock


def _try_lock(fd: int) -> None:
    if IS_WINDOWS:
        import msvcrt

        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined,unused-ignore]
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


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


class _Outstanding:
    """Ids of the requests the host sent that the app has not answered yet."""

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._cond = threading.Condition()
        self._from_host = bytearray()
        self._from_app = bytearray()

    @staticmethod
    def _lines(buffer: bytearray, data: bytes) -> list[bytes]:
        buffer += data
        if b"\n" not in data:
            return []
        *complete, rest = bytes(buffer).split(b"\n")
        buffer[:] = rest
        return complete

    def host_sent(self, data: bytes) -> None:
        for line in self._lines(self._from_host, data):
            try:
                message = json.loads(line)
            except ValueError:
                continue
            for item in message if isinstance(message, list) else [message]:
                if isinstance(item, dict) and "method" in item and "id" in item:
                    with self._cond:
                        self._ids.add(json.dumps(item["id"]))

    def app_sent(self, data: bytes) -> None:
        answered: list[str] = []
        for line in self._lines(self._from_app, data):
            head = _RESPONSE_HEAD.match(line, 0, 256)
            if head is not None:
                if head.group(2) != b"method":
                    answered.append(json.dumps(json.loads(head.group(1))))
                continue
            try:
                message = json.loads(line)
            except ValueError:
                continue
            for item in message if isinstance(message, list) else [message]:
                if isinstance(item, dict) and "id" in item and "method" not in item:
                    answered.append(json.dumps(item["id"]))
        if answered:
            with self._cond:
                self._ids.difference_update(answered)
                self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait_empty(self, deadline: float, stop: threading.Event) -> None:
        with self._cond:
            while self._ids and not stop.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._cond.wait(remaining)


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
            try:
                _write_all(stdout_fd, data)
            except OSError:
                host_gone.set()
                break
            outstanding.app_sent(data)
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

            for fd in (0, 1):
                msvcrt.setmode(fd, os.O_BINARY)  # type: ignore[attr-defined,unused-ignore]
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
