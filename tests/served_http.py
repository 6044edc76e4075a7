"""`convmem serve --http` as users run it: a real subprocess on a free loopback port, with its
bearer token. Shared by the suites that drive it over HTTP (tests/mcp/test_mcp_http_serve.py,
the MCP Inspector's run in tests/app/test_mcp_inspector.py).

Imported as `tests.served_http` (pytest's `pythonpath` puts the repository root on sys.path)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from convmem_engine.mcp.http_token import ENV_VAR, TOKEN_FILE_NAME
from tests.mcp.mcp_helpers import child_env, serve_args


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Served:
    """`convmem serve --http ...` on a free port, stderr kept in `log`; a context manager that
    never leaves the process behind. `token`: given to the process in its environment; without
    it the process writes one to the data dir's token file, read from there."""

    def __init__(
        self,
        data_dir: Path,
        log: Path,
        *extra: str,
        stdin: Any = subprocess.DEVNULL,
        token: str | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.log = log
        self.port = free_port()
        args = serve_args(data_dir, "--http", "--port", str(self.port), *extra)
        env = child_env() if token is None else child_env() | {ENV_VAR: token}
        with log.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, *args], stdin=stdin, stdout=err, stderr=err, env=env
            )
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        deadline = time.monotonic() + 60
        while "MCP over HTTP at" not in log.read_text():  # said once it serves
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(log.read_text())
            time.sleep(0.05)
        self.token = (data_dir / TOKEN_FILE_NAME).read_text().strip() if token is None else token

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
