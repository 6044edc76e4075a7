"""The activity feed: every change with the client that made it, over a real socket session."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from test_runtime import SocketListener, initialize, read_answers, write_call

from convmem_engine.runtime import Runtime
from convmem_engine.runtime.activity import ActivityLog


def test_changes_are_attributed_to_their_client(tmp_path: Path) -> None:
    rt = Runtime(tmp_path / "data")
    rt.open()
    try:
        feed = ActivityLog(rt.service, rt.clients)
        seen = []
        feed.subscribe(seen.append)
        listener = SocketListener()
        rt.add_listener(listener)
        with socket.create_connection(listener.address) as sock:
            sock.sendall(initialize("claude-ai", "0.9") + write_call(2, "remember the tram"))
            answers = read_answers(sock.fileno(), 2)
        mid = json.loads(answers[1]["result"]["content"][0]["text"])["message"]["message_id"]
        rt.service.delete_message(message_id=mid)  # from the app itself: no client
        entries = feed.entries()
        assert [(e.kind, e.message_id, e.session_id) for e in entries] == [
            ("write", mid, "rt"),
            ("delete", mid, "rt"),
        ]
        assert entries[0].client == "claude-ai 0.9" and entries[0].client_id is not None
        assert (entries[1].client, entries[1].client_id) == ("", None)
        assert seen == entries
        feed.close()
    finally:
        rt.stop(0)


def test_a_client_that_says_who_it_is_later_or_leaves_is_named_as_it_was(tmp_path: Path) -> None:
    """Names are looked up once per registry change, not per write: a change of name, a new
    client and a client gone are each seen by the next write."""
    from convmem_engine.runtime.activity import CURRENT_CLIENT
    from convmem_engine.runtime.clients import ClientRegistry
    from convmem_engine.service import MemoryService

    service = MemoryService.open(tmp_path / "data")
    registry = ClientRegistry()
    feed = ActivityLog(service, registry)
    try:
        a = registry.connect("pipe")

        def write_as(client_id: int, n: int = 1) -> None:
            token = CURRENT_CLIENT.set(client_id)
            try:
                for _ in range(n):
                    service.write_message(session_id="s", role="user", content="x")
            finally:
                CURRENT_CLIENT.reset(token)

        write_as(a.client_id, 3)
        a.identify("host", "1")
        write_as(a.client_id)
        b = registry.connect("http")
        write_as(b.client_id)
        a.identify("host", "2")
        write_as(a.client_id)
        a.close()
        write_as(a.client_id)  # a change after the client left: named as it last was
        assert [e.client for e in feed.entries()] == [
            "pipe client 1",
            "pipe client 1",
            "pipe client 1",
            "host 1",
            "http client 2",
            "host 2",
            "host 2",
        ]
        b.close()
    finally:
        feed.close()
        service.close()


def test_follow_gives_every_change_once_while_writers_keep_writing(tmp_path: Path) -> None:
    """`follow` returns the entries so far and subscribes in one step: with eight threads
    writing meanwhile, every change is in the list or passed to the callback, never both."""
    import threading

    from convmem_engine.service import MemoryService

    service = MemoryService.open(tmp_path / "data")
    try:
        feed = ActivityLog(service)
        written: list[str] = []
        lock = threading.Lock()

        def writer(w: int) -> None:
            for i in range(40):
                mid = service.write_message(session_id=f"w{w}", role="user", content=f"n{i}")
                with lock:
                    written.append(str(mid["message"]["message_id"]))

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        passed: list[str] = []
        entries, unfollow = feed.follow(lambda e: passed.append(str(e.message_id)))
        for t in threads:
            t.join()
        unfollow()
        shown = [str(e.message_id) for e in entries] + passed
        assert len(shown) == len(set(shown)) == len(written) == 320
        assert set(shown) == set(written)
        write_count = len(passed)
        service.write_message(session_id="after", role="user", content="not followed")
        assert len(passed) == write_count  # unsubscribed
        feed.close()
    finally:
        service.close()
