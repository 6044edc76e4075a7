"""MCP-level benchmark: what a host feels, through the real transports, side by side.

One command, one run, on the real corpus (chitchat-dataset, 258,145 messages):

1. **fsync floor**: raw `write` + `fsync` of corpus-sized records in the same folder (the
   physical floor of a durable write on this disk, this minute).
2. **stdio**: `write_message` round trips through the official SDK client to a real
   `convmem serve` subprocess (p50/p99), on an empty store and on stores of each size, once
   the server's start is over (its CPU stands still, at most 30 s after 20 warm-up writes).
3. **cold start** per store size: process start → answer to `initialize` (the handshake) →
   answer to the first `get_system_health` (first tool reply) → a second one (a later call),
   → search index ready (health's `search_index_bytes` > 0); peak RSS (VmHWM) of the server
   once it has settled (the SDK, loaded after the first answers, included) and a call has gone
   through the SDK (`rss_at_index_ready_mib`: the peak so far at index ready).
4. **app**: one `convmem app` and 1/8/16 concurrent hosts, each a real `convmem-shim` process
   driven by the SDK client in its own worker process: throughput, p50/p99, acknowledged writes
   vs writes read back, and the app's CPU per call (from /proc).
5. **peers**: the MCP project's reference memory server (`@modelcontextprotocol/server-memory`
   from npm, over stdio with the same client code; each write one entity with one observation):
   its write p50 and, with 8 hosts each running their own server on one memory file (how hosts
   use it), how many acknowledged entities are still there afterwards.
6. **SQLite FTS5** (trigram), in process on the same texts, at 258,145 messages (and 1M with
   `--million`): the search index's build CPU and the all-queries search median against
   FTS5's, and our worst search (bench/bench_search.py's query sets, run in a child process
   of its own so that its memory stays out of the figures above; `--no-fts` skips it).

Usage: python bench/bench_mcp.py [--sizes 1000,100000,258145] [--million] [--writes 300]
       [--clients 1,8,16] [--per-client 150] [--no-peer] [--no-fts] [--json OUT] [--plots DIR]
       python bench/bench_mcp.py --cold-stores /tmp/perf-258k,/tmp/perf-1m [--starts 5]
         [--no-index-wait] [--frozen DIST]
         (cold start only, on copies of ready-made stores: handshake, first reply, the
         server's CPU time at each (from /proc), first/later health, index ready, peak RSS;
         with --frozen, each start from source is paired with one of DIST/convmem-cli serve
         (the two take turns at going first), a PyInstaller build of installer/convmem.spec,
         and the ratios are printed)
       python bench/bench_mcp.py --app-only [--clients 1,8,16] [--per-client 200]
         [--profile-app DIR [--profile-gil]] [--tree NAME=DIR ... --rounds N] [--tray]
         [--tray-tree NAME ...]
         (section 4 only: the app through shims; CPU per call of the app, of each shim and
         of each SDK client, from /proc, counted until the app's CPU stands still after the
         last write; the app's idle CPU measured before; optionally a py-spy profile of the
         app per count (--idle off, or --gil); with --tree, one app per ConvMem tree, taking
         turns round by round: an A/B on the same machine; with --lean-hosts each host is
         a standard-library JSON-RPC client instead of the SDK client; --tray-tree NAME
         starts that tree's app as a tray app, so one tree under two names, one of them a
         tray app, measures what the window costs)
Linux only (reads /proc). Prints a table per section; --json keeps every figure for
bench/plot_mcp.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from corpus import load_corpus

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
NPM_PEER = "@modelcontextprotocol/server-memory"
TREE_VARIABLE = "BENCH_MCP_TREE"  # the ConvMem tree a worker's shim runs from


# ---- small utilities ------------------------------------------------------------------------


def tree_root() -> str:
    """The ConvMem tree the bench's processes run: `python -m` puts the working directory
    first on the import path, so they also start there (else a run from inside another
    checkout would import that checkout)."""
    return os.environ.get(TREE_VARIABLE, str(ROOT))


def compile_tree(tree: Path) -> None:
    """Compile `tree`'s modules to bytecode first, as an installed ConvMem has them (pip,
    PyInstaller, a source run after its first start): with PYTHONDONTWRITEBYTECODE set (as on
    the CI machines) every start would otherwise compile ConvMem's own modules again, ~0.1 s
    of CPU before the handshake and ~0.1 s more before the first reply."""
    subprocess.run(
        [PY, "-m", "compileall", "-q", "convmem_engine", "convmem_app"],
        cwd=tree,
        check=True,
        stdout=subprocess.DEVNULL,
    )


def child_env(tree: Path | None = None) -> dict[str, str]:
    """The environment of the processes the bench starts: ConvMem from `tree` (default: the
    tree a worker was told, else this one), Qt offscreen."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVMEM_")}
    root = str(tree) if tree is not None else tree_root()
    env[TREE_VARIABLE] = root
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env["QT_QPA_PLATFORM"] = "offscreen"
    return env


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def children_cpu_seconds(pid: int) -> float:
    """CPU seconds of the live child processes of `pid` (a worker's shim or server)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            total += cpu_seconds(int(stat.parent.name))
    return total


def vm_hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def wait_cpu_still(
    cpu: Callable[[], float], timeout: float = 30.0, still: float = 0.3, slack: float = 0.005
) -> None:
    """Wait (at most `timeout`) until `cpu()` (CPU seconds) grows by less than `slack` in
    `still` seconds."""
    deadline = time.monotonic() + timeout
    last = cpu()
    while time.monotonic() < deadline:
        time.sleep(still)
        now = cpu()
        if now - last < slack:
            return
        last = now


def settle(pid: int) -> None:
    """Wait until process `pid` uses no CPU (at most 30 s)."""
    wait_cpu_still(lambda: cpu_seconds(pid))


def load_average() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def rpc(request_id: int, method: str, params: dict[str, Any]) -> bytes:
    message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    return json.dumps(message).encode() + b"\n"


INITIALIZE = rpc(
    1,
    "initialize",
    {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "bench", "version": "0"},
    },
)
INITIALIZED = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode() + b"\n"


def health_call(request_id: int) -> bytes:
    return rpc(request_id, "tools/call", {"name": "get_system_health", "arguments": {}})


# ---- 1. the fsync floor ---------------------------------------------------------------------


def fsync_floor(folder: Path, n: int) -> list[float]:
    corpus = load_corpus()
    path = folder / "floor.bin"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    out = []
    try:
        for i in range(n):
            record = json.dumps(corpus[i * 37 % len(corpus)]).encode() + b"\n"
            t = time.perf_counter()
            os.write(fd, record)
            os.fsync(fd)
            out.append((time.perf_counter() - t) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return out


# ---- store building -------------------------------------------------------------------------


def build_store(data_dir: Path, n: int) -> float:
    """A data dir of `n` corpus messages (repeated past the corpus), written by the store
    itself and closed cleanly (so it has a snapshot, as a store that ran a while does)."""
    from convmem_engine.domain import Message
    from convmem_engine.service.ids import UlidSource
    from convmem_engine.storage import Store

    corpus = load_corpus()
    clock = iter(range(1_700_000_000_000, 1_700_000_000_000 + 10 * n + 10, 10))
    ids = UlidSource(lambda: next(clock))
    t0 = time.perf_counter()
    store = Store.open(str(data_dir))
    seq = 0
    for i in range(n):
        session, role, content = corpus[i % len(corpus)]
        if i >= len(corpus):
            session = f"{session}-{i // len(corpus)}"
        mid, ts = ids.next()
        seq = store.write_put(Message(mid, session, ts, role, content, 1, ts))
        if i % 50_000 == 49_999:
            store.sync(seq)
    store.sync(seq)
    store.close()
    return time.perf_counter() - t0


# ---- 2. stdio round trips -------------------------------------------------------------------


def write_args(i: int, tag: str) -> dict[str, Any]:
    session, role, content = load_corpus()[i * 37 % len(load_corpus())]
    return {"session_id": f"{tag}-{session}", "role": role, "content": content}


async def _stdio_writes(command: list[str], n: int, tag: str) -> list[float]:
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=command[0], args=command[1:], env=child_env(), cwd=tree_root()
    )
    out: list[float] = []
    with open(os.devnull, "w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            for i in range(n + 20):
                if i == 20:  # warm: measure once the server's start is over (see below)
                    await _server_idle()
                t = time.perf_counter()
                result = await client.call_tool("write_message", write_args(i, tag))
                elapsed = (time.perf_counter() - t) * 1000
                assert not result.is_error, result
                if i >= 20:
                    out.append(elapsed)
    return out


async def _server_idle(timeout: float = 30.0) -> None:
    """Wait (at most `timeout`) until the server, a child of this process, uses no CPU: the
    stdio front answers the first calls while the SDK and the runtime load on other threads,
    and the search index loads or builds in the background; the write figures are the
    server's steady state."""
    import anyio

    me = os.getpid()
    await anyio.to_thread.run_sync(wait_cpu_still, lambda: children_cpu_seconds(me), timeout)


