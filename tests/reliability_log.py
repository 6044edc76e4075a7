"""Counts for docs/reliability.md: what each fault-injecting test tried and what came of it.

On sys.path as `reliability_log` (like `tool_results`). When the environment variable
`CONVMEM_RELIABILITY_LOG` names a file, `record()` appends one JSON line to it:

    {"fault_class": "...", "cases": N, "lost": 0, "crashed": 0, "hung": 0, "changed": 0,
     "test": "tests/...::test_name"}

- cases: faults injected (kills, power cuts, hostile requests, mutated files, ...);
- lost: acknowledged writes missing afterwards;
- crashed: server/store failures (a traceback, an unexpected exit, a refused intact store);
- hung: requests left without an answer, processes that did not stop or start in time;
- changed: stored data altered by the fault (other than the fault's own acknowledged effect);
- failed (only when true): the test ended by an exception, so the counts are incomplete.

Without the variable nothing is written. scripts/reliability_table.py sums the lines per
fault class into the table. Record before asserting, so a failing run is counted as it was:

    tally = Tally("SIGKILL of convmem serve under mixed load")
    with tally:                # records on exit, also when an assertion fails inside
        for ...:
            tally.cases += 1
            tally.lost += len(missing)
    assert tally.lost == 0
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from types import TracebackType

ENV: str = "CONVMEM_RELIABILITY_LOG"


def record(
    fault_class: str,
    cases: int,
    *,
    lost: int = 0,
    crashed: int = 0,
    hung: int = 0,
    changed: int = 0,
    failed: bool = False,
) -> None:
    """Append one line for `fault_class` to $CONVMEM_RELIABILITY_LOG (if set)."""
    path = os.environ.get(ENV)
    if not path:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    line = {
        "fault_class": fault_class,
        "cases": cases,
        "lost": lost,
        "crashed": crashed,
        "hung": hung,
        "changed": changed,
        "test": test,
    }
    if failed:
        line["failed"] = True
    data = (json.dumps(line, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)  # one short O_APPEND write: lines of parallel writers never mix
    finally:
        os.close(fd)


@dataclass
class Tally:
    """Counts for one fault class, recorded when the `with` block ends (even by an error)."""

    fault_class: str
    cases: int = 0
    lost: int = 0
    crashed: int = 0
    hung: int = 0
    changed: int = 0

    def __enter__(self) -> Tally:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        record(
            self.fault_class,
            self.cases,
            lost=self.lost,
            crashed=self.crashed,
            hung=self.hung,
            changed=self.changed,
            failed=exc_type is not None,  # the test stopped early: never shown as a clean run
        )
