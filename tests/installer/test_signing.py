"""The Authenticode signing path, re-proved by every run of the default suite (fast: one small
executable, no NSIS): installer/sign.sh signs with osslsigncode and a throwaway self-signed
certificate, `osslsigncode verify` accepts the result and rejects it once a byte changes, and a
release (CONVMEM_SIGN_REQUIRE_TIMESTAMP=1) refuses to sign without a timestamp server or when the
server does not answer. The NSIS hooks that call the same script are in test_packaging.py (slow);
signtool (thumbprint, Artifact Signing) runs in .github/workflows/release.yml only."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from tests.installer.installer_helpers import (
    CODE_OFFSET,
    INSTALLER,
    clean_env,
    minimal_pe,
    need,
    throwaway_certificate,
)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    need("openssl", "osslsigncode")
    return throwaway_certificate(tmp_path_factory.mktemp("cert"))


def sign(files: list[Path], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(INSTALLER / "sign.sh"), *map(str, files)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def verify(path: Path, cafile: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["osslsigncode", "verify", "-CAfile", cafile, "-in", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_sign_verify_and_a_changed_byte_fails(tmp_path: Path, certificate: dict[str, str]) -> None:
    exe = tmp_path / "convmem-shim.exe"
    exe.write_bytes(minimal_pe())
    assert verify(exe, certificate["CONVMEM_SIGN_CAFILE"]).returncode != 0  # not signed yet

    done = sign([exe], clean_env() | certificate)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"sign.sh: signed {exe}\n"
    signed = exe.read_bytes()
    assert signed[: len(minimal_pe())] != minimal_pe()  # the checksum and certificate table
    verified = verify(exe, certificate["CONVMEM_SIGN_CAFILE"])
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "Subject: /CN=ConvMem throwaway test signer" in verified.stdout
    assert "Signature verification: ok" in verified.stdout

    tampered = tmp_path / "tampered.exe"
    data = bytearray(signed)
    data[CODE_OFFSET] ^= 0xFF  # the code (`ret` becomes something else)
    tampered.write_bytes(bytes(data))
    failed = verify(tampered, certificate["CONVMEM_SIGN_CAFILE"])
    assert failed.returncode != 0
    assert "MISMATCH" in failed.stdout


def test_another_certificate_does_not_verify(tmp_path: Path, certificate: dict[str, str]) -> None:
    exe = tmp_path / "ConvMem.exe"
    exe.write_bytes(minimal_pe(b"\x90\xc3"))
    assert sign([exe], clean_env() | certificate).returncode == 0
    stranger = throwaway_certificate(tmp_path / "stranger")
    assert verify(exe, stranger["CONVMEM_SIGN_CAFILE"]).returncode != 0


def test_a_release_needs_a_timestamp(tmp_path: Path, certificate: dict[str, str]) -> None:
    exe = tmp_path / "ConvMem.exe"
    exe.write_bytes(minimal_pe())
    release = clean_env() | certificate | {"CONVMEM_SIGN_REQUIRE_TIMESTAMP": "1"}
    done = sign([exe], release)
    assert done.returncode == 2
    assert "no CONVMEM_SIGN_TIMESTAMP_URL" in done.stderr
    assert exe.read_bytes() == minimal_pe()

    # A timestamp server that does not answer fails the signing (a loopback port nobody holds).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = sign([exe], release | {"CONVMEM_SIGN_TIMESTAMP_URL": f"http://127.0.0.1:{port}/"})
    assert done.returncode != 0
    assert "sign.sh: signed" not in done.stdout
    assert exe.read_bytes() == minimal_pe()


def test_sign_sh_refuses_without_a_certificate(tmp_path: Path) -> None:
    need("sh")
    target = tmp_path / "x.exe"
    target.write_bytes(b"MZ")
    done = subprocess.run(
        ["sh", str(INSTALLER / "sign.sh"), str(target)],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert done.returncode == 2
    assert "CONVMEM_SIGN_PFX is not set" in done.stderr
    assert target.read_bytes() == b"MZ"