def stdio_writes(data_dir: Path, n: int) -> list[float]:
    import anyio

    command = [PY, "-m", "convmem_app", "serve", "--data-dir", str(data_dir)]
    return anyio.run(_stdio_writes, command, n, "stdio")


# ---- 3. cold start --------------------------------------------------------------------------


def read_answer(stdout: Any, want_id: int) -> dict[str, Any]:
    while True:
        line = stdout.readline()
        if not line:
            raise RuntimeError("the server closed its stdout")
        message = json.loads(line)
        if message.get("id") == want_id:
            return message  # type: ignore[no-any-return]


def index_ready(answer: dict[str, Any]) -> bool:
    health = json.loads(answer["result"]["content"][0]["text"])
    estimate = health["memory_estimate"]
    return health["active_messages"] == 0 or estimate["search_index_bytes"] > 0


SOURCE_SERVE: Final = [PY, "-m", "convmem_app", "serve"]


class _LifePeak:
    """The peak RSS of a process over its whole life, the close included (what it allocates
    writing search.idx after a rebuild): VmHWM, a high-water mark, read every 2 ms by a thread
    until the process has let go of its memory (its /proc status has no VmHWM any more). Not
    `ru_maxrss` from wait4: on Linux a child's also counts the RSS its parent had when it
    forked (this bench holds stores)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                hwm = vm_hwm_mib(self.pid)
            except OSError:
                return
            if hwm != hwm:  # nan: exiting, no VmHWM line
                return
            self.peak = max(self.peak, hwm)
            time.sleep(0.002)

    def result(self) -> float:
        """Once the process has exited."""
        self._thread.join(10)
        return self.peak


def spawn_stdio(command: list[str]) -> subprocess.Popen[bytes]:
    """`command` (a server or a shim) with pipes for stdin and stdout, started from this tree
    (`tree_root`) as a host starts it."""
    return subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=child_env(),
        cwd=tree_root(),
    )


def cold_start(
    data_dir: Path, *, wait_index: bool = True, serve: list[str] = SOURCE_SERVE
) -> dict[str, float]:
    """Timings (ms) from process start; the peak RSS (MiB) at index ready and once settled.
    `serve`: the command that serves MCP on stdio (from source, or a frozen `convmem-cli`)."""
    started = time.perf_counter()
    process = spawn_stdio([*serve, "--data-dir", str(data_dir)])
    assert process.stdin is not None and process.stdout is not None

    def send(data: bytes) -> None:
        assert process.stdin is not None
        process.stdin.write(data)
        process.stdin.flush()

    def since() -> float:
        return (time.perf_counter() - started) * 1000

    try:
        send(INITIALIZE)
        read_answer(process.stdout, 1)
        handshake = since()
        handshake_cpu = cpu_seconds(process.pid) * 1000
        send(INITIALIZED + health_call(2))
        read_answer(process.stdout, 2)
        first = since()
        first_cpu = cpu_seconds(process.pid) * 1000
        t = time.perf_counter()
        send(health_call(3))
        answer = read_answer(process.stdout, 3)
        later = (time.perf_counter() - t) * 1000
        request_id = 4
        while wait_index and not index_ready(answer):
            time.sleep(0.05)
            send(health_call(request_id))
            answer = read_answer(process.stdout, request_id)
            request_id += 1
        ready = since()
        rss_at_ready = vm_hwm_mib(process.pid)
        estimate = json.loads(answer["result"]["content"][0]["text"])["memory_estimate"]
        # The SDK loads after the front's first answers, possibly after the index is ready:
        # the peak counts once the server has settled, and a call has gone through the SDK.
        settle(process.pid)
        send(health_call(request_id))
        read_answer(process.stdout, request_id)
        rss = vm_hwm_mib(process.pid)
    finally:
        life = _LifePeak(process.pid)
        process.stdin.close()
        process.stdout.read()
        process.stdout.close()
        process.wait(120)
        life_peak = life.result()
    return {
        "handshake_ms": handshake,
        "handshake_cpu_ms": handshake_cpu,
        "first_reply_ms": first,
        "first_reply_cpu_ms": first_cpu,
        "first_health_ms": first - handshake,
        "later_health_ms": later,
        "index_ready_ms": ready,
        "peak_rss_mib": rss,
        "peak_rss_life_mib": life_peak,
        "rss_at_index_ready_mib": rss_at_ready,
        "estimate_total_mib": estimate["total_bytes"] / 2**20,
        "estimate_search_index_mib": estimate["search_index_bytes"] / 2**20,
    }


def cold_stores(
    stores: list[str],
    starts: int,
    where: str | None,
    out: str | None,
    wait_index: bool,
    frozen: str = "",
) -> int:
    """Cold starts of `convmem serve` on copies of ready-made stores (their search.idx kept),
    `starts` each, interleaved with an empty store's so both see the same machine. With
    `frozen` (a PyInstaller dist folder), each start from source is paired with one of its
    `convmem-cli serve` on the same store, the two taking turns at going first."""
    servers = {"": SOURCE_SERVE}
    if frozen:
        servers[" frozen"] = [str(Path(frozen) / "convmem-cli"), "serve"]
    work = Path(tempfile.mkdtemp(prefix="cmbench-cold-", dir=where))
    figures: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "load_before": load_average()}}
    keys = ("handshake_ms", "handshake_cpu_ms", "first_reply_ms", "first_reply_cpu_ms")
    try:
        print(f"work folder {work}; load average {load_average()}; {os.cpu_count()} CPUs")
        copies = {"empty": work / "empty"}
        for store in stores:
            copies[Path(store).name] = work / Path(store).name
            shutil.copytree(store, copies[Path(store).name], symlinks=True)
        runs: dict[str, list[dict[str, float]]] = {
            name + label: [] for name in copies for label in servers
        }
        for i in range(starts):
            for name, data_dir in copies.items():
                # source and frozen take turns at going first: neither always starts right
                # after the other's exit
                for label in list(servers)[:: 1 if i % 2 == 0 else -1]:
                    runs[name + label].append(
                        cold_start(data_dir, wait_index=wait_index, serve=servers[label])
                    )
        print(
            f"{'store':>12} {'handshake':>9} {'(cpu)':>7} {'1st reply':>9} {'(cpu)':>7}"
            f" {'1st health':>10} {'later':>7} {'idx ready':>9} {'peak MiB':>8} {'life MiB':>8}"
            "   (ms; medians of the starts; cpu: the server's CPU time so far, /proc)"
        )
        for name, rows in runs.items():
            med = {k: p50([r[k] for r in rows]) for k in rows[0]}
            print(
                f"{name:>12} {med['handshake_ms']:9.0f} {med['handshake_cpu_ms']:7.0f}"
                f" {med['first_reply_ms']:9.0f} {med['first_reply_cpu_ms']:7.0f}"
                f" {med['first_health_ms']:10.1f} {med['later_health_ms']:7.1f}"
                f" {med['index_ready_ms']:9.0f} {med['peak_rss_mib']:8.0f}"
                f" {med['peak_rss_life_mib']:8.0f}"
            )
            spread = ", ".join(
                f"{k} {min(r[k] for r in rows):.0f}-{max(r[k] for r in rows):.0f}" for k in keys
            )
            print(f"{'':>12} ranges: {spread}")
            figures[name] = {"median": med, "runs": rows}
        for name in copies if frozen else ():
            ratios = ", ".join(
                f"{k} {figures[name + ' frozen']['median'][k] / figures[name]['median'][k]:.2f}"
                for k in keys
            )
            print(f"{name:>12} frozen / source: {ratios}")
        figures["machine"]["load_after"] = load_average()
        print(f"load average after: {load_average()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if out:
        Path(out).write_text(json.dumps(figures, indent=1))
    return 0


# ---- 4. the app with N hosts through shims --------------------------------------------------


async def _drive(
    params: Any, n: int, warm: tuple[str, dict[str, Any]], write: Any, go: Path
) -> dict[str, Any]:
    """One SDK client on `params`: warm up with one call, say "ready", wait for `go`, then
    make `n` writes (`write(i)` gives the tool, its arguments and the id it acknowledges)."""
    from mcp.client import Client
    from mcp.client.stdio import stdio_client

    latencies: list[float] = []
    acknowledged: list[str] = []
    load_corpus()  # loaded before the clock starts
    with open(os.devnull, "w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            await client.call_tool(*warm)  # connected and warm
            print("ready", flush=True)
            while not go.exists():
                time.sleep(0.005)
            began = time.perf_counter()
            cpu_began, child_began = time.process_time(), children_cpu_seconds(os.getpid())
            for i in range(n):
                tool, args, ack = write(i)
                t = time.perf_counter()
                result = await client.call_tool(tool, args)
                latencies.append((time.perf_counter() - t) * 1000)
                if not result.is_error:
                    acknowledged.append(ack(result))
            ended = time.perf_counter()
            client_cpu = time.process_time() - cpu_began
            child_cpu = children_cpu_seconds(os.getpid()) - child_began
    return {
        "latencies": latencies,
        "acknowledged": acknowledged,
        "began": began,
        "ended": ended,
        "client_cpu_s": client_cpu,  # the SDK client (the host's side), while it wrote
        "child_cpu_s": child_cpu,  # the process it talks to: the shim (or the peer server)
    }


async def _worker(command: list[str], n: int, tag: str, go: Path) -> dict[str, Any]:
    """A host writing to ConvMem (through the shim or `convmem serve`)."""
    from mcp.client.stdio import StdioServerParameters

    def message_id(result: Any) -> str:
        return str(json.loads(result.content[0].text)["message"]["message_id"])

    def write(i: int) -> tuple[str, dict[str, Any], Any]:
        return "write_message", write_args(i, tag), message_id

    params = StdioServerParameters(
        command=command[0], args=command[1:], env=child_env(), cwd=tree_root()
    )
    return await _drive(params, n, ("get_system_health", {}), write, go)


async def _peer_worker(command: list[str], n: int, tag: str, go: Path) -> dict[str, Any]:
    """A host writing to the reference memory server: one entity per message; the last word
    of `command` is its memory file."""
    from mcp.client.stdio import StdioServerParameters

    def write(i: int) -> tuple[str, dict[str, Any], Any]:
        _, _, content = load_corpus()[i * 37 % len(load_corpus())]
        name = f"{tag}-{i}"
        entity = {"name": name, "entityType": "message", "observations": [content]}
        return "create_entities", {"entities": [entity]}, lambda _result: name

    env = child_env()
    env["MEMORY_FILE_PATH"] = command[-1]
    params = StdioServerParameters(command=command[0], args=command[1:-1], env=env)
    return await _drive(params, n, ("read_graph", {}), write, go)


def _lean_worker(command: list[str], n: int, tag: str, go: Path) -> dict[str, Any]:
    """A host whose client costs next to nothing: JSON-RPC lines written and read with the
    standard library over the same shim (or server) process the SDK client would start, one
    call at a time. What 8 of them get against 1 is what the app and the shim allow, without
    the SDK client's own CPU (section 4 with --lean-hosts)."""
    load_corpus()  # loaded before the clock starts
    process = spawn_stdio(command)
    assert process.stdin is not None and process.stdout is not None
    stdin, stdout = process.stdin, process.stdout

    def call(request: bytes, want_id: int) -> dict[str, Any]:
        stdin.write(request)
        stdin.flush()
        return read_answer(stdout, want_id)

    latencies: list[float] = []
    acknowledged: list[str] = []
    try:
        call(INITIALIZE, 1)
        stdin.write(INITIALIZED)
        call(health_call(2), 2)  # connected and warm
        print("ready", flush=True)
        while not go.exists():
            time.sleep(0.005)
        began = time.perf_counter()
        cpu_began, child_began = time.process_time(), children_cpu_seconds(os.getpid())
        for i in range(n):
            request = rpc(
                i + 3, "tools/call", {"name": "write_message", "arguments": write_args(i, tag)}
            )
            t = time.perf_counter()
            answer = call(request, i + 3)
            latencies.append((time.perf_counter() - t) * 1000)
            result = answer.get("result") or {}
            if not result.get("isError", True):
                text = result["content"][0]["text"]
                acknowledged.append(str(json.loads(text)["message"]["message_id"]))
        ended = time.perf_counter()
        client_cpu = time.process_time() - cpu_began
        child_cpu = children_cpu_seconds(os.getpid()) - child_began
    finally:
        stdin.close()
        process.wait(60)
        stdout.close()
    return {
        "latencies": latencies,
        "acknowledged": acknowledged,
        "began": began,
        "ended": ended,
        "client_cpu_s": client_cpu,
        "child_cpu_s": child_cpu,
    }


