"""convmem-shim's CPU per call, alone: N shims pumping at once, each ping-ponged by its host.

Each shim is the real pump (`launcher.pump` over a real Unix socket, in its own process, from
the tree given); the app is played by a small asyncio server in this process that answers
each request line at once with a ~700-byte tool result carrying the request's id, so the
figures are the shim's own (no engine, no SDK client). For N shims at once: the shims' CPU
per call (every thread, nanoseconds from /proc/PID/task/*/schedstat) and their context
switches per call, medians over the rounds; with two trees the shims take turns round by
round (an A/B of two versions on the same machine).

Usage: python bench/bench_shim_pump.py [--tree NAME=DIR ...] [--shims 1,8] [--calls 3000]
       [--rounds 3]
Linux only (/proc, Unix sockets).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANSWER = {"content": [{"type": "text", "text": "x" * 600}], "isError": False}
REQUEST = (
    '{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"write_message",'
    '"arguments":{"session_id":"s","role":"user","content":"%s"}}}\n'
)


def scheduling(pid: int) -> tuple[float, int]:
    """CPU seconds and context switches of every live thread of `pid`."""
    cpu_ns = switches = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            cpu_ns += int((task / "schedstat").read_text().split()[0])
            status = (task / "status").read_text()
        except OSError:
            continue
        switches += sum(
            int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line
        )
    return cpu_ns / 1e9, switches


async def app(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The app's part: one answer line per request line."""
    while line := await reader.readline():
        message = json.loads(line)
        if "id" in message:
            answer = {"jsonrpc": "2.0", "id": message["id"], "result": ANSWER}
            writer.write(json.dumps(answer, separators=(",", ":")).encode() + b"\n")
    writer.close()


async def host(tree: str, socket_path: str, calls: int, go: asyncio.Event) -> tuple[float, int]:
    """One shim process and its host: `calls` requests, one at a time; the shim's CPU seconds
    and context switches over them."""
    code = (
        "import sys; from convmem_app.shim.launcher import _UnixConnection, pump; "
        f"sys.exit(pump(_UnixConnection({socket_path!r}), 5.0))"
    )
    shim = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=tree),
    )
    assert shim.stdin is not None and shim.stdout is not None
    shim.stdin.write((REQUEST % (0, "warm")).encode())
    await shim.stdout.readline()
    await go.wait()
    cpu, switches = scheduling(shim.pid)
    content = "y" * 300
    for i in range(1, calls + 1):
        shim.stdin.write((REQUEST % (i, content)).encode())
        await shim.stdin.drain()
        if not await shim.stdout.readline():
            raise RuntimeError("the shim ended early")
    cpu_after, switches_after = scheduling(shim.pid)
    shim.stdin.close()
    await shim.stdout.read()
    if await shim.wait() != 0:
        raise RuntimeError("the shim failed")
    return cpu_after - cpu, switches_after - switches


async def one_run(tree: str, shims: int, calls: int, socket_path: str) -> dict[str, float]:
    go = asyncio.Event()
    tasks = [asyncio.create_task(host(tree, socket_path, calls, go)) for _ in range(shims)]
    await asyncio.sleep(1.0)  # every shim started and warm
    began = time.perf_counter()
    go.set()
    used = await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - began
    total = shims * calls
    return {
        "cpu_ms_per_call": sum(u[0] for u in used) * 1000 / total,
        "switches_per_call": sum(u[1] for u in used) / total,
        "calls_per_s": total / elapsed,
    }


async def run(trees: dict[str, str], counts: list[int], calls: int, rounds: int) -> None:
    folder = tempfile.mkdtemp(prefix="cmbench-shim-")
    os.chmod(folder, 0o700)  # the shim checks the socket's folder as it checks the app's
    socket_path = os.path.join(folder, "app")
    server = await asyncio.start_unix_server(app, socket_path)
    rows: dict[tuple[int, str], list[dict[str, float]]] = {}
    try:
        print(f"load average {Path('/proc/loadavg').read_text().split()[0]}, {calls} calls")
        for r in range(rounds):
            for count in counts:
                names = list(trees) if r % 2 == 0 else list(reversed(trees))
                for name in names:
                    result = await one_run(trees[name], count, calls, socket_path)
                    rows.setdefault((count, name), []).append(result)
    finally:
        server.close()
        shutil.rmtree(folder, ignore_errors=True)
    print(f"load average {Path('/proc/loadavg').read_text().split()[0]}")
    print(f"{'shims':>5} {'tree':>10} {'CPU ms/call':>11} {'switches':>8} {'calls/s':>8}   rounds")
    for (count, name), results in rows.items():
        cpu = [x["cpu_ms_per_call"] for x in results]
        print(
            f"{count:5d} {name:>10} {statistics.median(cpu):11.4f}"
            f" {statistics.median(x['switches_per_call'] for x in results):8.2f}"
            f" {statistics.median(x['calls_per_s'] for x in results):8.0f}"
            f"   {', '.join(f'{c:.4f}' for c in cpu)}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--shims", default="1,8")
    parser.add_argument("--calls", type=int, default=3000, help="calls per shim")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trees = {t.split("=", 1)[0]: str(Path(t.split("=", 1)[1]).resolve()) for t in args.tree} or {
        "this": str(ROOT)
    }
    counts = [int(c) for c in args.shims.split(",") if c]
    asyncio.run(run(trees, counts, args.calls, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
