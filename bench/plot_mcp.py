"""Plots of bench/bench_mcp.py's figures (PNG), for docs/benchmarks.md.

Usage: python bench/plot_mcp.py FIGURES.json OUT_DIR
Writes OUT_DIR/mcp-latency-by-store-size.png and OUT_DIR/mcp-throughput-by-hosts.png.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: render to files only
import matplotlib.pyplot as plt


def main(figures_path: str, out_dir: str) -> int:
    figures = json.loads(Path(figures_path).read_text())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    stores = {int(size): row for size, row in figures["stores"].items()}
    sizes = sorted(s for s in stores if s)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for key, label in (
        ("write_p50_ms", "write_message p50 (stdio)"),
        ("write_p99_ms", "write_message p99 (stdio)"),
        ("later_health_ms", "get_system_health, second call (first start: beside the index build)"),
        ("first_health_ms", "get_system_health, first call (waits for the store to open)"),
        ("restart_first_reply_ms", "process start to first tool reply (restart)"),
    ):
        shown = [s for s in sizes if key in stores[s]]
        if shown:
            ax.plot(shown, [stores[s][key] for s in shown], marker="o", label=label)
    ax.axhline(figures["fsync_floor"]["p50_ms"], color="grey", linestyle="--", label="fsync floor")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("messages in the store")
    ax.set_ylabel("ms")
    ax.set_title("convmem serve: latency against store size")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "mcp-latency-by-store-size.png")
    plt.close(fig)

    app = {int(n): row for n, row in figures["app"].items()}
    hosts = sorted(app)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(hosts, [app[n]["writes_per_s"] for n in hosts], marker="o", label="ConvMem app")
    peer = figures.get("peer_server_memory")
    if peer:
        ax.plot(
            [1, 8],
            [peer["single"]["writes_per_s"], peer["eight"]["writes_per_s"]],
            marker="s",
            label="server-memory (npm; not durable, loses writes with 8 hosts)",
        )
    ax.set_xlabel("concurrent hosts (each its own shim / server process)")
    ax.set_ylabel("acknowledged writes per second")
    ax.set_title("write throughput against hosts")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "mcp-throughput-by-hosts.png")
    plt.close(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
