"""The Runtime with real parts: a real store and lock, the real MCP server, real OS pipes and
sockets carrying JSON-RPC lines. Its state machine (docs/app.md), the start/stop order of
parts and listeners, the client registry and health."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from convmem_engine.domain.errors import BusyError
from convmem_engine.mcp import fast_call
from convmem_engine.runtime import (
    ClientRegistry,
    Runtime,
    RuntimeState,
    RuntimeStateError,
    StdioListener,
)
from convmem_engine.runtime.activity import ActivityLog
from convmem_engine.runtime.clients import QUIET_SECONDS
from convmem_engine.service import MemoryService


def request(request_id: int, method: str, params: dict[str, Any]) -> bytes:
    body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    return json.dumps(body).encode() + b"\n"


def initialize(name: str, version: str) -> bytes:
    client = {"name": name, "version": version}
    params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": client}
    return request(1, "initialize", params) + (
        b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
    )


def write_call(request_id: int, content: str) -> bytes:
    arguments = {"session_id": "rt", "role": "user", "content": content}
    return request(request_id, "tools/call", {"name": "write_message", "arguments": arguments})


def read_answers(fd: int, count: int) -> list[dict[str, Any]]:
    """Read `count` JSON-RPC lines from a real file descriptor."""
    data = b""
    while data.count(b"\n") < count:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return [json.loads(line) for line in data.splitlines()]


class Recorder:
    """A runtime part that records when it starts and stops and what it saw then."""

    def __init__(self, name: str, log: list[str], *, fail_start: bool = False) -> None:
        self.name = name
        self.log = log
        self.fail_start = fail_start

    def start(self, runtime: Runtime) -> None:
        # A part starts after the service opened and before any listener.
        health = runtime.service.get_system_health()
        self.log.append(f"start {self.name} listeners={len(runtime.listeners)} {health['status']}")
        if self.fail_start:
            raise OSError("part could not start")

    def stop(self) -> None:
        self.log.append(f"stop {self.name}")

    def health(self) -> dict[str, Any]:
        return {"queue": 0}


class SocketListener:
    """A listener serving each connection of a real loopback TCP socket server (any platform)."""

    transport = "socket"

    def __init__(self, log: list[str] | None = None) -> None:
        self.log = log if log is not None else []
        self.server: asyncio.AbstractServer | None = None
        self.address: Any = None

    def start(self, runtime: Runtime) -> None:
        async def session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            async def read_chunk() -> bytes:
                return await reader.read(65536)

            async def send(data: bytes) -> None:
                writer.write(data)
                await writer.drain()

            try:
                await runtime.serve_session(self.transport, read_chunk, send)
            finally:
                writer.close()

        async def listen() -> None:
            self.server = await asyncio.start_server(session, "127.0.0.1", 0)
            self.address = self.server.sockets[0].getsockname()

        runtime.loop.submit(listen()).result()

    async def stop(self, grace: float) -> None:
        self.log.append(f"stop listener grace={grace}")
        assert self.server is not None
        self.server.close()


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    rt = Runtime(tmp_path / "data")
    yield rt
    if rt.state not in (RuntimeState.OPENING, RuntimeState.STOPPED):
        rt.stop(0)


def test_life_cycle_and_lock(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    rt = Runtime(data_dir)
    seen: list[RuntimeState] = []
    rt.subscribe(seen.append)
    assert rt.state is RuntimeState.NEW
    rt.open()
    assert rt.state is RuntimeState.RUNNING
    rt.service.write_message(session_id="s", role="user", content="kept")
    with pytest.raises(BusyError):  # the runtime holds the data dir's lock
        MemoryService.open(data_dir)
    with pytest.raises(RuntimeStateError):
        rt.open()
    rt.stop()
    assert seen == ["opening", "running", "stopping", "stopped"]
    with pytest.raises(RuntimeStateError):
        _ = rt.service
    with MemoryService.open(data_dir) as svc:  # lock released, the write on disk
        assert [m["content"] for m in svc.read_messages(session_id="s")["history"]] == ["kept"]
    rt.stop()  # stopping a stopped runtime is a no-op
    assert rt.state is RuntimeState.STOPPED


def test_busy_fails_then_retry_opens(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    holder = MemoryService.open(data_dir)
    rt = Runtime(data_dir)
    with pytest.raises(BusyError):
        rt.open()
    assert rt.state is RuntimeState.FAILED
    assert isinstance(rt.error, BusyError)
    assert rt.health().error == "BUSY"
    with pytest.raises(RuntimeStateError):
        rt.add_listener(SocketListener())
    holder.close()
    rt.open()  # FAILED -> OPENING -> RUNNING
    assert rt.state is RuntimeState.RUNNING and rt.error is None
    rt.stop()


def test_a_failed_runtime_or_a_new_one_stops_at_once(tmp_path: Path) -> None:
    rt = Runtime(tmp_path / "data")
    rt.stop()
    assert rt.state is RuntimeState.STOPPED
    with pytest.raises(RuntimeStateError):
        rt.open()


def test_parts_and_listeners_start_and_stop_in_order(tmp_path: Path) -> None:
    log: list[str] = []
    rt = Runtime(tmp_path / "data", parts=[Recorder("a", log), Recorder("b", log)])
    rt.open()
    listener = SocketListener(log)
    rt.add_listener(listener)
    health = rt.health()
    assert health.parts == {"a": {"queue": 0}, "b": {"queue": 0}}
    assert health.listeners == ("socket",)
    rt.stop(3.0)
    assert log == [
        "start a listeners=0 OK",
        "start b listeners=0 OK",
        "stop listener grace=3.0",
        "stop b",
        "stop a",
    ]


def test_a_part_that_fails_to_start_undoes_the_open(tmp_path: Path) -> None:
    log: list[str] = []
    data_dir = tmp_path / "data"
    parts = [Recorder("a", log), Recorder("b", log, fail_start=True), Recorder("c", log)]
    rt = Runtime(data_dir, parts=parts)
    with pytest.raises(OSError):
        rt.open()
    assert rt.state is RuntimeState.FAILED
    assert log == ["start a listeners=0 OK", "start b listeners=0 OK", "stop a"]
    MemoryService.open(data_dir).close()  # the lock was released


def test_clients_over_a_real_socket(runtime: Runtime) -> None:
    runtime.open()
    changes = threading.Semaphore(0)
    runtime.clients.subscribe(changes.release)
    listener = SocketListener()
    runtime.add_listener(listener)
    with socket.create_connection(listener.address) as sock:
        assert changes.acquire(timeout=10)  # connected
        sock.sendall(initialize("probe-host", "1.2.3") + write_call(2, "hello"))
        answers = read_answers(sock.fileno(), 2)
        assert [a["id"] for a in answers] == [1, 2]
        assert changes.acquire(timeout=10)  # identified
        (client,) = runtime.clients.clients()
        assert (client.transport, client.name, client.version) == ("socket", "probe-host", "1.2.3")
        assert client.requests == 2
        assert client.last_activity >= client.since
        assert runtime.health().clients == (client,)
    assert changes.acquire(timeout=10)  # disconnected
    assert runtime.clients.clients() == []


def test_the_only_clients_writes_run_on_the_loop_and_keep_their_client(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write of the runtime's only active client is served on the engine loop (no worker
    thread: fast_call.py, "One call alone"); right after another client's request, it goes
    to a worker thread again. Either way the change is the writing client's."""
    threads: list[str] = []
    answer = fast_call.FastCallSession._answer

    def spying(self: fast_call.FastCallSession, call: fast_call.FastCall) -> None:
        threads.append(threading.current_thread().name)
        answer(self, call)

    monkeypatch.setattr(fast_call.FastCallSession, "_answer", spying)
    runtime.open()
    activity = ActivityLog(runtime.service, runtime.clients)
    listener = SocketListener()
    runtime.add_listener(listener)
    with socket.create_connection(listener.address) as first:
        first.sendall(initialize("first", "1"))
        read_answers(first.fileno(), 1)
        first.sendall(write_call(2, "alone"))
        read_answers(first.fileno(), 1)
        with socket.create_connection(listener.address) as second:
            second.sendall(initialize("second", "1"))
            read_answers(second.fileno(), 1)
            first.sendall(write_call(3, "not alone"))
            read_answers(first.fileno(), 1)
    activity.close()
    assert threads[0] == "convmem-engine" and threads[1] != "convmem-engine"
    assert [a.client for a in activity.entries()] == ["first 1", "first 1"]


