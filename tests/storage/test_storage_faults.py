"""Injected failures and simulated crashes at every step of a write, a compaction and a close.

FaultFS counts the filesystem steps (open/write/fsync/truncate/close/replace/unlink/fsync_dir)
and fails the N-th one: OSError ("error"), a half-written write ("short"), or a simulated process
death ("crash": the step does not happen, every descriptor and the lock are dropped). Afterwards
the store reopened from disk with the real filesystem must hold the old or the new state whole,
and its self-check must pass.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from reliability_log import Tally
from storage_helpers import STEPS, Crash, FaultFS, dir_bytes, make_message

from convmem_engine.domain import Message, StoreIOError
from convmem_engine.storage import FileSystem, Store

MODES = ("error", "short", "crash")


def edited(m: Message) -> Message:
    return Message(
        m.message_id,
        m.session_id,
        m.timestamp,
        m.role,
        m.content + " (edited)",
        m.revision + 1,
        m.updated_at + 1,
        m.metadata,
    )


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Message]]:
    """A store with history: puts, an update, a delete, a snapshot, and a tail after it."""
    d = tmp_path_factory.mktemp("template")
    msgs = [make_message(f"template message {i}") for i in range(6)]
    with Store.open(d) as s:
        for m in msgs[:4]:
            s.put(m)
        s.update(edited(msgs[0]))
        s.delete(msgs[1].message_id)
    with Store.open(d) as s:  # a tail after the snapshot
        s.put(msgs[4])
        s.put(msgs[5])
        s.delete(msgs[2].message_id)
        state = list(s.messages.values())
        s._abandon()  # no snapshot at close: recovery has a tail to replay
    return d, state


def fresh(template: tuple[Path, list[Message]], tmp_path: Path) -> Path:
    d = tmp_path / "store"
    shutil.copytree(template[0], d)
    return d


def count_steps(d: Path, op: Callable[[Store], object]) -> list[str]:
    fs = FaultFS()
    s = Store.open(d, fs=fs)
    fs.steps.clear()
    op(s)
    steps = list(fs.steps)
    s.close()
    assert steps and set(steps) <= set(STEPS)
    return steps


def reopen_and_check(d: Path) -> list[Message]:
    with Store.open(d) as s:
        assert s.check() == []
        state = list(s.messages.values())
        assert not any(name.endswith(".tmp") for name in os.listdir(d))
    return state


def run_with_fault(
    d: Path, k: int, mode: str, op: Callable[[Store], object]
) -> tuple[str, Store, FaultFS]:
    """Open with FaultFS, fail the k-th step of `op`; return the outcome."""
    fs = FaultFS()
    s = Store.open(d, fs=fs)
    fs.steps.clear()
    fs.fail_at = k
    fs.mode = mode
    try:
        op(s)
    except StoreIOError:
        outcome = "io_error"
    except Crash:
        outcome = "crash"
    else:
        outcome = "ok"
    return outcome, s, fs


def write_ops(state: list[Message]) -> dict[str, tuple[Callable[[Store], object], list[Message]]]:
    new = make_message("the new message")
    target = state[0]
    return {
        "put": (lambda s: s.put(new), [*state, new]),
        "update": (lambda s: s.update(edited(target)), [edited(target), *state[1:]]),
        "delete": (lambda s: s.delete(target.message_id), state[1:]),
    }


@pytest.mark.parametrize("op_name", ["put", "update", "delete"])
def test_fault_at_every_step_of_a_write(
    template: tuple[Path, list[Message]], tmp_path: Path, op_name: str
) -> None:
    old = template[1]
    op, new_state = write_ops(old)[op_name]
    steps = count_steps(fresh(template, tmp_path / "count"), op)
    assert steps == ["write", "fsync"]
    with Tally("I/O error, short write or crash at every step of a write") as tally:
        _write_sweep(template, tmp_path, op, old, new_state, steps, tally)


def _write_sweep(
    template: tuple[Path, list[Message]],
    tmp_path: Path,
    op: Callable[[Store], object],
    old: list[Message],
    new_state: list[Message],
    steps: list[str],
    tally: Tally,
) -> None:
    for k in range(1, len(steps) + 1):
        for mode in MODES:
            d = fresh(template, tmp_path / f"{k}-{mode}")
            outcome, s, fs = run_with_fault(d, k, mode, op)
            assert fs.fired
            tally.cases += 1
            if mode == "crash":
                assert outcome == "crash"
            else:
                assert outcome == "io_error", (k, mode)
                st = s.stats()
                assert st.last_error != ""
                if steps[k - 1] == "write":
                    # the failed write was truncated away; the store goes on working
                    assert st.io.truncate_calls == 1
                    assert list(s.messages.values()) == old
                    assert s.check() == []
                    extra = make_message("written after the failure")
                    s.put(extra)
                    assert list(s.messages.values()) == [*old, extra]
                    s.close()
                    assert reopen_and_check(d) == [*old, extra]
                    continue
                # a failed fsync: the store refuses further writes until reopened
                with pytest.raises(StoreIOError):
                    s.put(make_message("refused"))
                s.close()
            got = reopen_and_check(d)
            tally.lost += got not in (old, new_state)
            assert got in (old, new_state), (k, mode)


def test_failed_truncate_after_a_failed_write_fails_the_store(
    template: tuple[Path, list[Message]], tmp_path: Path
) -> None:
    class TwoFaults(FaultFS):
        def truncate(self, fd: int, size: int) -> None:
            raise OSError(5, "injected truncate failure")

    d = fresh(template, tmp_path)
    fs = TwoFaults(mode="short", only="write")
    s = Store.open(d, fs=fs)
    fs.steps.clear()
    fs.fail_at = 1
    with pytest.raises(StoreIOError):
        s.put(make_message("half written"))
    assert "truncate" in s.stats().last_error
    with pytest.raises(StoreIOError, match="reopen"):
        s.put(make_message("refused"))
    s.close()
    # the half record is an incomplete tail for the next open
    with Store.open(d) as s2:
        assert s2.stats().recovered_tail
        assert list(s2.messages.values()) == template[1]
        assert s2.check() == []


def test_fault_at_every_step_of_a_compaction(
    template: tuple[Path, list[Message]], tmp_path: Path
) -> None:
    state = template[1]
    steps = count_steps(fresh(template, tmp_path / "count"), lambda s: s.compact())
    assert "replace" in steps and "fsync_dir" in steps
    outcomes = set()
    tally = Tally("I/O error, short write or crash at every step of a compaction")
    for k in range(1, len(steps) + 1):
        for mode in MODES:
            d = fresh(template, tmp_path / f"{k}-{mode}")
            outcome, s, fs = run_with_fault(d, k, mode, lambda s: s.compact())
            assert fs.fired
            outcomes.add(outcome)
            tally.cases += 1
            if mode == "crash":
                assert outcome == "crash"
            else:
                assert outcome == "io_error", (k, mode, steps[k - 1])
                assert list(s.messages.values()) == state
                assert s.stats().last_error
                assert s.check() == [], (k, mode, steps[k - 1])
                s.close()
            assert reopen_and_check(d) == state, (k, mode, steps[k - 1])
    with tally:
        pass  # recorded once every case passed
    assert {"io_error", "crash"} <= outcomes


def test_fault_at_every_step_of_close(template: tuple[Path, list[Message]], tmp_path: Path) -> None:
    state = template[1]
    steps = count_steps(fresh(template, tmp_path / "count"), lambda s: s.close())
    assert "replace" in steps
    with Tally("I/O error, short write or crash at every step of a close (snapshot)") as tally:
        for k in range(1, len(steps) + 1):
            for mode in MODES:
                d = fresh(template, tmp_path / f"{k}-{mode}")
                outcome, _s, _ = run_with_fault(d, k, mode, lambda s: s.close())
                assert outcome in ("ok", "crash", "io_error")
                tally.cases += 1
                assert reopen_and_check(d) == state


def test_fault_while_opening_a_store_with_a_torn_tail(
    template: tuple[Path, list[Message]], tmp_path: Path
) -> None:
    state = template[1]
    for k in (1, 2, 3):
        for mode in ("error", "crash"):
            d = fresh(template, tmp_path / f"{k}-{mode}")
            with open(d / "active.log", "ab") as f:
                f.write(b"CMLR\x03\x01")  # a torn header
            fs = FaultFS(fail_at=k, mode=mode)
            try:
                s = Store.open(d, fs=fs)
            except (StoreIOError, Crash):
                pass
            else:
                s.close()
            got = reopen_and_check(d)
            assert got == state


def test_failed_rename_in_compaction_keeps_the_old_state_working(
    template: tuple[Path, list[Message]], tmp_path: Path
) -> None:
    d = fresh(template, tmp_path)
    fs = FaultFS(only="replace")
    s = Store.open(d, fs=fs)
    fs.steps.clear()
    fs.fail_at = 1
    before = dir_bytes(d)
    with pytest.raises(StoreIOError, match="replace"):
        s.compact()
    assert dir_bytes(d) == before
    assert s.check() == []
    s.put(make_message("still writable"))
    assert s.check() == []
    r = s.compact()  # and a retry succeeds
    assert r.records_removed > 0
    s.close()
    reopen_and_check(d)


def test_short_writes_that_continue_complete_the_record(
    template: tuple[Path, list[Message]], tmp_path: Path
) -> None:
    """A short write is not a failure by itself: the store writes the rest and succeeds."""

    class Trickle(FileSystem):
        def write(self, fd: int, data: bytes | memoryview) -> int:
            return super().write(fd, bytes(data)[:7])

    d = fresh(template, tmp_path)
    msg = make_message("written seven bytes at a time")
    with Store.open(d, fs=Trickle()) as s:
        calls_before = s.stats().io.write_calls
        s.put(msg)
        assert s.stats().io.write_calls - calls_before > 10
        assert s.stats().last_error == ""
    with Store.open(d) as s2:
        assert s2.get(msg.message_id) == msg
        assert s2.check() == []
