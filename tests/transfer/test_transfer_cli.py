"""`convmem export` / `convmem import` as users run them: real subprocesses on real files."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from export_samples import chatgpt_export, claude_export, write_json

from convmem_engine.service import MemoryService


def convmem(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "convmem_app", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_import_into_a_new_data_dir_dry_run_first(tmp_path: Path) -> None:
    src = tmp_path / "conversations.json"
    write_json(src, claude_export(5, 6))
    data = tmp_path / "new" / "data"
    dry = convmem("import", "--data-dir", data, "--dry-run", src)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("claude: would store 30 messages in 5 conversations; skipped 0")
    assert not (tmp_path / "new").exists()  # a dry run creates nothing
    real = convmem("import", "--data-dir", data, src)
    assert real.returncode == 0, real.stderr
    assert real.stdout.startswith("claude: stored 30 messages in 5 conversations")
    before = tree_digest(data)
    with MemoryService.open(data):  # the app is running: a dry run still works, on a copy
        look = convmem("import", "--data-dir", data, "--dry-run", src)
    assert look.returncode == 0, look.stderr
    assert (
        "would store 0 messages" in look.stdout
        and "skipped 30: already in the store" in look.stdout
    )
    assert tree_digest(data) == before
    again = convmem("import", "--data-dir", data, "--format", "claude", src)
    assert (
        "stored 0 messages" in again.stdout and "skipped 30: already in the store" in again.stdout
    )
    with MemoryService.open(data) as svc:
        assert svc.get_system_health()["active_messages"] == 30
        assert svc.check() == []


def test_export_changes_nothing_and_round_trips(tmp_path: Path) -> None:
    src = tmp_path / "conversations.json"
    write_json(src, chatgpt_export(4, 5))
    data = tmp_path / "data"
    assert convmem("import", "--data-dir", data, src).returncode == 0
    before = tree_digest(data)
    out = convmem("export", "--data-dir", data, "--format", "jsonl", tmp_path / "all.jsonl")
    assert out.returncode == 0, out.stderr
    assert "exported 20 messages of 4 sessions" in out.stdout
    md = convmem("export", "--data-dir", data, "--format", "markdown", tmp_path / "md")
    assert md.returncode == 0 and len(os.listdir(tmp_path / "md")) == 4
    assert tree_digest(data) == before
    back = convmem("import", "--data-dir", tmp_path / "copy", tmp_path / "all.jsonl")
    assert "jsonl: stored 20 messages in 4 conversations" in back.stdout


def test_errors_are_one_line_and_exit_1(tmp_path: Path) -> None:
    missing = convmem(
        "export", "--data-dir", tmp_path / "nope", "--format", "jsonl", tmp_path / "x"
    )
    assert (missing.returncode, missing.stderr) == (1, "convmem export: data dir: does not exist\n")
    bad = tmp_path / "bad.txt"
    bad.write_text("hello", encoding="utf-8")
    r = convmem("import", "--data-dir", tmp_path / "d", bad)
    assert r.returncode == 1 and "not a format this version can read" in r.stderr
    assert "hello" not in r.stderr
    held = tmp_path / "held"
    with MemoryService.open(held):  # the app runs on it
        busy = convmem("export", "--data-dir", held, "--format", "jsonl", tmp_path / "o.jsonl")
    assert busy.returncode == 1
    assert busy.stderr.endswith("quit the app first, or use File > Export in its memory browser\n")
    usage = convmem("import", "--format", "word", bad)
    assert usage.returncode == 2


def test_an_import_killed_half_way_and_run_again_stores_each_message_once(tmp_path: Path) -> None:
    src = tmp_path / "conversations.json"
    write_json(src, chatgpt_export(750, 16))  # 12,000 messages
    data = tmp_path / "data"
    log = data / "active.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "convmem_app", "import", "--data-dir", str(data), str(src)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if log.exists() and log.stat().st_size > 400_000:  # some batches are in
                break
            time.sleep(0.01)
        if proc.poll() is not None:
            pytest.skip("the import finished before it could be killed (machine too fast)")
        proc.send_signal(signal.SIGKILL if os.name != "nt" else signal.SIGTERM)
    finally:
        proc.wait(60)
    with MemoryService.open(data) as svc:
        partial = svc.get_system_health()["active_messages"]
    assert 0 < partial < 12_000
    rerun = convmem("import", "--data-dir", data, src)
    assert rerun.returncode == 0, rerun.stderr
    assert f"stored {12_000 - partial} messages" in rerun.stdout
    with MemoryService.open(data) as svc:
        assert svc.get_system_health()["active_messages"] == 12_000
        assert svc.check() == []
