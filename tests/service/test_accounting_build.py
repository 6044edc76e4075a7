"""The memory accounting (get_system_health's memory_estimate) is made by the open's background
build, so the first health call after open does not walk every message itself; changes made
while it is being made are applied when it is installed, and a health call that comes first
makes its own (the build's is then dropped). Both must equal a fresh count (the self-check)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from svc_helpers import write
from test_search_during_build import seed
from tool_calls import ToolCalls

from convmem_engine.domain.message import Message
from convmem_engine.service import index_set, memory_service
from convmem_engine.service.accounting import MessageAccounting


@pytest.fixture
def gated_accounting(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Hold the background builder inside its accounting pass until the test opens the gate."""
    gate, entered = threading.Event(), threading.Event()
    real = index_set._account

    def held(messages: Iterable[Message]) -> MessageAccounting:
        if threading.current_thread().name == "convmem-search-build":
            entered.set()
            assert gate.wait(timeout=120), "test gate never opened"
        return real(messages)

    monkeypatch.setattr(index_set, "_account", held)
    yield gate, entered
    gate.set()


def test_changes_during_the_background_accounting_are_counted(
    tmp_path: Path, gated_accounting: tuple[threading.Event, threading.Event]
) -> None:
    gate, entered = gated_accounting
    data = tmp_path / "data"
    ids = seed(data)
    svc = ToolCalls.open(data, background_search_from=10)
    try:
        assert entered.wait(timeout=60)
        write(svc, "written while the accounting is made", session="s2", importance=70)
        svc.update_message(message_id=ids[3], content="a longer content than before " * 4)
        svc.update_message(
            message_id=ids[4], metadata_json=json.dumps({"tags": ["alpha"], "summary": "s"})
        )
        svc.delete_message(message_id=ids[5])
        gate.set()
        assert svc.wait_for_search_index(timeout=120)
        built = svc._indexes.built_accounting  # test only: installed by the builder
        assert built is not None and built.entries == 240
        assert svc.check() == []  # the self-check compares it with a fresh count
        assert svc.get_system_health()["memory_estimate"]["body_bytes"] == built.body_bytes
    finally:
        gate.set()
        svc.close()


def test_a_health_call_before_the_accounting_is_made_makes_its_own(
    tmp_path: Path,
    gated_accounting: tuple[threading.Event, threading.Event],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate, entered = gated_accounting
    monkeypatch.setattr(memory_service, "ACCOUNTING_WAIT_SECONDS", 0.05)
    data = tmp_path / "data"
    seed(data)
    svc = ToolCalls.open(data, background_search_from=10)
    try:
        assert entered.wait(timeout=60)
        health = svc.get_system_health()  # waits briefly, then counts itself
        assert health["active_messages"] == 240 and health["memory_estimate"]["body_bytes"] > 0
        own = svc._indexes.built_accounting
        write(svc, "after the health call", session="s1")
        gate.set()
        assert svc.wait_for_search_index(timeout=120)
        assert svc._indexes.built_accounting is own  # the builder's was dropped
        assert svc.check() == []
    finally:
        gate.set()
        svc.close()
