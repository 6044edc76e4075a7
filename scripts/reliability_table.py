#!/usr/bin/env python3
"""Regenerate docs/reliability.md from the fault-injecting tests' own counts.

    python scripts/reliability_table.py               # run them all (slow ones too), write the doc
    python scripts/reliability_table.py tests/mcp/test_mcp_fuzz.py   # only these tests
    python scripts/reliability_table.py --log A.jsonl tests/mcp    # keep the counts in A.jsonl
    python scripts/reliability_table.py --from-log A.jsonl --from-log B.jsonl  # doc from logs

Every fault-injecting test appends one JSON line per fault class to the file named by
CONVMEM_RELIABILITY_LOG (tests/reliability_log.py); this script runs the test modules that do
(found by that import), slow tests included, with the variable set, sums the lines per fault
class and writes the table. A failing test still counts what it saw (its line says "failed"),
and the doc then says so. Exit status: 0 when pytest passed, else pytest's status (the doc is
written either way).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "reliability.md"
ENV = "CONVMEM_RELIABILITY_LOG"
COUNTS = ("lost", "crashed", "hung", "changed")

NOT_MODELLED = """\
- **Disks that lie about flushes.** Every guarantee assumes that when `fsync` (Windows:
  `FlushFileBuffers`) returns, the data is on stable storage. A drive or virtual disk that
  acknowledges a flush from a volatile cache can lose acknowledged writes at a power cut; no
  test here can tell, because the tests see what the kernel sees.
- **Stale bytes in lost blocks, and reordering finer than a block.** The power-loss mode keeps
  each file up to its last fsync and, of the unsynced rest, a prefix, the data up to a 4 KiB
  block boundary and zeros after it, or each 4 KiB block either written or zeros (reordering
  within a file). A filesystem that shows a lost block's earlier contents (stale data) instead
  of zeros, or a device that tears a 4 KiB block, is not simulated. Records carry CRCs, so such
  damage is refused as CORRUPT_STORE rather than misread, but it is not counted here.
- **Silent corruption of synced data** (bit rot, a bad sector, another program editing the
  files) beyond the mutated records and snapshots the fuzzers try: CRCs detect it, repair is
  not attempted.
- **Network and shared filesystems** (NFS, SMB, cloud-synced folders) and two machines on one
  data dir: the lock and fsync semantics there are not those of a local disk. Not tested.
- **Kernel crashes and power cuts of the real machine.** Power loss is simulated in the
  filesystem seam the store writes through, not by cutting power; a process kill (SIGKILL) is
  real.
- **Platforms.** The counts below come from the machine named under "Run"; the Windows and
  macOS jobs run the default suite, not these long runs.
