"""`convmem serve` imports the SDK once the search index's background load or build is done,
not beside it (`serve_cli.sdk_after_search_index`): the build's own high point then comes
before the SDK's ~40 MiB are there. While it waits the front answers every request; the wait
ends at once when the front meets a request it leaves to the SDK, at the end of stdin, or at
a stop signal. Real parts: a front on pipes and a service whose background build is held
(the service tests' gated index); and a real `convmem serve` whose SDK shows in its memory
map only once its index is ready."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
from mcp_helpers import ROOT, child_env, serve_args

from convmem_engine.domain.message import Message
from convmem_engine.index.search_index import SearchIndex
from convmem_engine.runtime.front import StdioFront
from convmem_engine.runtime.serve_cli import sdk_after_search_index
from convmem_engine.service import MemoryService
from convmem_engine.service.ids import UlidSource
from convmem_engine.service.memory_service import BACKGROUND_SEARCH_FROM
from convmem_engine.storage import Store
from convmem_engine.tools import ToolRegistry

pytestmark = pytest.mark.posix  # os.pipe as stdin/stdout; /proc

INITIALIZE = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
).encode()
INITIALIZED = b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'


def health(request_id: int) -> bytes:
    params = {"name": "get_system_health", "arguments": {}}
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    return json.dumps(body).encode() + b"\n"


def seeded_store(data: Path, n: int) -> None:
    store = Store.open(data)
    ids = UlidSource()
    seq = 0
    for i in range(n):
        mid, ts = ids.next()
        seq = store.write_put(
            Message(mid, f"s{i % 50}", ts, "user", f"row {i} word{i % 97}", 1, ts)
        )
    store.sync(seq)
    store.close()


class HeldBuild(SearchIndex):
    """The real index, whose build first says it started and waits for the test's gate."""

    def __init__(self, gate: threading.Event, started: threading.Event) -> None:
        super().__init__()
        self.gate = gate
        self.started = started

    def build(
        self,
        messages: Iterable[Message],
        *,
        cancelled: Callable[[], bool] | None = None,
        ids: list[str | None] | None = None,
    ) -> bool:
        self.started.set()
        assert self.gate.wait(timeout=120)
        return super().build(messages, cancelled=cancelled, ids=ids)


class Held:
    """A front that answered the handshake, over a service whose background build is held."""

    def __init__(self, data: Path) -> None:
        seeded_store(data, 40)
        self.gate = threading.Event()
        started = threading.Event()
        self.service = MemoryService.open(
            data,
            background_search_from=10,
            search_index_factory=lambda: HeldBuild(self.gate, started),
        )
        self.in_r, self.in_w = os.pipe()
        out_r, out_w = os.pipe()
        self.out = os.fdopen(out_r, "rb")
        self.front = StdioFront(self.in_r, out_w, answer_requests=True)
        self.front.start()
        os.write(self.in_w, INITIALIZE + b"\n" + INITIALIZED)
        assert json.loads(self.out.readline())["id"] == 1
        self.front.serve_tools(ToolRegistry.for_service(self.service), agent_enabled=False)
        assert started.wait(60)  # the build is held inside
        self.signals: list[int] = []
        self.done = threading.Event()
        self.waiter = threading.Thread(target=self._wait)
        self.waiter.start()

    def _wait(self) -> None:
        sdk_after_search_index(self.front, self.service, self.signals)
        self.done.set()

    def answer(self) -> dict[str, object]:
        return json.loads(self.out.readline())  # type: ignore[no-any-return]

    def close(self) -> None:
        self.gate.set()
        self.waiter.join(60)
        self.front.stop_answering()
        self.service.close()
        for fd in (self.in_w, self.in_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.out.close()


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Held]:
    h = Held(tmp_path / "data")
    try:
        yield h
    finally:
        h.close()


@pytest.mark.parametrize("ending", ["ready", "sdk request", "end of stdin", "stop signal"])
def test_the_sdk_waits_for_the_index_while_the_front_answers(held: Held, ending: str) -> None:
    assert not held.done.wait(0.3)  # the build is held: the SDK waits
    os.write(held.in_w, health(2))  # the front answers meanwhile
    answer = held.answer()
    assert answer["id"] == 2 and "result" in answer
    assert not held.done.wait(0.2)
    if ending == "ready":
        held.gate.set()
    elif ending == "sdk request":  # one the front leaves to the SDK: it is imported for it now
        os.write(held.in_w, b'{"jsonrpc":"2.0","id":3,"method":"resources/list"}\n')
    elif ending == "end of stdin":
        os.close(held.in_w)
        held.in_w = -1
    else:
        held.signals.append(15)
    assert held.done.wait(30)
    assert not held.service.wait_for_search_index(0) or ending == "ready"


def _maps_hold_the_sdk(pid: int) -> bool:
    return "_pydantic_core" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/maps")
def test_serve_imports_the_sdk_once_the_rebuilt_index_is_ready(tmp_path: Path) -> None:
    """A real `convmem serve` on a store big enough to build its index in the background (no
    search.idx): at every poll, if its memory map held the SDK (pydantic's core, which only
    the SDK imports), the health asked right after says the index is ready. Race-free: the map
    is read first, and an index once ready stays ready."""
    data = tmp_path / "data"
    seeded_store(data, BACKGROUND_SEARCH_FROM + 500)
    process = subprocess.Popen(
        [sys.executable, *serve_args(data)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
        cwd=ROOT,
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        process.stdin.write(INITIALIZE + b"\n" + INITIALIZED)
        process.stdin.flush()
        assert json.loads(process.stdout.readline())["id"] == 1
        seen_building = False
        request = 2
        deadline = time.monotonic() + 120
        while True:
            sdk = _maps_hold_the_sdk(process.pid)
            process.stdin.write(health(request))
            process.stdin.flush()
            answer = json.loads(process.stdout.readline())
            assert answer["id"] == request
            request += 1
            text = answer["result"]["content"][0]["text"]  # type: ignore[index]
            ready = json.loads(text)["memory_estimate"]["search_index_bytes"] > 0
            assert ready or not sdk, "the SDK was imported while the index was building"
            seen_building |= not ready
            if ready and sdk:
                break
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert seen_building  # the wait was exercised
    finally:
        _, err = process.communicate(timeout=60)  # (closes stdin: the server's end of input)
    assert process.returncode == 0, err
