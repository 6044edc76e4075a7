"""The packaging checks that can run on Linux. All `slow`: `pytest -m slow tests/installer`.

- installer/convmem.spec builds the one-folder app with PyInstaller (or CONVMEM_FROZEN_DIST names
  a folder already built from it): three executables, resources, the unused Qt parts left out,
  a shim whose archive holds the standard library and convmem_app.{paths,shim} only, the
  app's and the command line's modules as bytecode files beside them;
- installer/smoke_frozen.py passes on it: frozen `serve` write + read through the SDK's stdio
  client, the frozen shim starting the frozen app offscreen, quit, reread;
- installer/convmem.nsi compiles with `makensis -WX` (stub files stand in for the Windows
  executables: PyInstaller cannot cross-build), and with a throwaway self-signed certificate its
  `!finalize` / `!uninstfinalize` hooks sign the installer and the uninstaller inside it, which
  `osslsigncode verify` accepts (and rejects once a byte is changed);
- under Wine (64-bit stub), the silent installer and uninstaller do what the script promises:
  files, shortcut, Run value, settings key, uninstall entry, "in use" refusal, data kept unless
  /DELETEDATA.

The Windows build itself (PyInstaller on Windows, the x86 installer on Windows) is not run here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.installer.installer_helpers import INSTALLER, ROOT, clean_env, need
from tests.installer.installer_helpers import throwaway_certificate as make_certificate

IS_WINDOWS = sys.platform == "win32"
EXE = ".exe" if IS_WINDOWS else ""
EXECUTABLES = tuple(name + EXE for name in ("ConvMem", "convmem-cli", "convmem-shim"))
SHIM_OWN_MODULES = {
    "convmem_app",
    "convmem_app.shim",
    "convmem_app.shim.launcher",
    "convmem_app.shim.paths",
    "convmem_app.shim.winapi",
}

pytestmark = pytest.mark.slow


# ---- the PyInstaller build -------------------------------------------------------------------


@pytest.fixture(scope="module")
def frozen_dist(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    given = os.environ.get("CONVMEM_FROZEN_DIST")
    if given:
        yield Path(given).resolve()
        return
    pytest.importorskip("PyInstaller", reason="pip install -e '.[build]'")
    work = tmp_path_factory.mktemp("pyinstaller")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "PyInstaller",
            "--noconfirm",
            "--log-level",
            "WARN",
            "--distpath",
            str(work / "dist"),
            "--workpath",
            str(work / "build"),
            str(INSTALLER / "convmem.spec"),
        ],
        cwd=ROOT,
        check=True,
    )
    yield work / "dist" / "ConvMem"
    shutil.rmtree(work, ignore_errors=True)


def test_one_folder_layout(frozen_dist: Path) -> None:
    for name in EXECUTABLES:
        path = frozen_dist / name
        assert path.is_file() and os.access(path, os.X_OK), name
    internal = frozen_dist / "_internal"
    resources = internal / "convmem_app" / "resources"
    assert (resources / "convmem.svg").is_file()
    assert sorted(p.name for p in resources.glob("convmem-*.png")) == sorted(
        p.name for p in (ROOT / "convmem_app" / "resources").glob("convmem-*.png")
    )
    # Qt's plugins: PySide6/Qt/plugins/libq*.so on Linux, PySide6/plugins/q*.dll on Windows.
    qt = internal / "PySide6" if IS_WINDOWS else internal / "PySide6" / "Qt"
    suffix, prefix = (".dll", "") if IS_WINDOWS else (".so", "lib")
    plugins = {
        p.relative_to(qt / "plugins").as_posix() for p in (qt / "plugins").rglob("*" + suffix)
    }

    def plugin(folder: str, name: str) -> str:
        return f"{folder}/{prefix}q{name}{suffix}"

    native = plugin("platforms", "windows" if IS_WINDOWS else "xcb")
    assert plugin("platforms", "offscreen") in plugins and native in plugins
    assert plugin("iconengines", "svgicon") in plugins
    assert {p for p in plugins if p.startswith("imageformats/")} == {
        plugin("imageformats", "ico"),
        plugin("imageformats", "svg"),
    }
    assert not any(p.startswith(("tls/", "networkinformation/")) for p in plugins)
    assert not (qt / "translations").exists()
    if IS_WINDOWS:  # Mesa's software OpenGL and the D3D shader compiler are left out
        assert not list(internal.rglob("opengl32sw.dll"))
        assert not list(internal.rglob("d3dcompiler_*.dll"))
    module = ".pyd" if IS_WINDOWS else ".abi3.so"
    for unused in ("mypy", "tkinter", f"PySide6/QtQml{module}", f"PySide6/QtDBus{module}"):
        assert not (internal / unused).exists(), unused


def _python_module(entry: Path) -> bool:
    """A module or package at the top of _internal (not a shared library, not package data)."""
    if entry.is_dir():
        return any((entry / f"__init__{suffix}").exists() for suffix in (".pyc", ".py"))
    return entry.suffix in {".pyc", ".py", ".pyd", ".so"}


def test_the_shim_carries_only_the_standard_library(frozen_dist: Path, tmp_path: Path) -> None:
    """The three executables read their modules as .pyc files from the shared _internal folder
    (noarchive): none is in an archive of theirs. The shim needs only the standard library and
    its own modules: a copy of the folder without any other Python module (no engine, no SDK, no
    Qt, no app) still runs it: it starts, finds no app, says so and exits 1. (The spec checks
    the same on the shim's analysis at build time.)"""
    from PyInstaller.archive.readers import CArchiveReader

    for name in ("ConvMem", "convmem-cli", "convmem-shim"):
        archive = CArchiveReader(str(frozen_dist / (name + EXE)))
        assert archive.open_embedded_archive("PYZ.pyz").toc == {}, name
        if name == "convmem-shim":
            assert not any(entry.startswith("pyi_rth_") for entry in archive.toc)
    internal = frozen_dist / "_internal"
    for module in (
        "convmem_app/shell/app.pyc",
        "convmem_engine/mcp/__init__.pyc",
        "mcp/__init__.pyc",
        "convmem_app/shim/launcher.pyc",
    ):
        assert (internal / module).is_file(), module
    assert not (internal / "base_library.zip").exists()

    kept = sys.stdlib_module_names | {"__future__", "convmem_app"}

    def leave_out(folder: str, names: list[str]) -> set[str]:
        here = Path(folder)
        if here == internal:
            return {n for n in names if _python_module(here / n) and n.split(".")[0] not in kept}
        if here == internal / "convmem_app":
            return {n for n in names if n not in {"__init__.pyc", "shim"}}
        return set()

    pruned = tmp_path / "ConvMem"
    shutil.copytree(frozen_dist, pruned, symlinks=True, ignore=leave_out)
    for gone in ("mcp", "convmem_engine", "pydantic", "PySide6", "convmem_app/shell"):
        assert not (pruned / "_internal" / gone).exists(), gone
    env = clean_env()
    if not IS_WINDOWS:
        env["XDG_RUNTIME_DIR"] = str(tmp_path / "run")
        (tmp_path / "run").mkdir(mode=0o700)
    done = subprocess.run(
        [
            str(pruned / ("convmem-shim" + EXE)),
            "--data-dir",
            str(tmp_path / "data"),
            "--start-timeout",
            "0",
        ],
        input="",
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "no ConvMem app is running" in done.stderr, done.stderr


def test_serve_starts_without_qt(frozen_dist: Path) -> None:
    """The app's and command line's executables leave out PyInstaller's PySide6 run-time hook
    (it imports QtCore at every start, `serve` included), the command line also the inspect and
    pkgutil hooks; anyio's sources are shipped (its lazy imports parse them; without them it
    imports every submodule) with their bytecode in __pycache__, so no start compiles them."""
    import importlib.util

    from PyInstaller.archive.readers import CArchiveReader

    for name in ("ConvMem", "convmem-cli"):
        scripts = {
            entry
            for entry, (*_sizes, kind) in CArchiveReader(
                str(frozen_dist / (name + EXE))
            ).toc.items()
            if kind == "s"
        }
        assert "pyi_rth_pyside6" not in scripts and "pyi_rth_multiprocessing" not in scripts
        assert "convmem_main" in scripts
        # No archive, so Python's own path finder instead of PyInstaller's wrapper around it.
        assert "pyi_rth_convmem_plain_finder" in scripts
        if name == "convmem-cli":
            assert "pyi_rth_inspect" not in scripts and "pyi_rth_pkgutil" not in scripts
    anyio = frozen_dist / "_internal" / "anyio"
    sources = sorted(anyio.rglob("*.py"))
    assert anyio / "__init__.py" in sources and anyio / "_core" / "_eventloop.py" in sources
    for source in sources:
        # Beside a .py file Python's finder takes the source: no .pyc may sit next to it.
        assert not source.with_suffix(".pyc").exists(), source
        cache = Path(importlib.util.cache_from_source(str(source)))
        header = cache.read_bytes()[:8]
        assert header[:4] == importlib.util.MAGIC_NUMBER, cache
        # PEP 552 flags: 0b01 hash-based, 0b10 check the source: loaded without a look at it.
        assert int.from_bytes(header[4:8], "little") == 0b01, cache


def test_frozen_programs_smoke(frozen_dist: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(INSTALLER / "smoke_frozen.py"), str(frozen_dist)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "smoke test passed"
    assert sum(line.startswith("ok  ") for line in lines) == 6


# ---- NSIS and Authenticode -------------------------------------------------------------------


@pytest.fixture
def stub_dist(tmp_path: Path) -> Path:
    """Where the Windows build would be: stub files named like its executables and runtime."""
    dist = tmp_path / "dist" / "ConvMem"
    (dist / "_internal" / "PySide6").mkdir(parents=True)
    for name in (
        "ConvMem.exe",
        "convmem-cli.exe",
        "convmem-shim.exe",
        "_internal/python311.dll",
        "_internal/PySide6/Qt6Core.dll",
    ):
        (dist / name).write_bytes(b"stub for " + name.encode() + b"\n" + os.urandom(4096))
    return dist


@pytest.fixture
def throwaway_certificate(tmp_path: Path) -> dict[str, str]:
    return make_certificate(tmp_path / "cert")


def _makensis(dist: Path, outfile: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "makensis",
            "-WX",
            "-V2",
            f"-DDIST={dist}",
            f"-DOUTFILE={outfile}",
            "installer/convmem.nsi",  # as build_windows.ps1 runs it; makensis cds to installer/
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _verify(path: Path, cafile: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["osslsigncode", "verify", "-CAfile", cafile, "-in", str(path)],
        capture_output=True,
        text=True,
    )


def test_nsis_script_compiles_unsigned(stub_dist: Path, tmp_path: Path) -> None:
    need("makensis", "osslsigncode")
    outfile = tmp_path / "ConvMem-setup.exe"
    done = _makensis(stub_dist, outfile, clean_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert outfile.read_bytes()[:2] == b"MZ"
    assert "sign.sh" not in done.stdout  # no certificate configured: no signing hook
    unsigned = subprocess.run(
        ["osslsigncode", "verify", "-in", str(outfile)], capture_output=True, text=True
    )
    assert unsigned.returncode != 0


def test_nsis_refuses_a_missing_build(tmp_path: Path) -> None:
    need("makensis")
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _makensis(empty, tmp_path / "x.exe", clean_env())
    assert done.returncode != 0
    assert "build the app first" in done.stdout + done.stderr


def test_nsis_signs_installer_and_uninstaller(
    stub_dist: Path, tmp_path: Path, throwaway_certificate: dict[str, str]
) -> None:
    need("makensis", "osslsigncode")
    outfile = tmp_path / "ConvMem-setup.exe"
    env = clean_env() | throwaway_certificate
    done = _makensis(stub_dist, outfile, env)
    assert done.returncode == 0, done.stdout + done.stderr
    signed = [line for line in done.stdout.splitlines() if line.startswith("sign.sh: signed ")]
    assert len(signed) == 2, done.stdout  # the uninstaller (a temporary file), then the installer
    assert signed[-1] == f"sign.sh: signed {outfile}"
    cafile = throwaway_certificate["CONVMEM_SIGN_CAFILE"]
    verified = _verify(outfile, cafile)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "CN=ConvMem throwaway test signer" in verified.stdout

    tampered = tmp_path / "tampered.exe"
    data = bytearray(outfile.read_bytes())
    data[len(data) // 3] ^= 0xFF  # inside the packed files, covered by the signature
    tampered.write_bytes(bytes(data))
    assert _verify(tampered, cafile).returncode != 0

    if shutil.which("7z") is None:
        return  # the uninstaller's own signature was verified by sign.sh (CONVMEM_SIGN_CAFILE)
    unpacked = tmp_path / "unpacked"
    subprocess.run(
        ["7z", "x", f"-o{unpacked}", str(outfile)], check=True, capture_output=True, timeout=120
    )
    uninstaller = unpacked / "Uninstall ConvMem.exe"
    verified = _verify(uninstaller, cafile)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    for name in ("ConvMem.exe", "convmem-cli.exe", "convmem-shim.exe", "_internal/python311.dll"):
        assert (unpacked / name).read_bytes() == (stub_dist / name).read_bytes()


def test_a_failing_signature_fails_the_build(
    stub_dist: Path, tmp_path: Path, throwaway_certificate: dict[str, str]
) -> None:
    need("makensis", "osslsigncode")
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not the password")
    env = clean_env() | throwaway_certificate | {"CONVMEM_SIGN_PASSWORD_FILE": str(wrong)}
    done = _makensis(stub_dist, tmp_path / "ConvMem-setup.exe", env)
    assert done.returncode != 0
    assert "sign.sh: signed" not in done.stdout


# ---- the installer running under Wine ---------------------------------------------------------


def _wine_dir() -> Path:
    for candidate in (shutil.which("wine64"), "/usr/lib/wine/wine64"):
        if candidate and Path(candidate).is_file():
            return Path(candidate).parent
    pytest.skip("wine64 is not installed (apt-get install wine64)")


class Wine:
    """A private 64-bit Wine prefix (no display: silent installs only)."""

    def __init__(self, prefix: Path) -> None:
        self.env = clean_env() | {
            "WINEPREFIX": str(prefix),
            "WINEDEBUG": "-all",
            "PATH": f"{_wine_dir()}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        self.env.pop("DISPLAY", None)
        self.env.pop("WAYLAND_DISPLAY", None)
        self.run("wineboot", "--init")
        self.profile = prefix / "drive_c" / "users" / os.environ.get("USER", "root")
        if not self.profile.is_dir():
            self.profile = next(
                p for p in (prefix / "drive_c" / "users").iterdir() if p.name != "Public"
            )
        self.programs = self.profile / "AppData" / "Local" / "Programs" / "ConvMem"
        self.data = self.profile / "AppData" / "Local" / "ConvMem"
        self.settings = self.profile / "AppData" / "Roaming" / "ConvMem"

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["wine64", *args], capture_output=True, text=True, env=self.env, timeout=180
        )
        subprocess.run(["wineserver", "-w"], env=self.env, timeout=180)  # until all have ended
        if check:
            assert done.returncode == 0, (args, done.returncode, done.stdout, done.stderr)
        return done

    def reg_value(self, key: str, name: str) -> str | None:
        done = self.run("reg", "query", key, "/v", name, check=False)
        for line in done.stdout.replace("\r", "").splitlines():
            parts = line.split(None, 2)
            if len(parts) == 3 and parts[0] == name:
                return parts[2]
        return None

    def close(self) -> None:
        subprocess.run(["wineserver", "-k"], env=self.env, timeout=60)


def _wait_for_windows_process(name: str, timeout: float = 60.0) -> None:
    """Until a Wine process runs `name`: Wine sets the process's argv[0] to the executable's
    path once it has loaded it (before, argv[0] is the `wine64` launcher)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0]
                except OSError:
                    continue
                if argv0.endswith((b"/" + name.encode(), b"\\" + name.encode())):
                    return
        time.sleep(0.1)
    raise AssertionError(f"no Wine process runs {name}")


RUN_KEY = r"HKCU\Software\Microsoft\Windows\CurrentVersion\Run"
UNINSTALL_KEY = r"HKCU\Software\Microsoft\Windows\CurrentVersion\Uninstall\ConvMem"


@pytest.fixture
def wine(tmp_path: Path) -> Iterator[Wine]:
    _wine_dir()
    prefix = Wine(tmp_path / "wineprefix")
    yield prefix
    prefix.close()


def test_installer_and_uninstaller_run_under_wine(
    stub_dist: Path, tmp_path: Path, wine: Wine
) -> None:
    """The compiled script's logic, run for real: 64-bit stub (`-DTARGET=amd64-unicode`, as
    Debian's Wine is 64-bit only); the shipped x86-unicode stub runs the same script."""
    need("makensis")
    setup = tmp_path / "ConvMem-setup.exe"
    done = subprocess.run(
        [
            "makensis",
            "-WX",
            "-V2",
            "-DTARGET=amd64-unicode",
            f"-DDIST={stub_dist}",
            f"-DOUTFILE={setup}",
            "installer/convmem.nsi",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr

    # Install, with "start when I sign in".
    wine.run(str(setup), "/S", "/AUTOSTART")
    for name in ("ConvMem.exe", "convmem-cli.exe", "convmem-shim.exe", "_internal/python311.dll"):
        assert (wine.programs / name).read_bytes() == (stub_dist / name).read_bytes()
    assert (wine.programs / "Uninstall ConvMem.exe").is_file()
    start_menu = wine.profile / "AppData/Roaming/Microsoft/Windows/Start Menu/Programs"
    assert (start_menu / "ConvMem.lnk").is_file()
    run_value = wine.reg_value(RUN_KEY, "ConvMem")
    assert run_value is not None and run_value.endswith(r'\ConvMem\ConvMem.exe" --minimized')
    ini = (wine.settings / "ConvMem.ini").read_text(encoding="utf-8")
    assert ini.splitlines() == ["[General]", "startAtLogin=true"]
    assert wine.reg_value(UNINSTALL_KEY, "DisplayVersion") is not None

    # The user's data, and a file of theirs in the program folder.
    wine.data.mkdir()
    (wine.data / "active.log").write_bytes(b"memories")
    (wine.programs / "notes.txt").write_text("mine")

    # A running ConvMem.exe (Wine's ping.exe stands in) blocks an update; without it, it works.
    running = wine.programs / "ConvMem.exe"
    shutil.copyfile(wine.profile.parent.parent / "windows" / "system32" / "ping.exe", running)
    pinger = subprocess.Popen(
        ["wine64", str(running), "-n", "120", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=wine.env,
    )
    try:
        _wait_for_windows_process("ConvMem.exe")
        blocked = subprocess.run(
            ["wine64", str(setup), "/S"], capture_output=True, env=wine.env, timeout=180
        )
        assert blocked.returncode == 2  # aborted: "ConvMem.exe is in use"
        assert running.read_bytes() != (stub_dist / "ConvMem.exe").read_bytes()
    finally:
        pinger.kill()
        wine.close()
        pinger.wait()
    wine.run(str(setup), "/S")
    assert running.read_bytes() == (stub_dist / "ConvMem.exe").read_bytes()

    # The data folder is never an install folder, also silently.
    data_dir = rf"C:\users\{wine.profile.name}\AppData\Local\ConvMem"
    refused = wine.run(str(setup), "/S", f"/D={data_dir}", check=False)
    assert refused.returncode == 2
    assert sorted(p.name for p in wine.data.iterdir()) == ["active.log"]

    # A silent uninstall removes the program and keeps the memories, settings and user files.
    wine.run(str(wine.programs / "Uninstall ConvMem.exe"), "/S")
    assert sorted(p.name for p in wine.programs.iterdir()) == ["notes.txt"]
    assert not (start_menu / "ConvMem.lnk").exists()
    assert wine.reg_value(RUN_KEY, "ConvMem") is None
    assert wine.reg_value(UNINSTALL_KEY, "DisplayVersion") is None
    assert (wine.data / "active.log").read_bytes() == b"memories"
    assert (wine.settings / "ConvMem.ini").is_file()

    # /DELETEDATA (the "Also delete my memories and settings" box) removes them too.
    wine.run(str(setup), "/S")
    wine.run(str(wine.programs / "Uninstall ConvMem.exe"), "/S", "/DELETEDATA")
    assert not wine.data.exists() and not wine.settings.exists()
    assert (wine.programs / "notes.txt").read_text() == "mine"