def worker_main(kind: str, command: list[str], n: int, tag: str, go: str, out: str) -> int:
    if kind == "lean":
        Path(out).write_text(json.dumps(_lean_worker(command, n, tag, Path(go))))
        return 0
    import anyio

    run = _worker if kind == "convmem" else _peer_worker
    result = anyio.run(run, command, n, tag, Path(go))
    Path(out).write_text(json.dumps(result))
    return 0


def run_clients(
    kind: str,
    command: list[str],
    clients: int,
    per_client: int,
    work: Path,
    on_go: Any = None,
) -> list[dict[str, Any]]:
    """`clients` worker processes, each one SDK client on its own server/shim process, all
    released at once; their latencies, acknowledged ids and start/end times. `on_go()` runs
    just before they are released and its result's `close()` once they have all finished."""
    go = work / f"go-{kind}-{clients}"
    go.unlink(missing_ok=True)
    workers = []
    worker = [PY, __file__, "--worker", kind]
    for c in range(clients):
        out = work / f"result-{kind}-{clients}-{c}.json"
        tag = f"c{clients}w{c}"
        workers.append(
            (
                subprocess.Popen(
                    [*worker, tag, str(per_client), str(go), str(out), "--", *command],
                    stdout=subprocess.PIPE,
                    env=child_env(),
                    text=True,
                ),
                out,
            )
        )
    for process, _ in workers:
        assert process.stdout is not None
        line = process.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"a {kind} worker did not start")
    watch = on_go() if on_go is not None else None
    go.touch()
    results = []
    for process, out in workers:
        assert process.stdout is not None
        process.stdout.read()
        process.stdout.close()
        if process.wait(600) != 0:
            raise RuntimeError(f"a {kind} worker failed")
        results.append(json.loads(out.read_text()))
    if watch is not None:
        watch.close()
    return results


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of each live thread of `pid`, summed by thread name (digits dropped); the
    main thread (the app's Qt thread) is "main", Python's own threads (no OS name: the engine
    loop, tool workers) are "python"."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip().rstrip("0123456789_")
            name = "main" if task.name == str(pid) else name
            used = _task_cpu(task)
        except OSError:
            continue
        out[name] = out.get(name, 0.0) + used
    return out


def _task_cpu(task: Path) -> float:
    fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scheduling(pid: int) -> tuple[float, float, int]:
    """User CPU seconds, kernel CPU seconds and context switches (voluntary and not) of every
    live thread of `pid`."""
    user = kernel = 0.0
    switches = 0
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            status = (task / "status").read_text()
        except OSError:
            continue
        user += int(fields[11]) / tick
        kernel += int(fields[12]) / tick
        switches += sum(
            int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line
        )
    return user, kernel, switches


TRAY_APP: Final = """import sys
from PySide6.QtWidgets import QSystemTrayIcon
QSystemTrayIcon.isSystemTrayAvailable = staticmethod(lambda: True)
from convmem_app.cli import main
sys.exit(main(sys.argv[1:]))
"""
"""`convmem app` believing the desktop has a system tray (offscreen has none), as a user's
app started at login runs: `--minimized` then opens no window until asked."""

APP_STILL_S: Final = 1.0
"""The app's work is counted until its CPU stands still this long (no 10 ms tick in it):
work it defers (a batch delivered by a timer, health refreshed after writes pause) is in."""


class _AppWatch:
    """The app's CPU seconds, per thread too (and optionally a py-spy profile), from just
    before the workers start writing until the app's CPU stands still after they finished."""

    def __init__(self, pid: int, profile: Path | None, gil: bool = False) -> None:
        self.pid = pid
        self.load = load_average()
        self.cpu_before = cpu_seconds(pid)
        self.threads_before = thread_cpu_seconds(pid)
        self.scheduling_before = scheduling(pid)
        self.scheduling = (0.0, 0.0, 0)  # user s, kernel s, context switches in the window
        self.began = time.monotonic()
        self.cpu = 0.0
        self.deferred = 0.0  # CPU after the last worker finished
        self.seconds = 0.0  # how long the window was open
        self.threads: dict[str, float] = {}
        self.spy: subprocess.Popen[bytes] | None = None
        if profile is not None:
            spy = [str(Path(PY).parent / "py-spy"), "record", "--threads", "-r", "500"]
            spy += ["--gil"] if gil else []
            spy += ["-p", str(pid), "-f", "raw", "-o", str(profile)]
            self.spy = subprocess.Popen(spy, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # attached before the first write

    def close(self) -> None:
        ended = cpu_seconds(self.pid)
        if self.spy is not None:
            self.spy.send_signal(2)  # SIGINT: py-spy writes its profile and exits
            self.spy.wait(60)
        wait_cpu_still(lambda: cpu_seconds(self.pid), still=APP_STILL_S, slack=0.001)
        self.seconds = time.monotonic() - self.began
        self.cpu = cpu_seconds(self.pid) - self.cpu_before
        self.deferred = self.cpu - (ended - self.cpu_before)
        after = thread_cpu_seconds(self.pid)
        now = scheduling(self.pid)
        user, kernel, switches = (a - b for a, b in zip(now, self.scheduling_before, strict=True))
        self.scheduling = (user, kernel, int(switches))
        self.threads = {
            name: used - self.threads_before.get(name, 0.0) for name, used in after.items()
        }


def idle_cpu_ms_per_s(pid: int, seconds: float) -> float:
    """The app's CPU while no host writes (its timers), ms per second, once it stands still."""
    wait_cpu_still(lambda: cpu_seconds(pid), still=APP_STILL_S, slack=0.001)
    cpu, began = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - cpu) * 1000 / (time.monotonic() - began)


def summarise_clients(results: list[dict[str, Any]]) -> dict[str, float]:
    latencies = [x for r in results for x in r["latencies"]]
    acknowledged = sum(len(r["acknowledged"]) for r in results)
    began = min(r["began"] for r in results)
    ended = max(r["ended"] for r in results)
    calls = sum(len(r["latencies"]) for r in results)
    return {
        "client_cpu_ms_per_call": sum(r["client_cpu_s"] for r in results) * 1000 / calls,
        "child_cpu_ms_per_call": sum(r["child_cpu_s"] for r in results) * 1000 / calls,
        "writes_per_s": acknowledged / (ended - began),
        "p50_ms": p50(latencies),
        "p99_ms": pct(latencies, 0.99),
        "acknowledged": acknowledged,
    }


def read_back_convmem(data_dir: Path, results: list[dict[str, Any]]) -> int:
    """How many acknowledged ids the app's store holds (read through a shim, like a host)."""
    import anyio
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    wanted = {i for r in results for i in r["acknowledged"]}

    async def run() -> int:
        params = StdioServerParameters(
            command=PY,
            args=["-m", "convmem_app", "shim", "--data-dir", str(data_dir)],
            env=child_env(),
            cwd=tree_root(),
        )
        found = 0
        with open(os.devnull, "w") as errlog:
            async with Client(stdio_client(params, errlog=errlog)) as client:
                for message_id in wanted:
                    args = {"view": "content", "message_id": message_id}
                    result = await client.call_tool("read_messages", args)
                    found += not result.is_error
        return found

    return anyio.run(run)


def print_app(by_tree: dict[str, dict[int, dict[str, Any]]], counts: list[int]) -> None:
    for name, app in by_tree.items():
        first = next(iter(app.values()), {})
        print(
            f"[{name}] idle {first.get('idle_ms_per_s', float('nan')):.2f} ms CPU/s,"
            f" window visible: {first.get('window_visible')}"
        )
        one = app[counts[0]]["writes_per_s"] if counts else float("nan")
        print(
            f"{'hosts':>5} {'load':>5} {'writes/s':>9} {'x 1 host':>8} {'p50 ms':>7}"
            f" {'p99 ms':>7} {'acked':>6} {'read back':>9}   CPU ms per call: app  shim  client"
        )
        for clients, r in app.items():
            print(
                f"{clients:5d} {r['load']:5.2f} {r['writes_per_s']:9.0f}"
                f" {r['writes_per_s'] / one:8.2f} {r['p50_ms']:7.2f} {r['p99_ms']:7.2f}"
                f" {r['acknowledged']:6.0f} {r['read_back']:9.0f}"
                f" {r['app_cpu_ms_per_call']:21.3f} {r['child_cpu_ms_per_call']:5.3f}"
                f" {r['client_cpu_ms_per_call']:7.3f}"
            )
            threads = sorted(
                ((k.split(":", 1)[1], v) for k, v in r.items() if k.startswith("app_thread")),
                key=lambda item: -item[1],
            )
            print(
                "      app threads, ms/call: "
                + ", ".join(f"{k} {v:.3f}" for k, v in threads)
                + f"; user {r['app_user_ms_per_call']:.3f}, kernel"
                f" {r['app_kernel_ms_per_call']:.3f}; context switches per call"
                f" {r['app_switches_per_call']:.2f}"
            )
            rounds = ", ".join(f"{x:.3f}" for x in r["rounds_app_cpu_ms_per_call"])
            print(
                f"      app less idle {r['app_cpu_less_idle_ms_per_call']:.3f}, of it after the"
                f" last write {r['app_deferred_ms_per_call']:.3f}; rounds: {rounds}"
                f" (median {r['median_app_cpu_ms_per_call']:.3f})"
            )
            if "disk_flushes_per_write" in r:
                print(
                    f"      the disk's flushes per acknowledged write: "
                    f"{r['disk_flushes_per_write']:.2f} (counted for the whole device: "
                    "anything else writing to it meanwhile adds to the count)"
                )
        if counts and len(app) > 1:
            print_ceiling(app, counts[0])


def cpu_ms_per_call(row: dict[str, Any]) -> float:
    """Every process's CPU per call: the app's, the shims' and the hosts' clients'."""
    return float(
        row["app_cpu_ms_per_call"] + row["child_cpu_ms_per_call"] + row["client_cpu_ms_per_call"]
    )


def ceiling(one: dict[str, Any], many: dict[str, Any], hosts: int, cpus: int) -> float:
    """The most N hosts' throughput can be of one host's on this machine, measured: N hosts
    can at best keep every CPU busy, at the CPU a call costs all processes with N hosts,
    while one host's calls follow each other, each taking its round trip (1 / its rate).
    So N / 1 <= cpus x round trip / CPU per call (and <= N)."""
    round_trip_ms = 1000.0 / one["writes_per_s"]
    return min(float(hosts), cpus * round_trip_ms / cpu_ms_per_call(many))


def print_ceiling(app: dict[int, dict[str, Any]], first: int) -> None:
    """What the machine allows for N hosts ÷ 1 (`ceiling`), beside what the run gave."""
    cpus = os.cpu_count() or 1
    one = app[first]
    round_trip = 1000.0 / one["writes_per_s"]
    waiting = max(0.0, 1.0 - cpu_ms_per_call(one) / round_trip)
    print(
        f"      one host: round trip {round_trip:.3f} ms, CPU per call (all processes)"
        f" {cpu_ms_per_call(one):.3f} ms: {100 * waiting:.0f}% of the round trip waits"
        f" (the rest is CPU, in series)"
    )
    for hosts, row in app.items():
        if hosts == first:
            continue
        got = row["writes_per_s"] / one["writes_per_s"]
        print(
            f"      {hosts} hosts: {got:.2f}x one host; the most {cpus} CPUs allow at"
            f" {cpu_ms_per_call(row):.3f} ms of CPU per call: {ceiling(one, row, hosts, cpus):.2f}x"
        )


def disk_flushes(path: Path) -> int | None:
    """Flush requests the block device holding `path` has completed (Linux's
    /sys/dev/block/MAJ:MIN/stat, field 16; None where there is no such device or field, e.g.
    tmpfs). Each fsync that reaches a disk with a write-back cache ends in at least one; the
    count is the device's, so anything else writing meanwhile adds to it."""
    try:
        device = os.stat(path).st_dev
        stat = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}/stat").read_text()
    except OSError:
        return None
    fields = stat.split()
    return int(fields[15]) if len(fields) > 15 else None


