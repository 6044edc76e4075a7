"""Rebuild index with its result; the health panel shows every field of get_system_health."""

from __future__ import annotations

from typing import Any

import pytest
from gui_helpers import write

from convmem_app.browser.maintenance_panel import IO_FIELDS, STORE_FIELDS, value_text
from convmem_app.browser.memory_chart import PARTS
from convmem_engine.service import MemoryService

pytestmark = pytest.mark.gui


def test_health_panel_shows_every_field(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    for i in range(5):
        write(service, f"s{i % 2}", f"message {i}")
    b = make_browser()
    with qtbot.waitSignal(b.page("maintenance").healthLoaded) as loaded:
        b.show_page("maintenance")
    health = loaded.args[0]
    assert health == service.get_system_health()
    m = b.page("maintenance")
    assert "OK" in m.status_badge.text()
    shown = {key for key, _l, _k in STORE_FIELDS} | {"status", "memory_estimate", "io"}
    assert set(health) <= shown | set(m.extra_labels)  # nothing the service reports is hidden
    for key, _label, kind in STORE_FIELDS:
        assert m.labels[key].text() == value_text(health[key], kind)
    for key, _label, kind in IO_FIELDS:
        assert m.labels["io." + key].text() == value_text(health["io"][key], kind)
    assert set(health["memory_estimate"]) == {"total_bytes"} | {k for k, _l in PARTS}
    assert m.chart.estimate == health["memory_estimate"]
    assert f"({health['memory_estimate']['total_bytes']:,} B)" in m.memory_total.text()
    assert m.labels["active_messages"].text() == "5"
    assert m.labels["session_count"].text() == "2"


def test_rebuild_shows_progress_and_result_and_refreshes_health(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    ids = [write(service, "s", "x" * 2000)["message_id"] for _ in range(6)]
    for mid in ids[:3]:
        service.delete_message(message_id=mid)
    b = make_browser()
    b.show_page("maintenance")
    m = b.page("maintenance")
    qtbot.waitUntil(lambda: m.health is not None)
    assert m.health is not None and m.health["deleted_messages"] == 3
    with qtbot.waitSignal(m.rebuildFinished, timeout=20_000) as done:
        b.act_rebuild.trigger()
        assert m.rebuilding and not m.rebuild_button.isEnabled()
        assert m.rebuild_progress.maximum() == 0  # busy indicator while it runs
    result = done.args[0]
    assert result["status"] == "OK" and result["messages_indexed"] == 3
    assert result["records_removed"] >= 3 and result["bytes_after"] < result["bytes_before"]
    text = m.rebuild_result.text()
    assert "3 messages indexed" in text and f"{result['records_removed']:,} records removed" in text
    assert m.rebuild_button.isEnabled()
    qtbot.waitUntil(lambda: m.health is not None and m.health["deleted_messages"] == 0)
    assert m.labels["deleted_messages"].text() == "0"
