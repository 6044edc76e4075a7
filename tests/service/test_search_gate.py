"""A gated background search build (`MemoryService.open(search_gate=...)`, what `convmem serve`
uses so that loading search.idx does not slow its first answers): nothing is loaded until the
gate opens; searches meanwhile scan, with the same results; writes made meanwhile reach the
index; whatever needs the index (`wait_for_search_index`, `rebuild_index`) opens the gate; a
close before it opens loads nothing and leaves the file for the next open.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

from test_search_persist import churn, loads, reference, reopened, results, seeded  # noqa: F401
from tool_calls import ToolCalls

from convmem_engine.service.search_persist import FILE_NAME


def test_nothing_loads_until_the_gate_opens_and_searches_agree_meanwhile(
    tmp_path: Path,
    loads: list[bool],  # noqa: F811
) -> None:
    data = tmp_path / "data"
    seeded(data, 11)
    want = reference(data)
    gate = threading.Event()
    svc = ToolCalls.open(data, background_search_from=10, search_gate=gate)
    try:
        assert results(svc) == want  # scanned: the gate is shut
        assert loads == []
        assert (
            not gate.is_set()
            and svc.get_system_health()["memory_estimate"]["search_index_bytes"] == 0
        )
        ids = list(svc._store.messages)
        churn(svc, random.Random(12), 40, ids)  # queued for the index
        gate.set()
        assert svc.wait_for_search_index(timeout=60)
        assert svc.check() == []
        got = results(svc)
    finally:
        svc.close()
    assert got == reference(data)
    assert loads[-1] is True


def test_rebuild_index_opens_the_gate(tmp_path: Path) -> None:
    data = tmp_path / "data"
    seeded(data, 13)
    gate = threading.Event()
    with ToolCalls.open(data, background_search_from=10, search_gate=gate) as svc:
        assert svc.rebuild_index()["status"] == "OK"
        assert gate.is_set()


def test_a_close_before_the_gate_opens_loads_nothing_and_keeps_the_file(
    tmp_path: Path,
    loads: list[bool],  # noqa: F811
) -> None:
    data = tmp_path / "data"
    seeded(data, 14)
    before = (data / FILE_NAME).read_bytes()
    svc = ToolCalls.open(data, background_search_from=10, search_gate=threading.Event())
    svc.close()
    assert loads == []
    assert (data / FILE_NAME).read_bytes() == before
    got, problems = reopened(data, background_search_from=10)
    assert loads == [True] and problems == []
    assert got == reference(data)
