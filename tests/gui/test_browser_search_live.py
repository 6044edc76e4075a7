"""Search with filters and jump-to-result; live updates from writes through the MCP layer."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from gui_helpers import history_ids, select_history_rows, select_session, write
from mcp.client import Client

from convmem_app.browser.search_panel import HTML_ROLE, SearchResultsModel, highlight
from convmem_engine.mcp import build_server
from convmem_engine.service import MemoryService

pytestmark = pytest.mark.gui


def _search(qtbot: Any, b: Any, query: str) -> list[dict[str, Any]]:
    b.show_page("search")
    with qtbot.waitSignal(b.page("search").searched):
        b.page("search").query.setText(query)
        b.page("search").search()
    return list(b.page("search").model.results)


def test_search_results_with_score_fields_and_highlight(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    hit = write(service, "s1", "we picked PostgreSQL for the billing database")
    write(service, "s2", "nothing relevant here")
    by_tag = write(service, "s2", "unrelated text", tags=["postgresql"])
    b = make_browser()
    results = _search(qtbot, b, "postgresql")
    ids = {r["message_id"] for r in results}
    assert hit["message_id"] in ids and by_tag["message_id"] in ids
    model = b.page("search").model
    row = [r["message_id"] for r in results].index(hit["message_id"])
    assert float(model.index(row, 0).data()) == pytest.approx(results[row]["score"], abs=1e-3)
    assert model.index(row, 1).data() == "content"
    html = model.index(row, SearchResultsModel.COL_MATCH).data(HTML_ROLE)
    assert "<b>PostgreSQL</b>" in html  # the match is highlighted, in its original case
    tag_row = [r["message_id"] for r in results].index(by_tag["message_id"])
    assert model.index(tag_row, 1).data() == "tags"
    assert model.index(tag_row, SearchResultsModel.COL_MATCH).data() == "tags: postgresql"
    assert "results" in b.page("search").status.text()


def test_search_filters_kinds_tiers_tags_importance_and_scope(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    a = write(service, "s1", "deploy checklist", memory_kind="procedure", importance=90)
    bb = write(service, "s1", "deploy story", memory_kind="episode", memory_tier="long")
    c = write(service, "s2", "deploy rule", memory_kind="procedure", tags=["ops", "prod"])
    b = make_browser()
    p = b.page("search")

    def ids() -> set[str]:
        return {r["message_id"] for r in p.model.results}

    _search(qtbot, b, "deploy")
    assert ids() == {a["message_id"], bb["message_id"], c["message_id"]}
    with qtbot.waitSignal(p.searched):
        p.kind_boxes["procedure"].setChecked(True)
    assert ids() == {a["message_id"], c["message_id"]}
    with qtbot.waitSignal(p.searched):
        p.min_importance.setValue(80)
    assert ids() == {a["message_id"]}
    with qtbot.waitSignal(p.searched):
        p.min_importance.setValue(0)
    with qtbot.waitSignal(p.searched):
        p.tags.setText("ops, prod")
        p.tags.editingFinished.emit()
    assert ids() == {c["message_id"]}
    assert p.filters() == {"kinds": ["procedure"], "tags": ["ops", "prod"]}
    with qtbot.waitSignal(p.searched):
        p.tags.clear()
        p.tags.editingFinished.emit()
    with qtbot.waitSignal(p.searched):
        p.kind_boxes["procedure"].setChecked(False)
    with qtbot.waitSignal(p.searched):
        p.tier_boxes["long"].setChecked(True)
    assert ids() == {bb["message_id"]}
    with qtbot.waitSignal(p.searched):
        p.tier_boxes["long"].setChecked(False)
    # scope: only the selected session
    b.show_page("browse")
    select_session(qtbot, b, "s2")
    b.show_page("search")
    with qtbot.waitSignal(p.searched):
        p.scope.setCurrentIndex(1)
    assert ids() == {c["message_id"]}


def test_opening_a_result_jumps_to_it_in_its_session(
    qtbot: Any, service: MemoryService, make_browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from convmem_app.browser.history_model import HistoryModel

    monkeypatch.setattr(HistoryModel, "PAGE_SIZE", 3)  # the target is beyond the first pages
    for i in range(10):
        write(service, "long-session", f"filler {i}")
    target = write(service, "long-session", "the needle in the haystack")
    write(service, "other", "x")
    b = make_browser()
    _search(qtbot, b, "needle")
    with qtbot.waitSignal(b.messageOpened, timeout=10_000) as opened:
        b.page("search").open_row(0)
    assert opened.args == [target["message_id"]]
    assert b.current_page().name == "browse"
    assert b.browse.history_model.session_id == "long-session"
    assert b.browse.current_message() is not None
    assert b.browse.current_message()["message_id"] == target["message_id"]
    assert b.browse.detail.content.toPlainText() == "the needle in the haystack"


def test_highlight_escapes_html() -> None:
    assert highlight("<b>a&b</b> A", ["a"], "#ff0") == (
        '&lt;b&gt;<span style="background:#ff0"><b>a</b></span>&amp;b&lt;/b&gt; '
        '<span style="background:#ff0"><b>A</b></span>'
    )


def _run_mcp(service: MemoryService, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Call tools through the real MCP server (SDK in-memory client) on another thread."""
    out: list[Any] = []

    async def main() -> None:
        async with Client(build_server(service)) as client:
            for name, args in calls:
                result = await client.call_tool(name, args)
                out.append(json.loads(result.content[0].text))

    thread = threading.Thread(target=lambda: asyncio.run(main()))
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    return out


def test_live_updates_from_mcp_writes_updates_and_deletes(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    first = write(service, "chat", "hello")
    second = write(service, "chat", "to be deleted")
    b = make_browser()
    select_session(qtbot, b, "chat")
    select_history_rows(b, 0)
    [written] = _run_mcp(
        service,
        [("write_message", {"session_id": "chat", "role": "assistant", "content": "from a host"})],
    )
    new_id = written["message"]["message_id"]
    qtbot.waitUntil(lambda: history_ids(b) == [first["message_id"], second["message_id"], new_id])
    qtbot.waitUntil(
        lambda: (
            b.browse.sessions_model.row_data(b.browse.sessions_model.row_of("chat"))[
                "message_count"
            ]
            == 3
        )
    )
    # a new session appears in the list without a refresh
    _run_mcp(service, [("write_message", {"session_id": "fresh", "role": "user", "content": "hi"})])
    qtbot.waitUntil(lambda: b.browse.sessions_model.row_of("fresh") >= 0)
    # an update shows in the row and in the open detail
    _run_mcp(
        service,
        [
            (
                "update_message",
                {"message_id": first["message_id"], "metadata_json": '{"tags":["live"]}'},
            )
        ],
    )
    qtbot.waitUntil(lambda: b.browse.history_model.index(0, 5).data() == "live")
    qtbot.waitUntil(lambda: b.browse.detail.fields["tags"].text() == "live")
    assert b.browse.editor.message is not None and b.browse.editor.message["revision"] == 2
    # a delete makes the row vanish at once
    _run_mcp(service, [("delete_message", {"message_id": second["message_id"]})])
    qtbot.waitUntil(lambda: history_ids(b) == [first["message_id"], new_id])
