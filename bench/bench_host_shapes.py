"""Cold start of `convmem serve` as different hosts write their first requests (issue 13).

    python bench/bench_host_shapes.py [--tree NAME=PATH ...] [--stores DIR,...] [--starts N]
                                      [--json OUT]

The handshake and first-reply goals (docs/benchmarks.md) were measured with the Python SDK's
client. Hosts built on the TypeScript SDK write the same requests differently: their own key
order, more client capabilities (roots.listChanged, extensions), a log level in each 2026-07-28
request. The standard-library front of `convmem serve` answers only the shapes it knows byte
for byte; anything else waits for the SDK and the store. This bench writes each host's exact
request lines (captured from the Python SDK client 2.x and from the MCP Inspector 2.12's CLI,
in both protocol eras: the handshake, then `tools/list` and a `get_system_health` call, as
each writes them) to real `convmem serve` processes over their stdin, and times the process
start → the handshake's answer and → the first tool reply.

Each `--tree` is a ConvMem checkout (default: this one), compiled to bytecode first as an
installed ConvMem is. For each start, every store (an empty one and copies of `--stores`), every
host and era, the trees take turns at going first. Prints medians (ms) and each tree's ratio to
the first one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_mcp import ROOT, child_env, compile_tree, load_average, p50

# The first requests as each host writes them (bytes captured from the real clients; only the
# tool call's name and arguments are ours: get_system_health, as bench_mcp's cold start).
_MODERN_SDK_META = (
    '{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo"'
    ':{"name":"mcp","version":"0.1.0"},"io.modelcontextprotocol/clientCapabilities":{}}'
)
_INSPECTOR_CAPABILITIES = (
    '{"roots":{"listChanged":true},"extensions":{"io.modelcontextprotocol/tasks":{},'
    '"io.modelcontextprotocol/skills":{}}}'
)
_INSPECTOR_ENVELOPE = (
    '"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo"'
    ':{"name":"inspector-cli","version":"2.12.0"},"io.modelcontextprotocol/clientCapabilities":'
    + _INSPECTOR_CAPABILITIES
)
HOSTS: dict[str, dict[str, list[str]]] = {
    "python-sdk": {
        "legacy": [
            '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":'
            '"2025-11-25","capabilities":{},"clientInfo":{"name":"mcp","version":"0.1.0"}}}',
            '{"jsonrpc":"2.0","method":"notifications/initialized"}',
            '{"jsonrpc":"2.0","id":2,"method":"tools/list"}',
            '{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"get_system_health",'
            '"arguments":{}}}',
        ],
        "modern": [
            '{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":'
            + _MODERN_SDK_META
            + "}}",
            '{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":'
            + _MODERN_SDK_META
            + "}}",
            '{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"get_system_health",'
            '"arguments":{},"_meta":' + _MODERN_SDK_META + "}}",
        ],
    },
    "inspector": {
        "legacy": [
            '{"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":'
            + _INSPECTOR_CAPABILITIES
            + ',"clientInfo":{"name":"inspector-cli","version":"2.12.0"}},"jsonrpc":"2.0","id":0}',
            '{"jsonrpc":"2.0","method":"notifications/initialized"}',
            '{"method":"tools/list","jsonrpc":"2.0","id":1}',
            '{"method":"tools/call","params":{"name":"get_system_health","arguments":{}},'
            '"jsonrpc":"2.0","id":2}',
        ],
        "modern": [
            '{"jsonrpc":"2.0","id":"server-discover-probe-1","method":"server/discover","params":'
            '{"_meta":{' + _INSPECTOR_ENVELOPE + "}}}",
            '{"method":"tools/list","params":{"_meta":{' + _INSPECTOR_ENVELOPE + ',"io.modelcont'
            'extprotocol/logLevel":"debug"}},"jsonrpc":"2.0","id":0}',
            '{"jsonrpc":"2.0","id":"inspector-ext-1","method":"tools/call","params":{"name":'
            '"get_system_health","arguments":{},"_meta":{"io.modelcontextprotocol/logLevel":'
            '"debug",' + _INSPECTOR_ENVELOPE + "}}}",
        ],
    },
}


def _answers(stdout: Any, n: int) -> None:
    """Read until `n` answers (lines with an id) have come."""
    while n:
        line = stdout.readline()
        if not line:
            raise RuntimeError("the server closed its stdout")
        if b'"id"' in line and b'"method"' not in line:
            n -= 1


def one_start(tree: Path, data_dir: Path, lines: list[str]) -> tuple[float, float]:
    """(ms to the handshake's answer, ms to the first tool reply) from the process start."""
    first, rest = lines[0], lines[1:]
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "convmem_app", "serve", "--data-dir", str(data_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=child_env(tree),
        cwd=tree,
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        process.stdin.write(first.encode() + b"\n")
        process.stdin.flush()
        _answers(process.stdout, 1)
        handshake = (time.perf_counter() - started) * 1000
        process.stdin.write("".join(line + "\n" for line in rest).encode())
        process.stdin.flush()
        _answers(process.stdout, 2)  # tools/list and the call, in order
        first_reply = (time.perf_counter() - started) * 1000
    finally:
        process.stdin.close()
        process.stdout.read()
        process.stdout.close()
        process.wait(120)
    return handshake, first_reply


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--stores", default="", help="comma-separated store folders to copy")
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    trees = {
        name: Path(path).resolve()
        for name, path in (spec.split("=", 1) for spec in args.tree or [f"this={ROOT}"])
    }
    for tree in trees.values():
        compile_tree(tree)
    work = Path(tempfile.mkdtemp(prefix="cmbench-shapes-"))
    try:
        copies = {"empty": work / "empty"}
        for store in filter(None, args.stores.split(",")):
            copies[Path(store).name] = work / Path(store).name
            shutil.copytree(store, copies[Path(store).name], symlinks=True)
        print(f"load average {load_average()}; {os.cpu_count()} CPUs; {args.starts} starts each")
        times: dict[tuple[str, str, str, str], list[tuple[float, float]]] = {}
        names = list(trees)
        for i in range(args.starts):
            for store, data_dir in copies.items():
                for host, eras in HOSTS.items():
                    for era, lines in eras.items():
                        for name in names[:: 1 if i % 2 == 0 else -1]:
                            key = (store, host, era, name)
                            times.setdefault(key, []).append(
                                one_start(trees[name], data_dir, lines)
                            )
        print(f"load average after {load_average()}")
        print(
            f"{'store':>8} {'host':>11} {'era':>7} {'tree':>10} {'handshake':>9} {'1st reply':>9}"
            f" {'ratio':>13}   (ms, medians; ratio: handshake, 1st reply ÷ {names[0]})"
        )
        figures: dict[str, Any] = {"load": load_average(), "starts": args.starts, "rows": []}
        for (store, host, era, name), rows in times.items():
            hs, fr = p50([r[0] for r in rows]), p50([r[1] for r in rows])
            base = times[(store, host, era, names[0])]
            bh, bf = p50([r[0] for r in base]), p50([r[1] for r in base])
            print(
                f"{store:>8} {host:>11} {era:>7} {name:>10} {hs:9.0f} {fr:9.0f}"
                f" {hs / bh:6.2f} {fr / bf:6.2f}"
            )
            figures["rows"].append(
                {"store": store, "host": host, "era": era, "tree": name, "handshake_ms": hs,
                 "first_reply_ms": fr, "runs": rows}
            )  # fmt: skip
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
