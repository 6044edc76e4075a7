"""Shared by the installer tests: tools they need, a throwaway code-signing certificate, and a
minimal Windows executable to sign."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
INSTALLER = ROOT / "installer"


def need(*tools: str) -> None:
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (apt-get install nsis osslsigncode)")


def clean_env() -> dict[str, str]:
    """Our environment without any signing configuration of the machine's own."""
    return {k: v for k, v in os.environ.items() if not k.startswith("CONVMEM_SIGN_")}


def throwaway_certificate(folder: Path) -> dict[str, str]:
    """A self-signed code-signing certificate valid for two days, as sign.sh expects it (a
    PKCS#12 file and a password file), plus the certificate as a CA file for verifying."""
    need("openssl")
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-sha256",
            "-days",
            "2",
            "-nodes",
            "-subj",
            "/CN=ConvMem throwaway test signer",
            "-addext",
            "extendedKeyUsage=codeSigning",
            "-addext",
            "keyUsage=digitalSignature",
            "-keyout",
            str(folder / "key.pem"),
            "-out",
            str(folder / "cert.pem"),
        ],
        check=True,
        capture_output=True,
    )
    (folder / "password").write_text("throwaway")
    subprocess.run(
        [
            "openssl",
            "pkcs12",
            "-export",
            "-inkey",
            str(folder / "key.pem"),
            "-in",
            str(folder / "cert.pem"),
            "-out",
            str(folder / "cert.pfx"),
            "-passout",
            f"file:{folder / 'password'}",
        ],
        check=True,
        capture_output=True,
    )
    return {
        "CONVMEM_SIGN_PFX": str(folder / "cert.pfx"),
        "CONVMEM_SIGN_PASSWORD_FILE": str(folder / "password"),
        "CONVMEM_SIGN_CAFILE": str(folder / "cert.pem"),
    }


FILE_ALIGNMENT = 0x200
CODE_OFFSET = FILE_ALIGNMENT  # the one section's raw data follows the headers


def minimal_pe(code: bytes = b"\xc3") -> bytes:
    """A valid x64 console executable of 1 KiB: DOS header, PE32+ headers, one `.text` section
    holding `code` (default: `ret`). Enough for Authenticode tools to sign and verify."""
    dos = b"MZ" + bytes(0x3A) + struct.pack("<I", 0x40)
    coff = struct.pack("<HHIIIHH", 0x8664, 1, 0, 0, 0, 240, 0x0022)
    optional = struct.pack(
        "<HBBIIIIIQIIHHHHHHIIIIHHQQQQII",
        0x20B,  # PE32+
        14,
        0,
        FILE_ALIGNMENT,  # size of code
        0,
        0,
        0x1000,  # entry point
        0x1000,  # base of code
        0x140000000,  # image base
        0x1000,  # section alignment
        FILE_ALIGNMENT,
        6,
        0,
        0,
        0,
        6,
        0,
        0,
        0x2000,  # size of image
        FILE_ALIGNMENT,  # size of headers
        0,  # checksum
        3,  # console subsystem
        0x8160,  # NX, dynamic base, high-entropy VA, terminal-server aware
        0x100000,
        0x1000,
        0x100000,
        0x1000,
        0,
        16,  # data directories
    ) + bytes(16 * 8)
    section = b".text\0\0\0" + struct.pack(
        "<IIIIIIHHI", len(code), 0x1000, FILE_ALIGNMENT, CODE_OFFSET, 0, 0, 0, 0, 0x60000020
    )
    headers = dos + b"PE\0\0" + coff + optional + section
    assert len(optional) == 240 and len(headers) <= FILE_ALIGNMENT
    body = code + bytes(FILE_ALIGNMENT - len(code))
    return headers + bytes(FILE_ALIGNMENT - len(headers)) + body
