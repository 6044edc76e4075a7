#!/usr/bin/env python3
"""Run the official MCP conformance suite against `convmem serve --http`.

    python3 scripts/http_conformance.py [--conformance CMD] [--scenario NAME ...] [--all]

The suite (npm `@modelcontextprotocol/conformance`, Node >= 22) sends no token. So the real
server runs with its token on `[::1]:PORT`, and a small proxy on `127.0.0.1:PORT` (the same port
number: Host and Origin headers pass through unchanged and stay valid for the server) forwards
every request as it is, adding `Authorization: Bearer <token>`. Nothing turns the token off.

`--conformance` is the command that starts the suite (default: `npx -y
@modelcontextprotocol/conformance`; with Node 22 installed under /tmp, e.g.
`/tmp/conf/node_modules/.bin/conformance` with that directory's node first on PATH). The default
scenarios are those that apply to a server without the suite's own test tools: server-initialize,
ping, tools-list, dns-rebinding-protection. `--all` runs every server scenario (most of them call
tools, prompts and resources named `test_*` that only the suite's reference server has).
Exit status: 0 when every chosen scenario passed.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPLICABLE = ["server-initialize", "ping", "tools-list", "dns-rebinding-protection"]
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "authorization",
}


def free_port() -> int:
    """A port free on both 127.0.0.1 and ::1."""
    for _ in range(100):
        with socket.socket(socket.AF_INET6) as six:
            six.bind(("::1", 0))
            port = int(six.getsockname()[1])
            with socket.socket() as four:
                try:
                    four.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    raise SystemExit("no port free on both 127.0.0.1 and ::1")


def make_proxy(port: int, token: str) -> ThreadingHTTPServer:
    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            upstream = http.client.HTTPConnection("::1", port, timeout=120)
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in HOP_BY_HOP:
                    upstream.putheader(name, value)  # Host and Origin unchanged
            upstream.putheader("Authorization", f"Bearer {token}")
            upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body)
            answer = upstream.getresponse()
            data = answer.read()
            upstream.close()
            self.send_response_only(answer.status, answer.reason)
            for name, value in answer.getheaders():
                if name.lower() not in HOP_BY_HOP:
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PUT = do_OPTIONS = forward

        def log_message(self, format: str, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: object, client_address: object) -> None:
            if not isinstance(sys.exc_info()[1], ConnectionError):  # a client hanging up is fine
                super().handle_error(request, client_address)  # type: ignore[arg-type]

    return Server(("127.0.0.1", port), Proxy)


def wait_for(condition: object, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def accepting(port: int) -> bool:
    try:
        socket.create_connection(("::1", port), timeout=1).close()
        return True
    except OSError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conformance", default="npx -y @modelcontextprotocol/conformance")
    parser.add_argument("--scenario", action="append", help="a server scenario (repeatable)")
    parser.add_argument("--all", action="store_true", help="every server scenario")
    args = parser.parse_args()
    scenarios = args.scenario or APPLICABLE

    data_dir = Path(tempfile.mkdtemp(prefix="convmem-conformance-"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "CONVMEM_HTTP_TOKEN"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    serve = [sys.executable, "-m", "convmem_app", "serve", "--http", "--no-stdio"]
    serve += ["--host", "::1", "--port", str(port), "--data-dir", str(data_dir)]
    print("server:", shlex.join(serve), flush=True)
    server = subprocess.Popen(serve, stdin=subprocess.DEVNULL, env=env, cwd=ROOT)
    proxy: ThreadingHTTPServer | None = None
    failed = 0
    try:
        token_file = data_dir / "http-token"
        wait_for(lambda: server.poll() is not None or accepting(port), "the server")
        if server.poll() is not None:
            raise SystemExit(f"convmem serve exited with status {server.returncode}")
        token = token_file.read_text().strip()
        proxy = make_proxy(port, token)
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{port}/mcp"
        print(f"proxy:  {url} -> http://[::1]:{port}/mcp (+ Authorization)", flush=True)
        base = [*shlex.split(args.conformance), "server", "--url", url]
        runs = (
            [[*base, "--suite", "all"]]
            if args.all
            else [[*base, "--scenario", s] for s in scenarios]
        )
        for command in runs:
            print("\n$", shlex.join(command), flush=True)
            status = subprocess.run(command, cwd=tempfile.gettempdir()).returncode
            failed += status != 0
    finally:
        if proxy is not None:
            proxy.shutdown()
            proxy.server_close()
        server.send_signal(signal.SIGTERM)
        code = server.wait(30)
        print(f"\nconvmem serve stopped with status {code}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
