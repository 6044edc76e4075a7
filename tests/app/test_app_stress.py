"""Long stress (run with `-m slow`), the app with real shims:

- rounds of many hosts writing through shims while the app is told to quit under them; after
  every round, every acknowledged write is in the store;
- 16 hosts through the app for a bounded time, each writing, reading back, updating and
  searching; at the end every acknowledged write reads back through a shim, and after the app
  quits the store holds exactly what was acknowledged.

Counts go to docs/reliability.md through tests/reliability_log.py."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import TextIO

import anyio
import pytest
from app_helpers import control, shim_client, start_app, wait_listening
from reliability_log import Tally
from test_app_processes import stored_ids
from tool_results import call

from convmem_engine.storage import Store

pytestmark = [pytest.mark.slow, pytest.mark.posix]  # SIGTERM, AF_UNIX control

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
    with Tally(f"app told to quit (SIGTERM) under {HOSTS} writing hosts") as tally:
        for round_number in range(ROUNDS):
            acknowledged |= one_round(tmp_path, round_number, errlog)
            tally.cases += 1
            tally.lost = len(acknowledged - stored_ids(tmp_path / "data"))
            assert tally.lost == 0
    assert len(acknowledged) >= ROUNDS * HOSTS * WRITES // 2


BOUNDED_HOSTS = 16
BOUNDED_SECONDS = 60.0
CALL_TIMEOUT = 60.0


def test_sixteen_hosts_for_a_bounded_time_read_back_every_write(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    errlog = (tmp_path / "shims.log").open("w")
    request.addfinalizer(errlog.close)
    data_dir = tmp_path / "data"
    app = start_app(data_dir, tmp_path / "app.log", "--minimized")
    wait_listening(data_dir)
    acknowledged: dict[str, str] = {}  # message id -> its acknowledged content
    tally = Tally(f"{BOUNDED_HOSTS} hosts through the app (real shims) for a bounded time")

    async def host(index: int, stop_at: float) -> None:
        rng = random.Random(index)
        session = f"host-{index}"
        mine: list[str] = []
        async with shim_client(data_dir, errlog, "--start-timeout", "0") as client:
            n = 0
            while time.monotonic() < stop_at:
                n += 1
                with anyio.fail_after(CALL_TIMEOUT):
                    choice = rng.random()
                    if choice < 0.6 or not mine:
                        content = f"{session} write {n}"
                        result = await call(
                            client,
                            "write_message",
                            session_id=session,
                            role="user",
                            content=content,
                        )
                        mid = result["message"]["message_id"]
                        acknowledged[mid] = content
                        mine.append(mid)
                        back = await call(client, "read_messages", view="content", message_id=mid)
                        tally.lost += back["content_range"]["content"] != content
                    elif choice < 0.8:
                        mid = rng.choice(mine)
                        content = f"{session} update {n}"
                        await call(client, "update_message", message_id=mid, content=content)
                        acknowledged[mid] = content
                    else:
                        await call(client, "search_messages", query=f"write {n - 1}", limit=5)
                    tally.cases += 1

    async def read_back() -> None:
        async with shim_client(data_dir, errlog, "--start-timeout", "0") as client:
            for mid, content in acknowledged.items():
                with anyio.fail_after(CALL_TIMEOUT):
                    back = await call(
                        client,
                        "read_messages",
                        view="content",
                        message_id=mid,
                        content_limit=65536,
                    )
                tally.changed += back["content_range"]["content"] != content

    async def scenario() -> None:
        stop_at = time.monotonic() + BOUNDED_SECONDS
        async with anyio.create_task_group() as group:
            for index in range(BOUNDED_HOSTS):
                group.start_soon(host, index, stop_at)
        await read_back()

    with tally:
        try:
            anyio.run(scenario)
        except TimeoutError:
            tally.hung += 1
            raise
        finally:
            control(data_dir, "quit")
            if app.wait(60) != 0:
                tally.crashed += 1
        with Store.open(data_dir) as store:
            tally.crashed += bool(store.check())
            stored = {mid: m.content for mid, m in store.messages.items()}
        tally.lost += len(acknowledged.keys() - stored.keys())
        tally.changed += len(stored.keys() - acknowledged.keys())
        tally.changed += sum(stored[m] != c for m, c in acknowledged.items() if m in stored)
    assert (tally.lost, tally.changed, tally.hung, tally.crashed) == (0, 0, 0, 0)
    assert tally.cases >= BOUNDED_HOSTS * 10
