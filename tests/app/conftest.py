"""Fixtures for the app tests: a private socket directory and settings folder per test, and a
real `convmem app` process."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from app_helpers import RunningApp, control, start_app, wait_gone, wait_listening


@pytest.fixture(autouse=True)
def private_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Sockets in a short fresh directory (socket paths must stay under ~100 bytes); Qt settings
    and autostart entries under the test's own config folder."""
    runtime = Path(tempfile.mkdtemp(prefix="cmrt", dir="/tmp"))
    runtime.chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("CONVMEM_DATA_DIR", raising=False)
    yield runtime
    shutil.rmtree(runtime, ignore_errors=True)


@pytest.fixture
def running_app(tmp_path: Path) -> Iterator[RunningApp]:
    data_dir = tmp_path / "data"
    log = tmp_path / "app.log"
    process = start_app(data_dir, log, "--minimized")
    app = RunningApp(process, data_dir, log)
    try:
        wait_listening(data_dir)
        yield app
    finally:
        if process.poll() is None:
            control(data_dir, "quit")
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        wait_gone(process.pid)
