"""In a bundled build (installer/convmem.spec) the shim and "Start at login" start the windowed
tray app `ConvMem[.exe]` from the folder of the running executable, whichever ConvMem
executable that is; from source they run `python -m convmem_app app`. (The frozen processes
themselves are exercised by the slow tests in test_packaging.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from convmem_app.shell import autostart
from convmem_app.shim import launcher as shim

APP = "ConvMem.exe" if sys.platform == "win32" else "ConvMem"


@pytest.mark.parametrize("running", ["convmem-shim", "convmem-cli", "ConvMem"])
def test_frozen_builds_start_the_bundled_app(
    running: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "Programs" / "ConvMem"
    folder.mkdir(parents=True)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", str(folder / running))
    data_dir = tmp_path / "data"
    expected = [str(folder.resolve() / APP), "--minimized", "--data-dir", str(data_dir)]
    assert shim.app_command(data_dir) == expected
    assert autostart.app_command(data_dir) == expected


def test_from_source_the_app_runs_as_a_module(tmp_path: Path) -> None:
    assert not getattr(sys, "frozen", False)
    data_dir = tmp_path / "data"
    tail = ["app", "--minimized", "--data-dir", str(data_dir)]
    assert shim.app_command(data_dir) == [sys.executable, "-m", "convmem_app", *tail]
    assert autostart.app_command(data_dir) == [sys.executable, "-m", "convmem_app", *tail]


def test_the_spec_and_the_installer_use_the_same_names() -> None:
    root = Path(__file__).resolve().parent.parent.parent
    spec = (root / "installer" / "convmem.spec").read_text(encoding="utf-8")
    nsi = (root / "installer" / "convmem.nsi").read_text(encoding="utf-8")
    assert 'APP_NAME = "ConvMem"' in spec and '!define APP_EXE "ConvMem.exe"' in nsi
    assert 'SHIM_NAME = "convmem-shim"' in spec and '!define SHIM_EXE "convmem-shim.exe"' in nsi
    assert 'CLI_NAME = "convmem-cli"' in spec and '!define CLI_EXE "convmem-cli.exe"' in nsi
    assert shim.FROZEN_APP_NAME.removesuffix(".exe") == "ConvMem"
    assert f'!define RUN_VALUE "{autostart.ENTRY_NAME}"' in nsi
    assert autostart.RUN_KEY in nsi
