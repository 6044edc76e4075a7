"""HTTP transport benchmark: `POST /mcp` against stdio, in one `convmem serve --http` process.

One process serves both (its own stdio and HTTP on loopback), so the two transports share the
store, the service and the machine's load of the moment: the ratio is what HTTP costs. Raw
requests on one keep-alive connection (HTTP) and raw lines (stdio), no client library in the
way; then a 1 MiB write over each, and N HTTP clients at once (throughput, each on its own
connection and thread).

Usage: python bench/bench_http.py [--calls 300] [--clients 8] [--per-client 100]
Prints p50/p99 per tool and transport and the ratio HTTP/stdio.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def call_body(name: str, arguments: dict[str, Any], request_id: int = 1) -> bytes:
    message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call"}
    message["params"] = {"name": name, "arguments": arguments}
    return json.dumps(message).encode()


class HttpConnection:
    """One keep-alive connection writing raw requests (TCP_NODELAY, as hosts do)."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.token = token
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def request(self, body: bytes) -> bytes:
        head = (
            f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Authorization: Bearer {self.token}\r\nAccept: application/json\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.sock.sendall(head + body)
        data = b""
        while b"\r\n\r\n" not in data:
            data += self.sock.recv(65536)
        head_bytes, _, rest = data.partition(b"\r\n\r\n")
        assert head_bytes.startswith(b"HTTP/1.1 200"), head_bytes[:40]
        length = next(
            int(line.split(b":", 1)[1])
            for line in head_bytes.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(rest) < length:
            rest += self.sock.recv(65536)
        return rest

    def close(self) -> None:
        self.sock.close()


def timed(fn: Any, calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)


def p(times: list[float], q: float) -> float:
    return times[min(len(times) - 1, int(len(times) * q))] * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--per-client", type=int, default=100)
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="convmem-bench-http-"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "CONVMEM_HTTP_TOKEN"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-m", "convmem_app", "serve", "--http", "--port", str(port)]
    proc = subprocess.Popen(
        [*command, "--data-dir", str(data_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=ROOT,
    )
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout
    init = {"protocolVersion": "2025-11-25", "capabilities": {}}
    init["clientInfo"] = {"name": "bench", "version": "0"}
    stdin.write(
        json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}).encode()
        + b"\n"
    )
    stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    stdin.flush()
    stdout.readline()
    token_file = data_dir / "http-token"
    deadline = time.monotonic() + 60
    while not token_file.exists():
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    time.sleep(1.0)  # the listener starts right after the token is stored
    token = token_file.read_text().strip()

    def over_stdio(body: bytes) -> None:
        stdin.write(body + b"\n")
        stdin.flush()
        stdout.readline()

    http = HttpConnection(port, token)
    cases = [
        ("get_system_health", {}),
        ("write_message", {"session_id": "b", "role": "user", "content": "x" * 200}),
        ("search_messages", {"query": "xxxx"}),
    ]
    print(
        f"{'tool':<20} {'stdio p50':>10} {'p99':>8} {'HTTP p50':>10} {'p99':>8} {'HTTP/stdio':>11}"
    )
    for name, arguments in cases:
        body = call_body(name, arguments)
        stdio_times = timed(lambda body=body: over_stdio(body), args.calls)
        http_times = timed(lambda body=body: http.request(body), args.calls)
        ratio = statistics.median(http_times) / statistics.median(stdio_times)
        print(
            f"{name:<20} {p(stdio_times, 0.5):>8.2f}ms {p(stdio_times, 0.99):>6.2f}ms "
            f"{p(http_times, 0.5):>8.2f}ms {p(http_times, 0.99):>6.2f}ms {ratio:>10.2f}x"
        )
    big = call_body(
        "write_message", {"session_id": "big", "role": "user", "content": "é" * 500_000}
    )
    stdio_big = timed(lambda: over_stdio(big), 5)
    http_big = timed(lambda: http.request(big), 5)
    print(
        f"{'1 MiB write':<20} {p(stdio_big, 0.5):>8.1f}ms {'':>8} {p(http_big, 0.5):>8.1f}ms "
        f"{'':>8} {statistics.median(http_big) / statistics.median(stdio_big):>10.2f}x"
    )
    http.close()

    done: list[int] = []

    def client(n: int) -> None:
        connection = HttpConnection(port, token)
        for i in range(args.per_client):
            connection.request(
                call_body(
                    "write_message", {"session_id": f"c{n}", "role": "user", "content": f"{i}"}
                )
            )
        connection.close()
        done.append(args.per_client)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(args.clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    total = sum(done)
    print(
        f"{args.clients} HTTP clients: {total} writes in {elapsed:.2f} s "
        f"= {total / elapsed:.0f} writes/s"
    )

    stdin.close()
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
