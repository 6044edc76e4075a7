"""Metadata editor (validation, save, conflict), relations/context panel, delete."""

from __future__ import annotations

from typing import Any

import pytest
from gui_helpers import (
    delete_confirmation,
    history_ids,
    select_history_rows,
    select_session,
    stored,
    update,
    write,
)
from PySide6.QtWidgets import QMessageBox

from convmem_app.browser.browse_panel import DETAIL_EDIT
from convmem_app.browser.context_panel import TARGET_ROLE
from convmem_engine.domain import limits
from convmem_engine.service import MemoryService

pytestmark = pytest.mark.gui


def _open_first(qtbot: Any, b: Any, session: str, row: int = 0) -> None:
    select_session(qtbot, b, session)
    select_history_rows(b, row)
    b.browse.detail_tabs.setCurrentIndex(DETAIL_EDIT)
    qtbot.waitUntil(lambda: b.browse.editor.message is not None)


def test_editor_validates_inline_and_saves_with_revision(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    msg = write(service, "s", "remember the port is 8080")
    other = write(service, "s", "the source")
    b = make_browser()
    _open_first(qtbot, b, "s")
    ed = b.browse.editor
    assert not ed.save_button.isEnabled()  # nothing changed yet
    ed.tags.setText("ops, " + "x" * (limits.TAG_MAX_BYTES + 1))
    assert ed.errors["tags"].isVisibleTo(ed)
    assert "tags[1]" in ed.errors["tags"].text() and "x" * 20 not in ed.errors["tags"].text()
    assert not ed.save_button.isEnabled()
    ed.sources.setPlainText("not-a-ulid")
    assert "source_message_ids[0]" in ed.errors["source_message_ids"].text()
    ed.sources.setPlainText(other["message_id"])
    ed.tags.setText("ops, network")
    assert not ed.errors["tags"].isVisibleTo(ed)
    ed.kind.setCurrentText("semantic")
    ed.tier.setCurrentText("long")
    ed.importance.setValue(90)
    ed.summary.setPlainText("port 8080")
    ed.add_relation("derived_from", other["message_id"])
    assert ed.validation_errors() == {}
    assert ed.save_button.isEnabled()
    with qtbot.waitSignal(ed.saved) as saved:
        ed.save_button.click()
    assert saved.args[0]["revision"] == 2
    now = stored(service, msg["message_id"])
    assert now["revision"] == 2
    assert now["metadata"] == {
        "tags": ["ops", "network"],
        "memory_tier": "long",
        "memory_kind": "semantic",
        "importance": 90,
        "summary": "port 8080",
        "relations": [{"type": "derived_from", "message_id": other["message_id"]}],
        "source_message_ids": [other["message_id"]],
    }
    assert b.browse.history_model.index(0, 2).data() == "semantic"  # the row follows the save
    assert ed.status.text() == "Saved."
    assert not ed.save_button.isEnabled()


def test_conflict_shows_both_versions_and_overwrites_deliberately(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    msg = write(service, "s", "text", importance=10)
    b = make_browser()
    _open_first(qtbot, b, "s")
    ed = b.browse.editor
    ed.importance.setValue(99)
    # someone else (another host) changes the message meanwhile
    update(service, msg["message_id"], '{"importance": 42, "tags": ["theirs"]}')
    qtbot.waitUntil(lambda: ed.banner.isVisibleTo(ed))  # the live event warns before saving
    with qtbot.waitSignal(ed.conflictShown) as shown:
        ed.save_button.click()
    dialog = shown.args[0]
    assert set(dialog.differing) == {"importance", "tags"}
    assert dialog.table.item(3, 0).text() == "99" and dialog.table.item(3, 1).text() == "42"
    assert "revision 2" in dialog.table.horizontalHeaderItem(1).text()
    with qtbot.waitSignal(ed.saved) as saved:
        dialog.overwrite_button.click()
    assert saved.args[0]["revision"] == 3
    now = stored(service, msg["message_id"])
    assert now["metadata"]["importance"] == 99 and now["metadata"]["tags"] == []


def test_conflict_reload_takes_the_stored_version(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    msg = write(service, "s", "text")
    b = make_browser()
    _open_first(qtbot, b, "s")
    ed = b.browse.editor
    ed.summary.setPlainText("mine")
    update(service, msg["message_id"], '{"summary": "theirs"}')
    with qtbot.waitSignal(ed.conflictShown) as shown:
        ed.save()
    shown.args[0].reload_button.click()
    qtbot.waitUntil(lambda: ed.conflict_dialog is None)
    assert ed.summary.toPlainText() == "theirs"
    assert ed.message is not None and ed.message["revision"] == 2
    assert not ed.dirty
    assert stored(service, msg["message_id"])["metadata"]["summary"] == "theirs"


def test_context_panel_shows_neighbours_relations_deleted_targets_and_navigates(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    base = write(service, "a", "the base fact")
    gone = write(service, "a", "a note that will be deleted")
    write(service, "a", "between")
    derived = write(
        service,
        "b",
        "derived conclusion",
        relations=[
            {"type": "derived_from", "message_id": base["message_id"]},
            {"type": "related_to", "message_id": gone["message_id"]},
        ],
    )
    service.delete_message(message_id=gone["message_id"])
    b = make_browser()
    select_session(qtbot, b, "b")
    with qtbot.waitSignal(b.browse.context_panel.loaded):
        select_history_rows(b, 0)
    tree = b.browse.context_panel.tree
    relations = tree.topLevelItem(3)
    assert relations.text(0) == "Relations (2)"
    texts = {relations.child(i).text(1): relations.child(i) for i in range(2)}
    deleted = texts["→ related_to (depth 1)"]
    assert deleted.text(0) == f"{gone['message_id']} — deleted"
    assert deleted.data(0, TARGET_ROLE) is None  # not navigable
    target = texts["→ derived_from (depth 1)"]
    assert target.data(0, TARGET_ROLE) == (base["message_id"], "a")
    # the type filter narrows the graph
    with qtbot.waitSignal(b.browse.context_panel.loaded):
        b.browse.context_panel.type_boxes["related_to"].setChecked(False)
    assert tree.topLevelItem(3).text(0) == "Relations (1)"
    # activating an entry jumps to it in its own session
    with qtbot.waitSignal(b.messageOpened) as opened:
        tree.itemActivated.emit(tree.topLevelItem(3).child(0), 0)
    assert opened.args == [base["message_id"]]
    assert b.browse.history_model.session_id == "a"
    # from the base, the derived message is an incoming relation
    qtbot.waitUntil(lambda: b.browse.context_panel.result is not None)
    rel = b.browse.context_panel.result["relations"]
    assert [(r["type"], r["direction"]) for r in rel] == [("derived_from", "incoming")]
    assert rel[0]["message"]["message_id"] == derived["message_id"]


def test_delete_several_with_confirmation_rows_vanish(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    ids = [write(service, "s", f"m{i}")["message_id"] for i in range(4)]
    b = make_browser()
    select_session(qtbot, b, "s")
    select_history_rows(b, 1, 3)
    assert b.act_delete.isEnabled()
    box = delete_confirmation(qtbot, b, b.act_delete.trigger)
    assert box.text() == "Delete 2 messages?"
    assert "Rebuild index" in box.informativeText() and "physically" in box.informativeText()
    with qtbot.waitSignal(b.deleted) as done:
        box.button(QMessageBox.StandardButton.Yes).click()
    assert done.args == [2]
    qtbot.waitUntil(lambda: history_ids(b) == [ids[0], ids[2]])
    page = service.read_messages(view="history", session_id="s")["history"]
    assert [m["message_id"] for m in page] == [ids[0], ids[2]]


def test_delete_is_revision_checked_a_host_edit_after_selection_is_kept_and_reported(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    ids = [write(service, "s", f"m{i}")["message_id"] for i in range(5)]
    b = make_browser()
    select_session(qtbot, b, "s")
    select_history_rows(b, 0, 1, 2, 3)
    box = delete_confirmation(qtbot, b, b.act_delete.trigger)
    assert box.text() == "Delete 4 messages?"
    assert "kept and reported" in box.informativeText()
    # while the dialog is open a host edits one selected message and deletes another
    update(service, ids[1], '{"importance": 7}')
    service.delete_message(message_id=ids[2])
    with qtbot.waitSignal(b.deleteFinished, timeout=10_000) as done:
        box.button(QMessageBox.StandardButton.Yes).click()
    result = done.args[0]
    assert (result.changed, result.conflicts, result.missing) == (
        [ids[0], ids[3]],
        [ids[1]],
        [ids[2]],
    )
    assert b.last_delete is result
    text = b.status_text.text()
    assert text.startswith("Deleted 2 messages (")
    assert "1 changed by another client meanwhile (kept, not deleted)" in text
    assert "1 deleted meanwhile" in text
    assert stored(service, ids[1])["metadata"]["importance"] == 7  # the host's edit survives
    left = [
        m["message_id"] for m in service.read_messages(view="history", session_id="s")["history"]
    ]
    assert left == [ids[1], ids[4]]
    qtbot.waitUntil(lambda: history_ids(b) == left)


def test_delete_from_search_results_is_revision_checked(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    ids = [write(service, "s", f"zebra note {i}")["message_id"] for i in range(3)]
    b = make_browser()
    search = b.show_page("search")
    with qtbot.waitSignal(search.searched):
        search.query.setText("zebra")
        search.search()
    assert {r["message_id"] for r in search.model.results} == set(ids)
    search.view.selectAll()
    box = delete_confirmation(qtbot, b, b.delete_selected)
    assert box.text() == "Delete 3 messages?"
    update(service, ids[0], '{"tags": ["keep"]}')
    with qtbot.waitSignal(b.deleteFinished, timeout=10_000) as done:
        box.button(QMessageBox.StandardButton.Yes).click()
    result = done.args[0]
    assert sorted(result.changed) == sorted(ids[1:]) and result.conflicts == [ids[0]]
    assert "1 changed by another client meanwhile" in b.status_text.text()
    assert stored(service, ids[0])["metadata"]["tags"] == ["keep"]
    assert service.get_system_health()["active_messages"] == 1


def test_cancelled_delete_keeps_everything(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    ids = [write(service, "s", f"m{i}")["message_id"] for i in range(2)]
    b = make_browser()
    select_session(qtbot, b, "s")
    select_history_rows(b, 0)
    delete_confirmation(qtbot, b, b.delete_selected).button(
        QMessageBox.StandardButton.Cancel
    ).click()
    qtbot.waitUntil(lambda: b.delete_confirmation is None)
    assert history_ids(b) == ids
    assert len(service.read_messages(view="history", session_id="s")["history"]) == 2


def test_unsaved_edits_survive_a_selection_change_until_saved_or_reverted(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    first = write(service, "s", "first")
    second = write(service, "s", "second")
    b = make_browser()
    _open_first(qtbot, b, "s")
    ed = b.browse.editor
    ed.importance.setValue(1)
    select_history_rows(b, 1)  # the user moves on without saving
    assert (
        b.browse.detail.message is not None
        and b.browse.detail.message["message_id"] == second["message_id"]
    )
    assert ed.message is not None and ed.message["message_id"] == first["message_id"]
    assert ed.banner.isVisibleTo(ed) and ed.importance.value() == 1
    with qtbot.waitSignal(ed.saved):
        ed.save()
    qtbot.waitUntil(
        lambda: ed.message is not None and ed.message["message_id"] == second["message_id"]
    )
    assert "Now showing the selected message" in ed.status.text()
    assert stored(service, first["message_id"])["metadata"]["importance"] == 1
    # revert drops the edits and follows the selection too
    ed.importance.setValue(2)
    select_history_rows(b, 0)
    assert ed.message["message_id"] == second["message_id"]
    ed.revert()
    assert ed.message["message_id"] == first["message_id"] and not ed.dirty
    assert stored(service, second["message_id"])["metadata"]["importance"] == 50


def test_multi_delete_can_be_cancelled_and_stays_consistent(
    qtbot: Any, service: MemoryService, make_browser: Any
) -> None:
    for i in range(30):
        write(service, "s", f"m{i}")
    b = make_browser()
    select_session(qtbot, b, "s")
    b.browse.history_view.selectAll()
    box = delete_confirmation(qtbot, b, b.delete_selected)
    with qtbot.waitSignal(b.deleted, timeout=20_000) as done:
        box.button(QMessageBox.StandardButton.Yes).click()
        assert b.cancel_delete_button.isVisibleTo(b)
        b.cancel_delete()  # stops between two messages (how many went first is timing)
    left = [
        m["message_id"] for m in service.read_messages(view="history", session_id="s")["history"]
    ]
    assert done.args[0] == 30 - len(left)
    qtbot.waitUntil(lambda: history_ids(b) == left)
    assert not b.cancel_delete_button.isVisibleTo(b)