def app_clients(
    work: Path,
    counts: list[int],
    per_client: int,
    profile_dir: Path | None = None,
    profile_gil: bool = False,
    trees: dict[str, Path] | None = None,
    rounds: int = 1,
    idle_seconds: float = 5.0,
    tray: bool = False,
    host: str = "convmem",
    tray_trees: frozenset[str] = frozenset(),
) -> dict[str, dict[int, dict[str, Any]]]:
    """One app per tree (default: this one), each driven by 1/8/16 hosts in turn; with several
    trees and rounds the apps take turns (the order reversed every round), so each sees the
    same machine. Per tree and count: the median round's figures, every round's app CPU.
    `host`: "convmem" (each host the SDK client) or "lean" (`_lean_worker`). The apps of
    `tray_trees` (all with `tray`) start as tray apps (no window), the others show their
    window: the same tree under two names, one of them a tray app, measures what the window
    costs."""
    sys.path.insert(0, str(ROOT / "tests" / "app"))
    from app_helpers import control

    trees = trees or {"this": ROOT}
    apps: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    logs = []
    out: dict[str, dict[int, dict[str, Any]]] = {name: {} for name in trees}
    try:
        for name, tree in trees.items():
            data_dir = work / f"app-{name}"
            logs.append((work / f"app-{name}.log").open("wb"))
            start = ["-c", TRAY_APP] if tray or name in tray_trees else ["-m", "convmem_app"]
            apps[name] = (
                subprocess.Popen(
                    [PY, *start, "app", "--minimized", "--data-dir", str(data_dir)],
                    stdin=subprocess.DEVNULL,
                    stdout=logs[-1],
                    stderr=logs[-1],
                    env=child_env(tree),
                    cwd=tree,
                ),
                data_dir,
            )
        idle: dict[str, float] = {}
        window: dict[str, object] = {}
        for name, (_app, data_dir) in apps.items():
            deadline = time.monotonic() + 120
            while (status := control(data_dir, "status") or {}).get("state") != "running":
                if time.monotonic() > deadline:
                    raise SystemExit(f"the {name} app did not start")
                time.sleep(0.05)
            window[name] = status.get("window_visible")
        for name, (app, data_dir) in apps.items():
            # a first round, not counted: the store's first writes, the app's first calls
            os.environ[TREE_VARIABLE] = str(trees[name])
            try:
                shim = [PY, "-m", "convmem_app", "shim", "--data-dir", str(data_dir)]
                run_clients(host, shim, 1, min(per_client, 300), work)
            finally:
                os.environ.pop(TREE_VARIABLE, None)
            idle[name] = idle_cpu_ms_per_s(app.pid, idle_seconds)
        for clients in counts:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in apps}
            for r in range(rounds):
                order = list(apps) if r % 2 == 0 else list(reversed(apps))
                for name in order:
                    app, data_dir = apps[name]
                    shim = [PY, "-m", "convmem_app", "shim", "--data-dir", str(data_dir)]
                    watches: list[_AppWatch] = []

                    def watch(
                        pid: int = app.pid,
                        tag: str = f"{name}-{clients}-hosts-{r}",
                        watches: list[_AppWatch] = watches,
                    ) -> _AppWatch:
                        profile = None
                        if profile_dir is not None:
                            profile = profile_dir / f"app-{tag}.txt"
                        watches.append(_AppWatch(pid, profile, profile_gil))
                        return watches[-1]

                    os.environ[TREE_VARIABLE] = str(trees[name])  # the workers' shims
                    flushes = disk_flushes(data_dir)
                    try:
                        results = run_clients(host, shim, clients, per_client, work, on_go=watch)
                    finally:
                        os.environ.pop(TREE_VARIABLE, None)
                    flushed = disk_flushes(data_dir)
                    row = summarise_clients(results)
                    calls = sum(len(r["latencies"]) for r in results)
                    if flushes is not None and flushed is not None:
                        row["disk_flushes_per_write"] = (flushed - flushes) / calls
                    w = watches[0]
                    row["app_cpu_ms_per_call"] = w.cpu * 1000 / calls
                    # the app's idle rate over the same window, taken off
                    row["app_cpu_less_idle_ms_per_call"] = (
                        w.cpu * 1000 - idle[name] * w.seconds
                    ) / calls
                    row["app_deferred_ms_per_call"] = w.deferred * 1000 / calls
                    row["app_user_ms_per_call"] = w.scheduling[0] * 1000 / calls
                    row["app_kernel_ms_per_call"] = w.scheduling[1] * 1000 / calls
                    row["app_switches_per_call"] = w.scheduling[2] / calls
                    for thread, used in w.threads.items():
                        if used > 0:
                            row[f"app_thread_ms_per_call:{thread}"] = used * 1000 / calls
                    row["load"] = float(w.load)
                    row["calls"] = calls
                    row["read_back"] = read_back_convmem(data_dir, results) if r == 0 else -1
                    runs[name].append(row)
            for name, rows in runs.items():
                middle = sorted(rows, key=lambda x: x["app_cpu_ms_per_call"])[len(rows) // 2]
                out[name][clients] = {
                    **middle,
                    "median_app_cpu_ms_per_call": p50([x["app_cpu_ms_per_call"] for x in rows]),
                    "read_back": rows[0]["read_back"],  # counted in the first round only
                    "rounds_app_cpu_ms_per_call": [x["app_cpu_ms_per_call"] for x in rows],
                    "idle_ms_per_s": idle[name],
                    "window_visible": window[name],
                }
    finally:
        for _app, data_dir in apps.values():
            control(data_dir, "quit")
        for app, _ in apps.values():
            app.wait(60)
        for log in logs:
            log.close()
    for rows in out.values():
        if counts and counts[0] in rows:
            for hosts, row in rows.items():
                row["ceiling_x"] = ceiling(rows[counts[0]], row, hosts, os.cpu_count() or 1)
    return out


# ---- 5. the reference memory server from npm ------------------------------------------------


def fts_section(work: Path, sizes: list[int], figures: dict[str, Any]) -> None:
    """Section 6: our search index against SQLite FTS5 in process, on the same texts."""
    print("\n6. SQLite FTS5 (trigram), in process, the same texts (bench_search.py, 5 runs each)")
    print("   messages  build CPU s: ours   FTS5  ratio   median ms: ours   FTS5  ratio   worst ms")
    figures["fts5"] = {}
    for size in sizes:
        out = work / f"fts-{size}.json"
        command = [sys.executable, str(Path(tree_root()) / "bench" / "bench_search.py")]
        command += ["--messages", str(size), "--repeat", "5", "--summary-json", str(out)]
        subprocess.run(command, check=True, cwd=tree_root(), stdout=subprocess.DEVNULL)
        row = json.loads(out.read_text())
        figures["fts5"][size] = row
        build, median = row["build_cpu_s"], row["median_ms"]
        print(
            f"   {row['messages']:8d}  {build['ours']:17.2f} {build['fts5']:6.2f} "
            f"{build['ours'] / build['fts5']:6.2f}   {median['ours']:15.2f} "
            f"{median['fts5']:6.2f} {median['ours'] / median['fts5']:6.2f}   "
            f"{row['worst_ms']:8.2f} ({row['worst_query']})"
        )


def install_peer(work: Path) -> list[str] | None:
    folder = work / "npm-peer"
    folder.mkdir()
    npm = shutil.which("npm")
    node = shutil.which("node")
    if npm is None or node is None:
        return None
    done = subprocess.run(
        [npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(folder), NPM_PEER],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        print(f"(peer not installed: {done.stderr.strip()[:200]})")
        return None
    package = folder / "node_modules" / "@modelcontextprotocol" / "server-memory"
    entry = package / "dist" / "index.js"
    return [node, str(entry)]


def peer_figures(work: Path, command: list[str], per_client: int) -> dict[str, Any]:
    one_file = work / "peer-one.jsonl"
    single = summarise_clients(run_clients("peer", [*command, str(one_file)], 1, per_client, work))
    shared_file = work / "peer-shared.jsonl"
    results = run_clients("peer", [*command, str(shared_file)], 8, per_client, work)
    eight = summarise_clients(results)
    names = set()
    if shared_file.exists():
        for line in shared_file.read_text().splitlines():
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            if item.get("type") == "entity":
                names.add(item.get("name"))
    acknowledged = {n for r in results for n in r["acknowledged"]}
    eight["read_back"] = len(acknowledged & names)
    return {"single": single, "eight": eight}


# ---- the run --------------------------------------------------------------------------------


def stdio_sections(work: Path, args: argparse.Namespace, figures: dict[str, Any]) -> None:
    """Sections 1-3: the fsync floor, `convmem serve` over stdio and its cold starts."""
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.million:
        sizes.append(1_000_000)
    floor = fsync_floor(work, args.writes)
    figures["fsync_floor"] = {"p50_ms": p50(floor), "p99_ms": pct(floor, 0.99)}
    print(f"\n1. fsync floor: p50 {p50(floor):.3f} ms, p99 {pct(floor, 0.99):.3f} ms")

    print("\n2/3. convmem serve over stdio, by store size")
    header = (
        f"{'messages':>9} {'build s':>8} {'handshake':>9} {'1st reply':>9} {'1st health':>10}"
        f" {'2nd health':>10} {'idx ready':>9} {'peak MiB':>8} {'life MiB':>8} {'write p50':>9}"
        f" {'p99':>7}"
    )
    print(header + "   (ms unless stated; restart: a second start, search.idx loaded)")
    stores: dict[int, dict[str, float]] = {}
    empty = work / "empty"
    empty_writes = stdio_writes(empty, args.writes)
    stores[0] = {
        "write_p50_ms": p50(empty_writes),
        "write_p99_ms": pct(empty_writes, 0.99),
        **cold_start(work / "empty-cold"),
    }
    for size in [0, *sizes]:
        if size:
            data_dir = work / f"store-{size}"
            built = build_store(data_dir, size)
            row = {"build_s": built, **cold_start(data_dir)}
            # A restart: the first serve wrote search.idx at its clean close.
            again = cold_start(data_dir)
            row["restart_first_reply_ms"] = again["first_reply_ms"]
            row["restart_index_ready_ms"] = again["index_ready_ms"]
            row["restart_peak_rss_mib"] = again["peak_rss_mib"]
            row["restart_peak_rss_life_mib"] = again["peak_rss_life_mib"]
            row["restart_estimate_total_mib"] = again["estimate_total_mib"]
            row["restart_estimate_search_index_mib"] = again["estimate_search_index_mib"]
            writes = stdio_writes(data_dir, args.writes)
            row["write_p50_ms"] = p50(writes)
            row["write_p99_ms"] = pct(writes, 0.99)
            stores[size] = row
            shutil.rmtree(data_dir)
        r = stores[size]
        print(
            f"{size:9d} {r.get('build_s', 0):8.1f} {r['handshake_ms']:9.0f}"
            f" {r['first_reply_ms']:9.0f} {r['first_health_ms']:10.1f}"
            f" {r['later_health_ms']:10.2f} {r['index_ready_ms']:9.0f}"
            f" {r['peak_rss_mib']:8.0f} {r['peak_rss_life_mib']:8.0f} {r['write_p50_ms']:9.2f}"
            f" {r['write_p99_ms']:7.2f}"
        )
        if "restart_index_ready_ms" in r:
            print(
                f"{'restart':>9} {'':8} {'':9} {r['restart_first_reply_ms']:9.0f} {'':10}"
                f" {'':10} {r['restart_index_ready_ms']:9.0f} {r['restart_peak_rss_mib']:8.0f}"
                f" {r['restart_peak_rss_life_mib']:8.0f}"
            )
            print(
                f"{'':9} health's memory_estimate: total / search index MiB "
                f"{r['estimate_total_mib']:.0f} / "
                f"{r['estimate_search_index_mib']:.0f} (built), "
                f"{r['restart_estimate_total_mib']:.0f} / "
                f"{r['restart_estimate_search_index_mib']:.0f} (loaded)"
            )
    figures["stores"] = stores
    print(
        f"   write p50 on the empty store / fsync floor: "
        f"{stores[0]['write_p50_ms'] / figures['fsync_floor']['p50_ms']:.1f}x"
    )


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        kind, tag, n, go, out, dash, *command = sys.argv[2:]
        assert dash == "--"
        return worker_main(kind, command, int(n), tag, go, out)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,100000,258145")
    parser.add_argument("--million", action="store_true", help="also 1,000,000 messages")
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--clients", default="1,8,16")
    parser.add_argument("--per-client", type=int, default=150)
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--no-fts", action="store_true", help="skip section 6 (SQLite FTS5)")
    parser.add_argument(
        "--plots", default="", metavar="DIR", help="also draw this run's plots there (plot_mcp.py)"
    )
    parser.add_argument("--dir", default=None, help="where to work (default: a temp folder)")
    parser.add_argument("--json", default=None, help="write every figure to this file")
    parser.add_argument(
        "--cold-stores", default="", help="cold start only, on copies of these store dirs"
    )
    parser.add_argument("--starts", type=int, default=5, help="cold starts per store")
    parser.add_argument(
        "--frozen",
        default="",
        help="with --cold-stores: also start this PyInstaller dist folder's convmem-cli serve",
    )
    parser.add_argument(
        "--no-index-wait", action="store_true", help="with --cold-stores: skip 'index ready'"
    )
    parser.add_argument(
        "--app-only", action="store_true", help="only section 4 (the app with N hosts)"
    )
    parser.add_argument(
        "--profile-app",
        default=None,
        metavar="DIR",
        help="record a py-spy profile (raw) of the app per host count into DIR "
        "(needs py-spy in this environment)",
    )
    parser.add_argument(
        "--profile-gil",
        action="store_true",
        help="profile only the thread holding the GIL (py-spy --gil) instead of --idle",
    )
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="section 4: an app from this ConvMem tree (repeat for an A/B; the apps take turns)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="section 4: turns per host count")
    parser.add_argument(
        "--tray",
        action="store_true",
        help="section 4: the app started minimized to a system tray (no window), as at login; "
        "by default offscreen Qt has no tray and the app shows its window",
    )
    parser.add_argument(
        "--lean-hosts",
        action="store_true",
        help="section 4: each host a stdlib JSON-RPC client instead of the SDK client (what "
        "the app and the shim allow without the SDK client's CPU)",
    )
    parser.add_argument(
        "--tray-tree",
        action="append",
        default=[],
        metavar="NAME",
        help="section 4: only the app of --tree NAME starts as a tray app (repeatable); e.g. "
        "--tree window=DIR --tree tray=DIR --tray-tree tray measures what the window costs",
    )
    parser.add_argument(
        "--idle-seconds", type=float, default=5.0, help="section 4: idle CPU window per app"
    )
    args = parser.parse_args()
    for tree in {Path(tree_root()), *(Path(t.split("=", 1)[1]) for t in args.tree or [])}:
        compile_tree(tree)
        print(f"(bytecode of {tree} compiled first, as an installed ConvMem has it)")

    if args.cold_stores:
        stores = args.cold_stores.split(",")
        return cold_stores(
            stores, args.starts, args.dir, args.json, not args.no_index_wait, args.frozen
        )
    counts = [int(c) for c in args.clients.split(",") if c]
    work = Path(tempfile.mkdtemp(prefix="cmbench-mcp-", dir=args.dir))
    figures: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "load_before": load_average(),
        }
    }
    try:
        print(f"work folder {work}; load average {load_average()}; {os.cpu_count()} CPUs")
        if not args.app_only:
            stdio_sections(work, args, figures)

        print(f"\n4. convmem app, N hosts through convmem-shim ({args.per_client} writes each)")
        profile_dir = Path(args.profile_app).resolve() if args.profile_app else None
        trees = {t.split("=", 1)[0]: Path(t.split("=", 1)[1]).resolve() for t in args.tree}
        by_tree = app_clients(
            work,
            counts,
            args.per_client,
            profile_dir,
            args.profile_gil,
            trees or None,
            args.rounds,
            args.idle_seconds,
            args.tray,
            "lean" if args.lean_hosts else "convmem",
            frozenset(args.tray_tree),
        )
        figures["app"] = next(iter(by_tree.values()))
        if len(by_tree) > 1:
            figures["app_trees"] = by_tree
        print_app(by_tree, counts)

        if not args.no_peer and not args.app_only:
            command = install_peer(work)
            if command is not None:
                peer = peer_figures(work, command, args.per_client)
                figures["peer_server_memory"] = peer
                s, e = peer["single"], peer["eight"]
                print(f"\n5. {NPM_PEER} (node, stdio, same client code)")
                print(
                    f"   1 host: write p50 {s['p50_ms']:.2f} ms, p99 {s['p99_ms']:.2f} ms "
                    f"(convmem serve: {figures['stores'][0]['write_p50_ms']:.2f} ms; ratio "
                    f"{figures['stores'][0]['write_p50_ms'] / s['p50_ms']:.2f})"
                )
                print(
                    f"   8 hosts on one memory file: {e['acknowledged']:.0f} acknowledged, "
                    f"{e['read_back']:.0f} still there "
                    f"({e['acknowledged'] - e['read_back']:.0f} lost)"
                )
        if not args.no_fts and not args.app_only:
            fts_section(work, [258_145, 1_000_000] if args.million else [258_145], figures)
        figures["machine"]["load_after"] = load_average()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    if args.plots and not args.app_only:
        from plot_mcp import main as plot

        with tempfile.TemporaryDirectory() as folder:
            path = Path(args.json) if args.json else Path(folder) / "figures.json"
            if not args.json:
                path.write_text(json.dumps(figures, indent=1))
            plot(str(path), args.plots)
        print(f"plots drawn in {args.plots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
