"""A real full disk: the data dir on a tiny tmpfs, written until the kernel says ENOSPC.

What a user must be able to count on: the write that does not fit is refused with IO_ERROR and
not acknowledged, nothing acknowledged before it is lost, a compaction that does not fit
leaves the old state whole, and once space is freed the same store takes writes again.

Linux only (marked `linux`) and needs root (to mount a tmpfs); skipped elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from convmem_engine.domain import StoreIOError
from convmem_engine.service import MemoryService
from tests.mcp.mcp_helpers import call, payload, serve_client

pytestmark = pytest.mark.linux  # mounts a tmpfs

SIZE_KIB = 256


def _mount(path: Path, size_kib: int, *, remount: bool = False) -> bool:
    options = f"size={size_kib}k,mode=0700"
    args = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)]
    if remount:
        args = ["mount", "-o", f"remount,{options}", str(path)]
    return subprocess.run(args, capture_output=True).returncode == 0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if not _mount(mount_point, SIZE_KIB):
        pytest.skip("this machine does not allow mounting a tmpfs")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(service: MemoryService) -> tuple[dict[str, str], StoreIOError]:
    """Write 1 KiB messages until the disk refuses one; return what was acknowledged."""
    acknowledged: dict[str, str] = {}
    for i in range(10_000):
        content = f"message {i:05d} " + "x" * 1000
        try:
            result = service.write_message(session_id="full", role="user", content=content)
        except StoreIOError as error:
            return acknowledged, error
        acknowledged[result["message"]["message_id"]] = content
    raise AssertionError("the disk never filled up")


def _history(service: MemoryService) -> dict[str, str]:
    out: dict[str, str] = {}
    cursor = None
    while True:
        page = service.read_messages(session_id="full", limit=1000, cursor=cursor)
        out.update((m["message_id"], m["content"]) for m in page["history"])
        cursor = page.get("nextCursor")
        if cursor is None:
            return out


def test_full_disk_refuses_the_write_and_keeps_everything_acknowledged(small_disk: Path) -> None:
    data_dir = small_disk / "store"
    service = MemoryService.open(data_dir)
    try:
        acknowledged, error = _fill(service)
        assert acknowledged, "not even one write fitted"
        assert error.code == "IO_ERROR"
        assert "No space left on device" in error.message
        assert "x" * 50 not in error.message  # never echoes the content

        # The refused write is not visible, the store still answers, and says it is degraded.
        assert _history(service) == acknowledged
        health = service.get_system_health()
        assert health["active_messages"] == len(acknowledged)
        assert health["status"] == "DEGRADED"
        assert "No space left on device" in health["last_error"]

        # A compaction needs room for a second copy: it fails and leaves the old state whole.
        with pytest.raises(StoreIOError):
            service.rebuild_index()
        assert _history(service) == acknowledged
        assert service.check() == []
    finally:
        with contextlib.suppress(StoreIOError):
            service.close()

    # Reopen on the still-full disk: every acknowledged write is there, nothing else.
    with MemoryService.open(data_dir) as reopened:
        assert _history(reopened) == acknowledged
        assert reopened.check() == []

    # Free space (grow the filesystem): the same data dir takes writes again.
    assert _mount(small_disk, SIZE_KIB * 8, remount=True)
    with MemoryService.open(data_dir) as grown:
        written = grown.write_message(session_id="full", role="user", content="after the fix")
        assert _history(grown)[written["message"]["message_id"]] == "after the fix"
        result = grown.rebuild_index()
        assert result["messages_indexed"] == len(acknowledged) + 1
        assert grown.get_system_health()["status"] == "OK"
        assert grown.check() == []


def test_full_disk_through_convmem_serve(small_disk: Path, tmp_path: Path) -> None:
    """The same refusal end to end: the host gets an IO_ERROR tool result and the server
    keeps answering; every acknowledged write survives."""
    data_dir = small_disk / "store"
    acknowledged: list[str] = []
    errlog = (tmp_path / "stderr.txt").open("w")

    async def scenario() -> None:
        async with serve_client(data_dir, "auto", errlog) as client:
            for _ in range(10_000):
                arguments = {"session_id": "full", "role": "user", "content": "y" * 1000}
                result = await client.call_tool("write_message", arguments)
                if result.is_error:
                    error = payload(result)["error"]
                    assert error["code"] == "IO_ERROR"
                    assert "y" * 50 not in error["message"]
                    break
                acknowledged.append(payload(result)["message"]["message_id"])
            else:
                raise AssertionError("the disk never filled up")
            health = await call(client, "get_system_health")
            assert health["status"] == "DEGRADED"
            assert health["active_messages"] == len(acknowledged)

    anyio.run(scenario)
    errlog.close()
    with MemoryService.open(data_dir) as reopened:
        assert set(_history(reopened)) == set(acknowledged)
        assert reopened.check() == []