def test_client_info_from_request_meta(runtime: Runtime) -> None:
    """The 2026-07-28 era has no initialize: the client says who it is in each request's
    `_meta`; names are cut to printable characters and a bounded length."""
    runtime.open()
    listener = SocketListener()
    runtime.add_listener(listener)
    meta = {"io.modelcontextprotocol/clientInfo": {"name": "new\x00era" + "x" * 500, "version": 7}}
    with socket.create_connection(listener.address) as sock:
        sock.sendall(request(1, "tools/list", {"_meta": meta}))
        read_answers(sock.fileno(), 1)
        (client,) = runtime.clients.clients()
        assert client.name == ("newera" + "x" * 500)[:100]
        assert client.version == ""  # not a string: not shown


@pytest.mark.parametrize("reader", ["loop", "thread"])
def test_stdio_listener_over_real_pipes(
    runtime: Runtime, reader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a front: stdin read on the loop (a pipe, on POSIX) or by a thread (as on
    Windows, where `LoopReader.usable` says no)."""
    from convmem_engine.runtime.loop_reader import LoopReader

    if reader == "thread":
        monkeypatch.setattr(LoopReader, "usable", staticmethod(lambda *args: False))
    runtime.open()
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    try:
        listener = StdioListener(in_read, out_write)
        runtime.add_listener(listener)
        os.write(in_write, initialize("pipe-host", "9") + write_call(2, "over stdio"))
        answers = read_answers(out_read, 2)
        assert answers[1]["result"]["isError"] is False
        (client,) = runtime.clients.clients()
        assert (client.transport, client.name) == ("stdio", "pipe-host")
        os.close(in_write)  # EOF: the session ends after answering
        in_write = -1
        assert listener.finished.wait(30)
        assert runtime.clients.count() == 0
        runtime.stop()
    finally:
        for fd in (in_read, in_write, out_read, out_write):
            if fd >= 0:
                os.close(fd)
    with MemoryService.open(runtime.data_dir) as svc:
        assert svc.read_messages(session_id="rt")["history"][0]["content"] == "over stdio"


class StubbornListener:
    """A listener whose sessions would take `grace` to end: a second stop(0) cuts it short."""

    transport = "stubborn"

    def __init__(self) -> None:
        self.forced: asyncio.Event | None = None
        self.calls: list[float] = []

    def start(self, runtime: Runtime) -> None:
        async def make() -> None:
            self.forced = asyncio.Event()

        runtime.loop.submit(make()).result()

    async def stop(self, grace: float) -> None:
        assert self.forced is not None
        self.calls.append(grace)
        if grace <= 0:
            self.forced.set()
            return
        await asyncio.wait_for(self.forced.wait(), grace)


def test_a_second_stop_with_no_grace_forces_the_listeners(runtime: Runtime) -> None:
    runtime.open()
    listener = StubbornListener()
    runtime.add_listener(listener)
    stopped = runtime.stop_async(3600)
    while not listener.calls:  # the listeners were told to stop with the long grace
        threading.Event().wait(0.01)
    assert not stopped.done()
    runtime.stop_async(0)
    stopped.result(timeout=30)
    assert runtime.state is RuntimeState.STOPPED
    assert listener.calls == [3600, 0]


def test_registry_counts_by_transport() -> None:
    registry = ClientRegistry(clock=lambda: 5.0)
    a = registry.connect("pipe")
    b = registry.connect("http")
    assert (registry.count(), registry.count("pipe"), registry.count("stdio")) == (2, 1, 0)
    a.identify("host", "1")
    assert registry.clients()[0].name == "host" and registry.clients()[0].requests == 0
    a.close()
    a.close()
    assert registry.count() == 1
    b.close()


def test_a_client_is_alone_while_no_other_made_a_request_lately() -> None:
    """`alone`: whether a session's write may run on the engine loop (fast_call.py)."""
    now = [100.0]
    registry = ClientRegistry(clock=lambda: now[0])
    a, b = registry.connect("pipe"), registry.connect("pipe")
    assert registry.alone(a.client_id) and registry.alone(b.client_id)  # connected, idle
    a.observe("ping", None)
    assert registry.alone(a.client_id) and not registry.alone(b.client_id)
    b.observe("ping", None)
    a.observe("ping", None)  # the last request of another client is remembered behind a's
    assert not registry.alone(a.client_id) and not registry.alone(b.client_id)
    now[0] += 2 * QUIET_SECONDS
    assert registry.alone(a.client_id) and registry.alone(b.client_id)