"""


@dataclass
class Row:
    fault_class: str
    cases: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    tests: set[str] = field(default_factory=set)
    failed: bool = False


def read_logs(paths: list[Path]) -> tuple[list[Row], list[dict[str, str]]]:
    """The rows summed per fault class, and the runs (one "run" line per pytest run)."""
    rows: dict[str, Row] = {}
    runs: list[dict[str, str]] = []
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                if "run" in entry:
                    runs.append({k: str(v) for k, v in entry["run"].items()})
                    continue
                row = rows.setdefault(entry["fault_class"], Row(entry["fault_class"]))
                row.cases += int(entry["cases"])
                for key in COUNTS:
                    row.counts[key] += int(entry.get(key, 0))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise SystemExit(f"{path}:{number}: not a reliability line ({exc})") from None
            if entry.get("test"):
                row.tests.add(entry["test"])
            row.failed |= bool(entry.get("failed"))
    return sorted(rows.values(), key=lambda r: r.fault_class.lower()), runs


def _result(row: Row, failed_classes: int) -> str:
    problems = [f"{row.counts[k]} {k}" for k in COUNTS if row.counts[k]]
    if failed_classes:
        problems.append(f"a test of {failed_classes} fault class(es) failed (marked above)")
    return "**" + ", ".join(problems) + "**" if problems else "none"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(rows: list[Row], runs: list[dict[str, str]]) -> str:
    out = [
        "# Reliability",
        "",
        "What ConvMem was put through, and what came of it. Every number below was counted by",
        "the tests themselves while they ran (each fault-injecting test, the long `slow` ones",
        "included, records what it tried and what it saw through `tests/reliability_log.py`)",
        "and this page was written from those counts by `scripts/reliability_table.py`; nothing",
        "here is typed by hand except the list of what is not modelled.",
        "",
        "The promises under test (docs/semantics.md, docs/storage-format.md): a write is on",
        "disk before it is acknowledged; a crash, a kill or a power cut loses nothing that was",
        "acknowledged; damage is reported, never silently skipped; bad input gets an error and",
        "never corrupts, truncates or loses stored data; every request gets an answer.",
        "",
        "Columns: **cases** are faults injected (kills, simulated power cuts, hostile requests,",
        "mutated files, ...); **lost** are acknowledged writes missing afterwards; **crashed**",
        "are server or store failures (an unexpected exit, an internal error, a store that",
        "refused to open or failed its check when it should not have); **hung** are requests",
        "left without an answer or processes that did not stop; **changed** are stored messages",
        "altered or appearing other than by an acknowledged (or in-flight) operation. After a",
        "power cut that kept a later 4 KiB block of the log's unsynced tail and zeroed an earlier",
        'one (the rows "each 4 KiB block ... kept or zeroed") the store refuses to open with',
        "CORRUPT_STORE, changing nothing, as docs/storage-format.md says: not counted as crashed.",
        "`convmem repair` is then run on a copy (its log cut at the offset named) and the copy",
        "opened and checked like any reopen: its lost writes count in **lost**.",
        "",
        "## Results",
        "",
        "| Fault class | Cases | Lost | Crashed | Hung | Changed | Checked by |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    total = Row("total")
    for row in rows:
        tests = "<br>".join(f"`{t}`" for t in sorted(row.tests)) or "—"
        counts = " | ".join(str(row.counts[k]) for k in COUNTS)
        name = _cell(row.fault_class) + (" (test failed)" if row.failed else "")
        out.append(f"| {name} | {row.cases:,} | {counts} | {tests} |")
        total.cases += row.cases
        for k in COUNTS:
            total.counts[k] += row.counts[k]
        total.failed |= row.failed
    counts = " | ".join(f"**{total.counts[k]}**" for k in COUNTS)
    out.append(f"| **All** | **{total.cases:,}** | {counts} | |")
    out += [
        "",
        f"Problems found: {_result(total, sum(row.failed for row in rows))}."
        + (
            " Some tests failed in these runs (see Runs)."
            if any(w in run["summary"] for run in runs for w in ("failed", "error"))
            else ""
        ),
        "",
        "## Runs",
        "",
        *[
            f"- {run['when']}: `{run['command']}`: {run['summary']} ({run['machine']})"
            for run in runs
        ],
        "",
        "Regenerate with `python3 scripts/reliability_table.py` (every test module that",
        "records counts, slow tests included: many minutes). Part of it: `python3",
        "scripts/reliability_table.py --log A.jsonl tests/mcp` keeps the counts, and",
        "`--from-log A.jsonl --from-log B.jsonl` writes the page from kept logs (the table then",
        "shows only what those runs counted).",
        "",
        "## Not modelled",
        "",
        NOT_MODELLED.rstrip(),
        "",
    ]
    return "\n".join(out)


def _python() -> str:
    """The project's venv (scripts/dev.py setup) when there is one, else this interpreter."""
    for candidate in (ROOT / ".venv" / "bin" / "python", ROOT / ".venv" / "Scripts" / "python.exe"):
        if candidate.exists():
            return str(candidate)
    return sys.executable


def recording_modules() -> list[str]:
    """Every test module that records counts (imports reliability_log), relative to ROOT."""
    found = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path.name != "test_reliability_log.py" and "reliability_log" in path.read_text("utf-8"):
            found.append(path.relative_to(ROOT).as_posix())
    return found


def run_pytest(paths: list[str], log: Path) -> int:
    """Run the tests (slow ones included) with the log variable set; append a "run" line;
    return pytest's status."""
    marker = "slow or not slow"
    command = [_python(), "-m", "pytest", "-m", marker, "-q", "-p", "no:cacheprovider"]
    command += paths
    env = dict(os.environ, **{ENV: str(log)})
    print("running:", " ".join(command), flush=True)
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    summary = ""
    for line in proc.stdout:
        sys.stdout.write(line)
        text = line.strip().strip("=").strip()
        if " passed" in text or " failed" in text or " error" in text:
            summary = text
    status = proc.wait()
    machine = f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, Python "
    machine += platform.python_version()
    run = {
        "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": f"python3 -m pytest -m '{marker}' " + " ".join(paths),
        "summary": summary or f"exit status {status}",
        "machine": machine,
    }
    with log.open("a", encoding="utf-8") as out:
        out.write(json.dumps({"run": run}) + "\n")
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "paths", nargs="*", help="test paths (default: every test module that records counts)"
    )
    parser.add_argument(
        "--from-log",
        type=Path,
        action="append",
        help="write the doc from this kept log (repeatable); run nothing",
    )
    parser.add_argument("--log", type=Path, help="keep the run's log here (appended to)")
    parser.add_argument("--output", type=Path, default=DOC)
    args = parser.parse_args(argv)
    status = 0
    if args.from_log:
        rows, runs = read_logs(args.from_log)
    else:
        with tempfile.TemporaryDirectory(prefix="convmem-reliability-") as tmp:
            log = args.log or Path(tmp) / "reliability.jsonl"
            log.touch()
            status = run_pytest(args.paths or recording_modules(), log)
            rows, runs = read_logs([log])
    if not rows:
        print("no reliability lines were recorded: nothing to write", file=sys.stderr)
        return status or 1
    args.output.write_text(render(rows, runs), encoding="utf-8")
    print(f"wrote {args.output} ({len(rows)} fault classes)")
    return status


if __name__ == "__main__":
    sys.exit(main())
