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
