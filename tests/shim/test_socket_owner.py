"""The shim talks only to an app of its own user. Another local user can guess the endpoint's
name; on Linux/macOS the shim checks the socket directory (ours, mode 700), the socket file
(ours) and the peer credentials of the process serving it (our uid), and refuses otherwise with
a clear message. The refusals are proved with a second user: these tests run as root and drop
a real server process to `nobody` (skipped when not root). (Windows' check, the pipe server's
token SID, is in test_windows_paths.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from convmem_app.shim import launcher as shim
from convmem_app.shim.paths import endpoint

ROOT = Path(__file__).resolve().parent.parent.parent
NOBODY = 65534

pytestmark = [
    pytest.mark.posix,
    pytest.mark.skipif(
        not hasattr(os, "geteuid") or os.geteuid() != 0,
        reason="needs root to act as a second user (Linux/macOS)",
    ),
]


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    folder.chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    return folder


def run_shim(data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVMEM_")}
    env["PYTHONPATH"] = str(ROOT)
    command = ["-m", "convmem_app", "shim", "--data-dir", str(data_dir), "--start-timeout", "0"]
    return subprocess.run(
        [sys.executable, *command],
        input="",
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


ROGUE_SERVER = """
import os, socket, sys
path, uid = sys.argv[1], int(sys.argv[2])
server = socket.socket(socket.AF_UNIX)
server.bind(path)           # as root: the socket file is root's, like a real app's would be ours
os.setgid(uid)
os.setuid(uid)              # ... but the process serving it is now another user's
server.listen()             # the peer credentials are those of the listen() call
print("listening", flush=True)
while True:
    conn, _ = server.accept()
    conn.sendall(b'{"jsonrpc":"2.0","id":1,"result":{"stolen":true}}\\n')
"""


@pytest.fixture
def rogue_server(runtime: Path, tmp_path: Path) -> Iterator[Path]:
    """A process of user `nobody` serving the endpoint of `tmp_path / "data"`."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    path = endpoint(data_dir.resolve())
    server = subprocess.Popen(
        [sys.executable, "-c", ROGUE_SERVER, path, str(NOBODY)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    try:
        assert server.stdout.readline() == "listening\n"
        yield data_dir
    finally:
        server.kill()
        server.wait()
        server.stdout.close()


def test_a_socket_served_by_another_user_is_refused(rogue_server: Path) -> None:
    done = run_shim(rogue_server)
    assert done.returncode == 1
    assert done.stdout == ""  # nothing of the impostor's reached the host
    line = done.stderr.strip()
    assert line.startswith("convmem-shim: refusing the socket ")
    assert f"it belongs to a process of uid {NOBODY}, not to you" in line
    assert "another --data-dir" in line


def test_the_peer_credentials_name_the_serving_user(rogue_server: Path) -> None:
    import socket

    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(endpoint(rogue_server.resolve()))
        assert shim.peer_uid(sock) == NOBODY
    left, right = socket.socketpair()
    with left, right:
        assert shim.peer_uid(left) == os.getuid()


def test_a_socket_file_of_another_user_is_refused(runtime: Path, tmp_path: Path) -> None:
    import socket

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    path = endpoint(data_dir.resolve())
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen()
        os.chown(path, NOBODY, NOBODY)
        done = run_shim(data_dir)
    assert done.returncode == 1
    assert f"refusing the socket {path}: it belongs to uid {NOBODY}" in done.stderr


def test_a_socket_directory_of_another_user_is_refused(runtime: Path, tmp_path: Path) -> None:
    planted = runtime / "convmem"
    planted.mkdir(mode=0o700)
    os.chown(planted, NOBODY, NOBODY)
    done = run_shim(tmp_path / "data")
    assert done.returncode == 1
    assert "is not a directory owned by this user" in done.stderr
    assert str(planted) in done.stderr


def test_a_socket_directory_others_may_write_is_refused(runtime: Path, tmp_path: Path) -> None:
    import socket

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    path = endpoint(data_dir.resolve())
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen()
        Path(path).parent.chmod(0o777)
        with pytest.raises(shim.ShimError, match="other users may write to it \\(mode 777"):
            shim.check_socket_file(path, os.getuid())
        Path(path).parent.chmod(0o700)
        shim.check_socket_file(path, os.getuid())  # ours and private: fine
