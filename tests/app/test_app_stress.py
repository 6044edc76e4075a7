"""Long stress (run with `-m slow`): rounds of many hosts writing through shims while the app
is told to quit under them; after every round, every acknowledged write is in the store."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TextIO

import anyio
import pytest
from app_helpers import shim_client, start_app, wait_listening
from test_app_processes import stored_ids
from tool_results import call

pytestmark = pytest.mark.slow

ROUNDS = 3
HOSTS = 24
WRITES = 40


def one_round(tmp_path: Path, round_number: int, errlog: TextIO) -> set[str]:
    """Start the app, let HOSTS shims write, SIGTERM the app halfway; the acknowledged ids."""
    data_dir = tmp_path / "data"
    app = start_app(data_dir, tmp_path / "app.log", "--minimized")
    wait_listening(data_dir)
    acknowledged: set[str] = set()

    async def host(index: int) -> None:
        try:
            async with shim_client(data_dir, errlog, "--start-timeout", "0") as client:
                for n in range(WRITES):
                    result = await call(
                        client,
                        "write_message",
                        session_id=f"r{round_number}-h{index}",
                        role="user",
                        content=f"{n}",
                    )
                    acknowledged.add(result["message"]["message_id"])
        except Exception:
            return  # the app quit under this host

    async def scenario() -> None:
        async with anyio.create_task_group() as group:
            for index in range(HOSTS):
                group.start_soon(host, index)
            with anyio.fail_after(120):
                while len(acknowledged) < HOSTS * WRITES // 2:
                    await anyio.sleep(0.01)
            app.send_signal(signal.SIGTERM)

    anyio.run(scenario)
    assert app.wait(60) == 0
    return acknowledged


def test_rounds_of_many_hosts_and_quits(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    errlog = (tmp_path / "shims.log").open("w")
    request.addfinalizer(errlog.close)
    acknowledged: set[str] = set()
    for round_number in range(ROUNDS):
        acknowledged |= one_round(tmp_path, round_number, errlog)
        assert acknowledged <= stored_ids(tmp_path / "data")
    assert len(acknowledged) >= ROUNDS * HOSTS * WRITES // 2
