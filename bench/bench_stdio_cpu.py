"""Server CPU per `write_message` over stdio, with and without the `tools/call` fast path.

One run, side by side: the fsync floor (raw write + fsync of corpus records in the same
folder, 200 right before each server run), then `convmem serve` on a fresh data dir driven by
a raw JSON-RPC line client (one request at a time, so the client adds no queueing): the
server's CPU per write (utime + stime from /proc, its threads included) and the round-trip
p50/p99. Each mode runs `--rounds` times,
alternating, so all see the same machine load; the table gives the median run and the best run
(CPU time is inflated by contention on a loaded machine: the best run is the closest to the
code's own cost).

Usage: python bench/bench_stdio_cpu.py [--writes 1000] [--rounds 2] [--era handshake|modern]
       [--modes fast,sdk] [--before DIR] [--client raw|sdk] [--dir DIR] [--json OUT]
Linux only (reads /proc). `sdk` is the same server with CONVMEM_MCP_FAST_PATH=0; `--before DIR`
adds mode `before`: the server of another checkout (e.g. `git archive` of an older commit)
run by the same interpreter, in the same rounds. `--client sdk` drives the server with the
official SDK client instead (`mcp.client.Client` over `stdio_client`, the 2026-07-28 era, as
bench_mcp.py's stdio figures do) and also reports the client's own CPU per call: the part of
the round trip that is the host's. `--dir` puts the data dirs (and the fsync floor's file)
there, e.g. on a tmpfs to take a shared disk's noise out of a CPU comparison.

Size A/B (`--stores empty,/tmp/s5/258k,/tmp/s5/1m`, issue 13's "write p50 flat to 1M"): the
modes are stores instead of servers, all served by this tree's fast path with the SDK client.
Each run copies its store (`cp -a`; `empty` is a new data dir) into the work folder, syncs the
file system (the copy's dirty pages would otherwise be written back during the run and slow its
fsyncs), starts `convmem serve`, waits until health says the search index is ready and the
server stands still, and only then writes: the same writes, in the same rounds, the order
turning every round. The table adds each store's p50 and CPU against the empty store's of the
same round (median of the rounds' ratios). With `--before DIR` each store is served by both
trees in the same rounds (modes `STORE` and `STORE@before`). `--py-spy DIR` records each
measured window with py-spy (the server's threads, on-CPU samples) into DIR/MODE-ROUND.txt
(collapsed stacks).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_mcp import (
    child_env,
    cpu_seconds,
    fsync_floor,
    load_average,
    p50,
    pct,
    rpc,
    wait_cpu_still,
    write_args,
)

PY = sys.executable
FLUSHED = 0.1
"""Seconds waited after the last reply before the server's CPU is read: its background
search-index flush (10 ms after a write) has applied the last batch, so no deferred work is
left out of the window."""
ROOT = str(Path(__file__).resolve().parent.parent)
FLOOR_WRITES = 200
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
}


def run_serve(
    data_dir: Path, n: int, era: str, fast: bool, root: str | None = None
) -> dict[str, float]:
    env = child_env()
    env["CONVMEM_MCP_FAST_PATH"] = "1" if fast else "0"
    if root is not None:
        env["PYTHONPATH"] = root
    process = subprocess.Popen(
        [PY, "-m", "convmem_app", "serve", "--data-dir", str(data_dir)],
        cwd=root or ROOT,  # `-m` puts the working directory first on sys.path
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert process.stdin is not None and process.stdout is not None
    stdin, stdout = process.stdin, process.stdout

    def call(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        stdin.write(rpc(request_id, method, params))
        stdin.flush()
        answer: dict[str, Any] = json.loads(stdout.readline())
        assert answer.get("id") == request_id, answer
        return answer

    def write(i: int) -> dict[str, Any]:
        params: dict[str, Any] = {"name": "write_message", "arguments": write_args(i, "cpu")}
        if era == "modern":
            params["_meta"] = MODERN_META
        return call(i + 10, "tools/call", params)

    try:
        if era == "modern":
            call(1, "server/discover", {"_meta": MODERN_META})
        else:
            init = {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "bench", "version": "0"},
            }
            call(1, "initialize", init)
            stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        for i in range(50):  # warm up
            assert "result" in write(i)
        # the front answered the first calls while the SDK and the runtime loaded: wait for them
        wait_cpu_still(lambda: cpu_seconds(process.pid))
        write(50)  # (served by the runtime now)
        latencies = []
        cpu0 = cpu_seconds(process.pid)
        for i in range(50, 50 + n):
            t = time.perf_counter()
            answer = write(i)
            latencies.append((time.perf_counter() - t) * 1000)
            # (the corpus has a few empty messages: refused, as they must be)
            assert not answer["result"].get("isError") or not write_args(i, "cpu")["content"]
        time.sleep(FLUSHED)
        cpu = cpu_seconds(process.pid) - cpu0
    finally:
        stdin.close()
        stdout.read()
        process.wait(60)
    return {
        "cpu_ms_per_write": cpu * 1000 / n,
        "p50_ms": p50(latencies),
        "p99_ms": pct(latencies, 0.99),
    }


def run_serve_sdk(
    data_dir: Path,
    n: int,
    fast: bool,
    root: str | None = None,
    *,
    wait_index: bool = False,
    profile: Path | None = None,
) -> dict[str, float]:
    """`run_serve` with the official SDK client (its era, 2026-07-28), in this process.
    `wait_index`: first poll `get_system_health` until the search index is ready (a store
    that has messages loads or builds it in the background). `profile`: py-spy records the
    server during the measured writes into this file (collapsed stacks)."""
    import anyio
    from bench_mcp import children_cpu_seconds

    async def index_ready(client: Any) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            result = await client.call_tool("get_system_health", {})
            health = json.loads(result.content[0].text)
            if health["active_messages"] == 0 or health["memory_estimate"]["search_index_bytes"]:
                return
            await anyio.sleep(0.05)
        raise RuntimeError("the search index was not ready in 300 s")

    def server_pid(me: int) -> int:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me:
                return int(stat.parent.name)
        raise RuntimeError("no server process")

    async def drive() -> dict[str, float]:
        from mcp.client import Client
        from mcp.client.stdio import StdioServerParameters, stdio_client

        env = child_env()
        env["CONVMEM_MCP_FAST_PATH"] = "1" if fast else "0"
        if root is not None:
            env["PYTHONPATH"] = root
        command = ["-m", "convmem_app", "serve", "--data-dir", str(data_dir)]
        params = StdioServerParameters(command=PY, args=command, env=env, cwd=root or ROOT)
        latencies: list[float] = []
        spy: subprocess.Popen[bytes] | None = None
        with open(os.devnull, "w") as errlog:
            async with Client(stdio_client(params, errlog=errlog)) as client:
                me = os.getpid()
                if wait_index:
                    await index_ready(client)
                    await anyio.to_thread.run_sync(wait_cpu_still, lambda: children_cpu_seconds(me))
                for i in range(50):  # warm up
                    await client.call_tool("write_message", write_args(i, "cpu"))
                await anyio.to_thread.run_sync(wait_cpu_still, lambda: children_cpu_seconds(me))
                await client.call_tool("write_message", write_args(50, "cpu"))
                if profile is not None:
                    spy = subprocess.Popen(
                        [
                            PY_SPY,
                            "record",
                            "--pid",
                            str(server_pid(me)),
                            "--rate",
                            "500",
                            "--format",
                            "raw",
                            "--output",
                            str(profile),
                            "--threads",
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    await anyio.sleep(1.0)  # py-spy attaches
                cpu0, client0 = children_cpu_seconds(me), time.process_time()
                for i in range(50, 50 + n):
                    t = time.perf_counter()
                    result = await client.call_tool("write_message", write_args(i, "cpu"))
                    latencies.append((time.perf_counter() - t) * 1000)
                    assert not result.is_error or not write_args(i, "cpu")["content"], result
                client_cpu = time.process_time() - client0
                await anyio.sleep(FLUSHED)
                cpu = children_cpu_seconds(me) - cpu0
                if spy is not None:
                    spy.send_signal(2)
                    spy.wait(60)
        out = {
            "cpu_ms_per_write": cpu * 1000 / n,
            "client_cpu_ms_per_write": client_cpu * 1000 / n,
            "p50_ms": p50(latencies),
            "p99_ms": pct(latencies, 0.99),
        }
        return out

    return anyio.run(drive)


PY_SPY = os.environ.get("PY_SPY", "/work/main/.venv/bin/py-spy")


def store_mode(store: str) -> str:
    return "empty" if store == "empty" else Path(store).name


def copy_stores(stores: dict[str, str], rounds: int, work: Path) -> None:
    """A fresh copy of each store for each run (`work/MODE-ROUND`; `empty`: nothing there),
    all made before the first run, then the file system synced and its fsyncs left to
    settle: copying (and deleting, on a disk mounted with `discard`) hundreds of MB between
    runs slowed the next run's fsyncs several times over (measured: a floor of 4 ms after a
    1M copy against 0.2 ms), which a per-run copy charges to the big stores only."""
    for r in range(rounds):
        for mode, store in stores.items():
            if store != "empty":
                subprocess.run(["cp", "-a", store, str(work / f"{mode}-{r}")], check=True)
    os.sync()
    best = float("inf")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until the floor stops falling
        floor = p50(fsync_floor(work, FLOOR_WRITES))
        if floor > best * 0.9:
            break
        best = min(best, floor)
        time.sleep(1.0)
    print(f"copies made, synced; fsync floor settled at {best:.3f} ms")


def print_size_ratios(results: dict[str, list[dict[str, float]]]) -> None:
    """Each store's p50 and CPU per write against the empty store's in the same round."""
    if "empty" not in results:
        return
    print("| store | p50 / empty's (rounds' median, min-max) | CPU per write / empty's |")
    print("|---|---|---|")
    for mode, runs in results.items():
        empty = results["empty@before" if mode.endswith("@before") else "empty"]
        if mode.startswith("empty"):
            continue
        lat = [run["p50_ms"] / base["p50_ms"] for run, base in zip(runs, empty, strict=True)]
        cpu = [
            run["cpu_ms_per_write"] / base["cpu_ms_per_write"]
            for run, base in zip(runs, empty, strict=True)
        ]
        print(
            f"| {mode} | {p50(lat):.2f}x ({min(lat):.2f}-{max(lat):.2f}) "
            f"| {p50(cpu):.2f}x ({min(cpu):.2f}-{max(cpu):.2f}) |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--writes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--era", choices=("handshake", "modern"), default="handshake")
    parser.add_argument("--modes", default="fast,sdk")
    parser.add_argument("--before", default=None, help="another checkout to run as `before`")
    parser.add_argument("--client", choices=("raw", "sdk"), default="raw")
    parser.add_argument("--dir", default=None, help="where the data dirs go (default: tmp)")
    parser.add_argument(
        "--stores", default=None, help="size A/B: `empty` and store folders, copied per run"
    )
    parser.add_argument("--py-spy", default=None, help="with --stores: profiles into this dir")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    stores = {store_mode(store): store for store in (args.stores or "").split(",") if store}
    if stores and args.before:
        stores.update({f"{mode}@before": store for mode, store in stores.items()})
    if stores:
        args.client = "sdk"
        modes = list(stores)
    else:
        modes = args.modes.split(",") + (["before"] if args.before else [])
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory(prefix="bench-stdio-cpu-", dir=args.dir) as tmp:
        work = Path(tmp)
        era = "2026-07-28 (the SDK client's)" if args.client == "sdk" else args.era
        print(f"load average {load_average()}, {args.writes} writes per run, era {era}")
        floors: list[float] = []
        if stores:
            copy_stores(stores, args.rounds, work)
        for r in range(args.rounds):
            # the order turns every round: the first run of a round is charged more (measured:
            # the same tree run twice, 0.48 vs 0.375 ms server CPU per write)
            for mode in modes if r % 2 == 0 else modes[::-1]:
                where = work / f"{mode}-{r}"
                # the floor right before each run: the disk's state changes within minutes
                floor = p50(fsync_floor(work, FLOOR_WRITES))
                floors.append(floor)
                checkout = args.before if mode.endswith("before") else None
                if stores:
                    load = float(load_average())
                    spy = Path(args.py_spy) / f"{mode}-{r}.txt" if args.py_spy else None
                    run = run_serve_sdk(
                        where, args.writes, True, checkout, wait_index=True, profile=spy
                    )
                    run["load"] = load
                elif args.client == "sdk":
                    run = run_serve_sdk(where, args.writes, mode != "sdk", checkout)
                else:
                    run = run_serve(where, args.writes, args.era, mode != "sdk", checkout)
                run["floor_p50_ms"] = floor
                results[mode].append(run)
    floor_p50 = p50(floors)
    print(f"fsync floor p50 {floor_p50:.3f} ms (runs' floors); load average {load_average()}")
    sdk_client = args.client == "sdk"
    print(
        "| mode | server CPU per write (median / best run) | write p50 | p99 "
        "| p50 / floor of the same runs |" + (" SDK client CPU per call |" if sdk_client else "")
    )
    print("|---|---|---|---|---|" + ("---|" if sdk_client else ""))
    summary: dict[str, Any] = {"floor_p50_ms": floor_p50, "modes": {}}
    for mode, runs in results.items():
        cpu = p50([run["cpu_ms_per_write"] for run in runs])
        best = min(run["cpu_ms_per_write"] for run in runs)
        lat = p50([run["p50_ms"] for run in runs])
        p99 = p50([run["p99_ms"] for run in runs])
        ratio = p50([run["p50_ms"] / run["floor_p50_ms"] for run in runs])
        summary["modes"][mode] = {"runs": runs, "cpu_ms_per_write": cpu, "p50_ms": lat}
        client = ""
        if sdk_client:
            client = f" {p50([run['client_cpu_ms_per_write'] for run in runs]):.3f} ms |"
        print(
            f"| {mode} | {cpu:.3f} / {best:.3f} ms | {lat:.3f} ms | {p99:.2f} ms | {ratio:.1f}x |"
            + client
        )
    if stores:
        print_size_ratios(results)
        loads = [run["load"] for runs in results.values() for run in runs]
        print(f"load average at the runs' starts {min(loads):.2f}-{max(loads):.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
