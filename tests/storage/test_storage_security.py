"""Issue 15, defects 3 and 7: nothing follows a planted symlink, the data dir and every file in
it are user-only, and a data dir another user owns or may change is refused."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from storage_helpers import make_message

from convmem_engine.domain import StoreIOError, UnsafeDataDirError
from convmem_engine.storage import Store
from tests.mcp.mcp_helpers import child_env, serve_args

pytestmark = pytest.mark.posix  # POSIX modes and symlinks


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_a_new_data_dir_and_every_file_are_user_only(tmp_path: Path) -> None:
    d = tmp_path / "a" / "b" / "data"
    old = os.umask(0o002)  # a permissive umask (Ubuntu's default for user groups)
    try:
        with Store.open(d) as s:
            s.put(make_message("hello"))
            assert mode(d / "lock") == 0o600
            assert mode(d / "lock.pid") == 0o600
    finally:
        os.umask(old)
    for p in (tmp_path / "a", tmp_path / "a" / "b", d):
        assert mode(p) == 0o700, p
    assert sorted(os.listdir(d)) == ["active.log", "lock", "snapshot.bin"]
    for name in os.listdir(d):
        assert mode(d / name) == 0o600, name


def test_an_older_readable_data_dir_and_lock_are_made_user_only(tmp_path: Path) -> None:
    d = tmp_path / "data"
    with Store.open(d) as s:
        s.put(make_message("hello"))
    os.chmod(d, 0o755)  # as versions before issue 15 created them
    os.chmod(d / "lock", 0o644)
    with Store.open(d) as s:
        assert len(s.messages) == 1
    assert mode(d) == 0o700 and mode(d / "lock") == 0o600


@pytest.mark.parametrize("bits", [0o770, 0o707, 0o720, 0o702, 0o777], ids=oct)
def test_a_data_dir_writable_by_others_is_refused(tmp_path: Path, bits: int) -> None:
    d = tmp_path / "data"
    d.mkdir()
    os.chmod(d, bits)
    with pytest.raises(UnsafeDataDirError) as ei:
        Store.open(d)
    msg = str(ei.value)
    assert "writable by group or others" in msg and f"{bits:04o}" in msg
    assert f"chmod 700 {d}" in msg
    assert ei.value.code == "IO_ERROR"
    assert os.listdir(d) == []  # nothing created: not even the lock
    assert mode(d) == bits


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs chown")
def test_a_data_dir_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "data"
    d.mkdir(mode=0o700)
    os.chown(d, 4321, -1)
    with pytest.raises(UnsafeDataDirError, match="owned by another user") as ei:
        Store.open(d)
    assert "uid 4321" in str(ei.value)
    assert os.listdir(d) == []


def _victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim.txt"
    v.write_bytes(b"precious")
    return v


@pytest.mark.parametrize("name", ["snapshot.bin.tmp", "active.log.tmp"])
@pytest.mark.parametrize("step", ["compact", "close"])
def test_a_planted_temp_file_symlink_is_never_followed(
    tmp_path: Path, name: str, step: str
) -> None:
    d = tmp_path / "data"
    victim = _victim(tmp_path)
    s = Store.open(d)
    msgs = [make_message(f"secret {i}") for i in range(5)]
    for m in msgs:
        s.put(m)
    os.symlink(victim, d / name)  # planted while the store is open (after the open's cleanup)
    if step == "compact":
        s.compact()
    s.close()
    assert victim.read_bytes() == b"precious"
    with Store.open(d) as s2:
        assert list(s2.messages.values()) == msgs
        assert s2.check() == []
        assert not os.path.lexists(d / name)  # removed, never followed
    assert victim.read_bytes() == b"precious"


def test_a_planted_lock_pid_symlink_is_replaced_not_written_through(tmp_path: Path) -> None:
    d = tmp_path / "data"
    Store.open(d).close()
    victim = _victim(tmp_path)
    os.symlink(victim, d / "lock.pid")
    with Store.open(d):
        assert not os.path.islink(d / "lock.pid")
        assert (d / "lock.pid").read_text().strip() == str(os.getpid())
    assert victim.read_bytes() == b"precious"


@pytest.mark.parametrize("name", ["lock", "active.log", "snapshot.bin"])
def test_a_planted_symlink_at_a_store_file_is_refused(tmp_path: Path, name: str) -> None:
    d = tmp_path / "data"
    with Store.open(d) as s:
        s.put(make_message("hello"))
    victim = _victim(tmp_path)
    real = d / name
    real.rename(tmp_path / "moved")
    os.symlink(victim, real)
    if name == "snapshot.bin":
        # an optional file: not followed, the log is replayed; a new snapshot replaces the link
        with Store.open(d) as s:
            assert s.stats().snapshot_valid is False and len(s.messages) == 1
    else:
        with pytest.raises(StoreIOError):
            Store.open(d)
    assert victim.read_bytes() == b"precious"


def test_convmem_serve_reports_an_unsafe_data_dir_in_one_clear_line(tmp_path: Path) -> None:
    d = tmp_path / "data"
    d.mkdir()
    os.chmod(d, 0o777)
    proc = subprocess.run(
        [sys.executable, *serve_args(d)],
        input=b"",
        capture_output=True,
        env=child_env(),
        timeout=60,
    )
    assert proc.returncode == 1 and proc.stdout == b""
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("convmem serve: IO_ERROR: ")
    assert "writable by group or others" in lines[0] and "chmod 700" in lines[0]


def test_the_app_names_an_unsafe_data_dir_not_a_disk_problem(tmp_path: Path) -> None:
    from convmem_app.shell.startup_error import describe

    d = tmp_path / "data"
    d.mkdir()
    os.chmod(d, 0o777)
    with pytest.raises(UnsafeDataDirError) as ei:
        Store.open(d)
    problem = describe(ei.value, d)
    assert problem.title == "The data folder is not private"
    assert "chmod 700" in problem.detail
    assert "disk space" not in problem.next_steps
