"""Real processes: a writer killed with SIGKILL at random moments loses no acknowledged write;
the data-dir lock is exclusive across processes and never outlives a killed holder."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from storage_child import content_for

from convmem_engine.domain import BusyError
from convmem_engine.storage import Store

CHILD = str(Path(__file__).with_name("storage_child.py"))

pytestmark = pytest.mark.posix  # SIGKILL


class Child:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, CHILD, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.endswith("\n"):
                break  # a line cut by the kill
            self.lines.append(line.rstrip("\n"))
            if line.startswith(("READY", "LOCKED")):
                self.ready.set()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._reader.join(30)
        assert self.proc.stderr is not None
        err = self.proc.stderr.read()
        self.proc.stderr.close()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        assert self.proc.returncode == -signal.SIGKILL, err


def apply(model: dict[str, tuple[int, int]], op: str, mid: str, rev: int, n: int) -> None:
    if op == "P":
        model[mid] = (rev, n)
    elif op == "U":
        model[mid] = (rev, model[mid][1])
    elif op == "D":
        del model[mid]


def crash_iteration(d: Path, seed: int, threads: int, model: dict[str, tuple[int, int]]) -> int:
    """Run a writer, SIGKILL it at a random moment, verify every acknowledged write."""
    rng = random.Random(seed)
    child = Child("writer", str(d), str(seed), str(threads))
    assert child.ready.wait(60), "writer did not start"
    time.sleep(rng.uniform(0.05, 0.6))
    child.kill()
    in_flight: dict[str, tuple[str, str, int]] = {}  # thread key -> intent
    acked = 0
    counter = len(model)
    for line in child.lines[1:]:
        kind, op, mid, rev_s = line.split()
        rev = int(rev_s)
        if kind == "I":
            in_flight[mid] = (op, mid, rev)
        else:
            in_flight.pop(mid, None)
            counter += 1
            apply(model, op, mid, rev, counter)
            acked += 1
    with Store.open(d) as s:
        assert s.check() == []
        got = {mid: m.revision for mid, m in s.messages.items()}
        for mid, m in s.messages.items():
            assert m.content == content_for(mid, m.revision)
        expected = {mid: rev for mid, (rev, _) in model.items()}
        # every acknowledged write is there; the only differences are unacknowledged ones
        diff = {k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k)}
        assert diff <= set(in_flight), (diff, in_flight)
        for mid in diff:
            op, _, rev = in_flight[mid]
            if op == "P":
                assert got.get(mid) == 1 and mid not in expected
            elif op == "U":
                assert got.get(mid) == rev
            elif op == "D":
                assert mid not in got
        # adopt what the store kept, so the next round's model is exact
        for mid in diff:
            if mid in got:
                model[mid] = (got[mid], 0)
            else:
                model.pop(mid, None)
        # creation order: each writer thread's puts appear in the order it made them
        # (ids are <pid 8><thread 2><counter 16>)
        by_writer: dict[str, list[str]] = {}
        for mid in s.messages:
            by_writer.setdefault(mid[:10], []).append(mid)
        for ids in by_writer.values():
            assert ids == sorted(ids)
    return acked


@pytest.mark.parametrize("threads", [1, 4])
def test_sigkill_during_writes_loses_no_acknowledged_write(tmp_path: Path, threads: int) -> None:
    model: dict[str, tuple[int, int]] = {}
    total = 0
    for i in range(2):
        total += crash_iteration(tmp_path, 1000 * threads + i, threads, model)
    assert total > 0


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 4])
def test_sigkill_many_times(tmp_path: Path, threads: int) -> None:
    model: dict[str, tuple[int, int]] = {}
    for i in range(40):
        crash_iteration(tmp_path, 7000 * threads + i, threads, model)


def test_second_process_gets_busy_naming_the_holder_and_kill_releases_it(tmp_path: Path) -> None:
    child = Child("hold", str(tmp_path))
    try:
        assert child.ready.wait(60)
        with pytest.raises(BusyError) as ei:
            Store.open(tmp_path)
        assert f"pid {child.proc.pid}" in str(ei.value)
        assert ei.value.code == "BUSY"
    finally:
        child.kill()
    # the holder died without cleaning up: its pid file is still there, the lock is not
    assert (tmp_path / "lock.pid").read_text().strip() == str(child.proc.pid)
    with Store.open(tmp_path) as s:
        assert s.check() == []
        assert (tmp_path / "lock.pid").read_text().strip() == str(os.getpid())
    assert not (tmp_path / "lock.pid").exists()


def test_second_open_in_the_same_process_is_busy(tmp_path: Path) -> None:
    s = Store.open(tmp_path)
    try:
        with pytest.raises(BusyError, match=f"pid {os.getpid()}"):
            Store.open(tmp_path)
    finally:
        s.close()
    Store.open(tmp_path).close()
