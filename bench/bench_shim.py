"""App and shim benchmark: what a host pays for going through `convmem-shim` and the app's pipe.

1. Shim cold start, with the app already running: from spawning the shim process to the first
   byte of the answer to the host's first request (`initialize`) on the shim's stdout. That
   first answer byte can only arrive after the shim has started, connected, forwarded the
   request and forwarded the answer's first byte back, so it bounds "first forwarded byte"
   from above. Next to it, in the same run: the bare interpreter (`python -c pass`, the floor)
   and `convmem serve` cold start to its first answer byte (the headless peer).
2. Write round trip (`write_message`, real chat messages from the chitchat corpus, each
   durable before it is acknowledged) through the SDK client: host -> shim -> pipe -> engine,
   next to the same calls on `convmem serve` over stdio. Both sessions run at once, calls
   interleaved, so both see the same disk and CPU.

Usage: python bench/bench_shim.py [--starts N] [--writes N] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The app tests' helpers: the same child environment, control messages and wire lines.
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "app")
)

import anyio
from app_helpers import child_env, control, initialize_request, lines
from corpus import load_corpus
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

ROOT = Path(__file__).resolve().parent.parent
INITIALIZE = lines(initialize_request("bench"))


def first_byte_ms(command: list[str], send: bytes | None) -> float:
    """Spawn `command`, send `send`, time until the first byte on its stdout."""
    started = time.perf_counter()
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=child_env(),
        cwd=ROOT,
    )
    assert process.stdin is not None and process.stdout is not None
    if send is not None:
        process.stdin.write(send)
        process.stdin.flush()
        first = process.stdout.read(1)
        elapsed = (time.perf_counter() - started) * 1000
        assert first == b"{", first
        process.stdin.close()
    else:
        process.stdin.close()
        process.wait()
        elapsed = (time.perf_counter() - started) * 1000
    process.stdout.read()
    process.stdout.close()
    process.wait(30)
    return elapsed


def summary(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return statistics.median(ordered), p90


async def round_trips(app_dir: Path, serve_dir: Path, writes: int) -> dict[str, list[float]]:
    corpus = load_corpus()
    py = sys.executable
    via_shim = StdioServerParameters(
        command=py, args=["-m", "convmem_app", "shim", "--data-dir", str(app_dir)], env=child_env()
    )
    via_serve = StdioServerParameters(
        command=py,
        args=["-m", "convmem_app", "serve", "--data-dir", str(serve_dir)],
        env=child_env(),
    )
    timings: dict[str, list[float]] = {"shim": [], "serve": []}
    with open(os.devnull, "w") as errlog:
        async with (
            Client(stdio_client(via_shim, errlog=errlog)) as shim,
            Client(stdio_client(via_serve, errlog=errlog)) as serve,
        ):
            for n in range(writes + 20):
                session, role, content = corpus[n * 37 % len(corpus)]
                for name, client in (
                    (("shim", shim), ("serve", serve))
                    if n % 2
                    else (
                        ("serve", serve),
                        ("shim", shim),
                    )
                ):
                    started = time.perf_counter()
                    result = await client.call_tool(
                        "write_message", {"session_id": session, "role": role, "content": content}
                    )
                    elapsed = (time.perf_counter() - started) * 1000
                    assert not result.is_error
                    if n >= 20:  # warm-up excluded
                        timings[name].append(elapsed)
    return timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=30)
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="cmbench"))
    app_dir, serve_dir = work / "app", work / "serve"
    log = (work / "app.log").open("wb")
    app = subprocess.Popen(
        [sys.executable, "-m", "convmem_app", "app", "--minimized", "--data-dir", str(app_dir)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env=child_env(),
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        while (control(app_dir, "status") or {}).get("state") != "running":
            if time.monotonic() > deadline:
                raise SystemExit("the app did not start")
            time.sleep(0.05)
        py = sys.executable
        shim_script = Path(py).parent / "convmem-shim"
        rows: dict[str, list[float]] = {
            "python -c pass (interpreter floor)": [],
            "python -m convmem_app shim": [],
        }
        if shim_script.exists():
            rows["convmem-shim (installed script)"] = []
        rows["convmem serve (headless peer)"] = []
        for _ in range(args.starts):
            rows["python -c pass (interpreter floor)"].append(
                first_byte_ms([py, "-c", "pass"], None)
            )
            rows["python -m convmem_app shim"].append(
                first_byte_ms(
                    [py, "-m", "convmem_app", "shim", "--data-dir", str(app_dir)], INITIALIZE
                )
            )
            if shim_script.exists():
                rows["convmem-shim (installed script)"].append(
                    first_byte_ms([str(shim_script), "--data-dir", str(app_dir)], INITIALIZE)
                )
        for _ in range(max(5, args.starts // 5)):
            rows["convmem serve (headless peer)"].append(
                first_byte_ms(
                    [py, "-m", "convmem_app", "serve", "--data-dir", str(serve_dir)], INITIALIZE
                )
            )
        timings = anyio.run(round_trips, app_dir, work / "serve-rt", args.writes)
    finally:
        control(app_dir, "quit")
        app.wait(60)
        log.close()
        shutil.rmtree(work, ignore_errors=True)

    shim_median = summary(rows["python -m convmem_app shim"])[0]
    print(f"cold start to first answer byte ({args.starts} runs; app running)")
    print(f"{'command':40} {'median ms':>10} {'p90 ms':>8} {'ratio':>7}")
    for name, values in rows.items():
        median, p90 = summary(values)
        print(f"{name:40} {median:10.1f} {p90:8.1f} {median / shim_median:7.2f}")
    print()
    print(f"write_message round trip ({args.writes} calls each, interleaved, durable)")
    print(f"{'path':40} {'median ms':>10} {'p90 ms':>8} {'ratio':>7}")
    serve_median = summary(timings["serve"])[0]
    for name, label in (
        ("shim", "host -> shim -> pipe -> app engine"),
        ("serve", "host -> convmem serve (stdio)"),
    ):
        median, p90 = summary(timings[name])
        print(f"{label:40} {median:10.2f} {p90:8.2f} {median / serve_median:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
