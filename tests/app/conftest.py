"""Fixtures for the app tests: a private socket directory and settings folder per test, and a
real `convmem app` process."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from app_helpers import RunningApp, control, start_app, wait_gone, wait_listening


@pytest.fixture(autouse=True)
def private_dirs(tmp_path: Path, short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Sockets in a short fresh directory (socket paths must stay under ~100 bytes; Windows uses
    named pipes and ignores it); Qt settings and autostart entries under the test's own config
    folder."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_tmp))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("CONVMEM_DATA_DIR", raising=False)
    return short_tmp


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
