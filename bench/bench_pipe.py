"""The app's CPU per call through its pipe, with raw hosts: no SDK client, no shim.

Starts one `convmem app` (offscreen) per tree given and drives each over its Unix socket with
K raw hosts (each a connection with one `write_message` outstanding at a time, like a host
waiting for its answer), in alternating rounds so that every app sees the same machine. For
each K: the app's CPU per call (utime + stime from /proc: every thread), its main (Qt)
thread's share, and calls per second; medians over the rounds. With two trees it is an A/B of
two versions of the code (e.g. `--tree base=/path/to/other/checkout --tree new=.`): each app
runs from its tree (PYTHONPATH) with this environment's packages.

Usage: python bench/bench_pipe.py [--tree NAME=DIR ...] [--hosts 1,8,16] [--calls 500]
       [--rounds 5] [--py-spy PREFIX] [--content corpus|lorem]
--content: what each write stores: `corpus` (default; the corpus's messages in turn, as
bench_mcp writes them: 48 characters on average) or `lorem` (one 540-character ASCII text
that repeats a five-word phrase, the figures of earlier sections).
Linux only (/proc, Unix sockets). --py-spy records `py-spy --gil --threads` of each app during
the rounds into PREFIX-NAME.txt (raw format; py-spy must be installed).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from convmem_app.shim.paths import endpoint  # noqa: E402

LOREM = "lorem ipsum dolor sit amet " * 20
CONTENTS: list[str] = [LOREM]
"""What the writes store, in turn (`--content`)."""


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    stat = Path(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_average() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def line(message: object) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def handshake() -> bytes:
    client = {"name": "bench-pipe", "version": "0"}
    params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": client}
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    return line({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}) + line(
        initialized
    )


def write_call(request_id: int, host: int) -> bytes:
    content = CONTENTS[request_id * 37 % len(CONTENTS)]
    arguments = {"session_id": f"host-{host}", "role": "user", "content": content}
    params = {"name": "write_message", "arguments": arguments}
    return line({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})


def connect(data_dir: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(endpoint(data_dir))
    sock.sendall(handshake())
    data = b""
    while b"\n" not in data:
        data += sock.recv(65536)
    return sock


def drive(hosts: list[socket.socket], calls: int, first_id: int) -> float:
    """`calls` writes over `hosts`, each with one request outstanding; seconds taken."""
    selector = selectors.DefaultSelector()
    sent = answered = 0
    began = time.perf_counter()
    for k, sock in enumerate(hosts):
        sock.sendall(write_call(first_id + sent, k))
        sent += 1
        selector.register(sock, selectors.EVENT_READ, k)
    while answered < calls:
        for key, _ in selector.select():
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            replies = sock.recv(1 << 20).count(b"\n")
            answered += replies
            for _ in range(replies):
                if sent < calls:
                    sock.sendall(write_call(first_id + sent, key.data))
                    sent += 1
    elapsed = time.perf_counter() - began
    selector.close()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--hosts", default="1,8,16")
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--py-spy", default=None, metavar="PREFIX")
    parser.add_argument("--content", choices=("corpus", "lorem"), default="corpus")
    args = parser.parse_args()
    if args.content == "corpus":
        sys.path.insert(0, str(ROOT / "bench"))
        from corpus import load_corpus

        CONTENTS[:] = [content for _, _, content in load_corpus()]
    trees = dict(t.split("=", 1) for t in args.tree) or {"this": str(ROOT)}
    counts = [int(k) for k in args.hosts.split(",")]
    work = Path(tempfile.mkdtemp(prefix="cmbench-pipe-"))
    apps: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    hosts: dict[tuple[str, int], list[socket.socket]] = {}
    spies: list[subprocess.Popen[bytes]] = []
    try:
        for name, tree in trees.items():
            data_dir = work / name
            env = {k: v for k, v in os.environ.items() if not k.startswith("CONVMEM_")}
            env["PYTHONPATH"] = str(Path(tree).resolve())
            env["QT_QPA_PLATFORM"] = "offscreen"
            command = [sys.executable, "-m", "convmem_app", "app", "--minimized"]
            apps[name] = (
                subprocess.Popen(
                    [*command, "--data-dir", str(data_dir)],
                    env=env,
                    cwd=tree,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                ),
                data_dir,
            )
        for name, (_, data_dir) in apps.items():
            deadline = time.monotonic() + 120
            while not Path(endpoint(data_dir)).exists():
                if time.monotonic() > deadline:
                    raise SystemExit(f"the {name} app did not start")
                time.sleep(0.1)
        time.sleep(1.0)
        hosts = {(n, k): [connect(apps[n][1]) for _ in range(k)] for n in apps for k in counts}
        for n in apps:
            drive(hosts[(n, counts[0])], 50, 1)  # warm
        if args.py_spy:
            for n, (process, _) in apps.items():
                spy = [str(Path(sys.executable).parent / "py-spy"), "record", "--gil"]
                spy += ["--threads", "-r", "500", "-p", str(process.pid), "-f", "raw"]
                spy += ["-o", f"{args.py_spy}-{n}.txt"]
                spies.append(subprocess.Popen(spy, stdout=subprocess.DEVNULL))
            time.sleep(1.0)
        print(
            f"load average {load_average()}; {args.rounds} rounds of {args.calls} calls;"
            f" content: {args.content}"
        )
        rows: dict[tuple[str, int], list[tuple[float, float, float]]] = {key: [] for key in hosts}
        next_id = 1000
        for r in range(args.rounds):
            order = list(apps) if r % 2 == 0 else list(reversed(apps))
            for k in counts:
                for n in order:
                    pid = apps[n][0].pid
                    cpu, main_thread = cpu_seconds(pid), cpu_seconds(pid, pid)
                    elapsed = drive(hosts[(n, k)], args.calls, next_id)
                    next_id += args.calls
                    used = cpu_seconds(pid) - cpu
                    used_main = cpu_seconds(pid, pid) - main_thread
                    per = 1000 / args.calls
                    rows[(n, k)].append((used * per, used_main * per, args.calls / elapsed))
        print(f"load average after {load_average()}")
        print(f"{'app':>8} {'hosts':>5} {'CPU ms/call':>11} {'(range)':>13} {'main thread':>11}")
        for k in counts:
            for n in apps:
                cpus = [c for c, _, _ in rows[(n, k)]]
                mains = [m for _, m, _ in rows[(n, k)]]
                rates = [w for _, _, w in rows[(n, k)]]
                one = statistics.median([w for _, _, w in rows[(n, counts[0])]])
                print(
                    f"{n:>8} {k:5d} {statistics.median(cpus):11.3f}"
                    f" {min(cpus):6.3f}-{max(cpus):6.3f} {statistics.median(mains):11.3f}"
                    f"   {statistics.median(rates):5.0f} calls/s"
                    f" ({statistics.median(rates) / one:.2f}x {counts[0]} host)"
                )
    finally:
        for spy in spies:
            spy.send_signal(2)
            spy.wait(60)
        for socks in hosts.values():
            for sock in socks:
                sock.close()
        for process, _ in apps.values():
            process.terminate()
        for process, _ in apps.values():
            process.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
