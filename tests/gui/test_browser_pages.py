"""Pages: a page registered in the list gets its tab, shortcut, live events, the Delete action
and its saved tab, without the window knowing it; tabs are found by name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from gui_helpers import delete_confirmation, write
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QMessageBox, QStackedWidget, QWidget

from convmem_app.browser import MemoryBrowser
from convmem_app.browser.bulk import Target
from convmem_app.browser.page import BrowserPage, PageContext
from convmem_app.browser.pages import PAGES
from convmem_app.browser.search_panel import SearchPanel
from convmem_engine.service import ChangeEvent, MemoryService

pytestmark = pytest.mark.gui


class ProbePage(BrowserPage):
    name = "probe"
    title = "&Probe"

    def __init__(self, context: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(context, parent)
        self.shown = 0
        self.events: list[tuple[str, str | None]] = []
        self.targets: list[Target] = []
        self.deleted: set[str] = set()
        self.refreshed: list[bool] = []

    def page_shown(self) -> None:
        self.shown += 1

    def on_changes(self, changes: Sequence[ChangeEvent]) -> None:
        self.events.extend((change.kind, change.message_id) for change in changes)

    def refresh(self, current: bool) -> None:
        self.refreshed.append(current)

    def delete_targets(self) -> list[Target]:
        return list(self.targets)

    def messages_deleted(self, message_ids: set[str]) -> None:
        self.deleted |= message_ids


def browser(qtbot: Any, service: MemoryService, settings: QSettings) -> MemoryBrowser:
    b = MemoryBrowser(service, settings=settings, pages=(*PAGES, ProbePage))
    qtbot.addWidget(b)
    b.show()
    return b


def test_a_registered_page_is_a_tab_with_its_shortcut_events_and_delete(
    qtbot: Any, service: MemoryService, settings: QSettings
) -> None:
    b = browser(qtbot, service, settings)
    probe = b.page_of(ProbePage)
    assert b.page("probe") is probe and probe.context.service is service
    assert probe.context.runtime is None  # a bare browser, not inside the app
    assert [b.tabs.tabText(i) for i in range(b.tabs.count())][-1] == "&Probe"
    assert b.act_tabs[-1].shortcut().toString() == "Ctrl+4"
    b.act_tabs[-1].trigger()
    assert b.current_page() is probe and probe.is_current() and probe.shown == 1
    assert not b.page_of(SearchPanel).is_current()

    message = write(service, "s", "followed live")
    qtbot.waitUntil(lambda: ("write", message["message_id"]) in probe.events)
    b.refresh()
    assert probe.refreshed == [True]

    assert not b.act_delete.isEnabled()
    probe.targets = [Target(message["message_id"], message["revision"], "s")]
    probe.selectionChanged.emit()
    assert b.act_delete.isEnabled()
    box = delete_confirmation(qtbot, b, b.act_delete.trigger)
    with qtbot.waitSignal(b.deleted, timeout=10_000):
        box.button(QMessageBox.StandardButton.Yes).click()
    assert probe.deleted == {message["message_id"]}
    qtbot.waitUntil(lambda: ("delete", message["message_id"]) in probe.events)

    b.close()
    assert settings.value("browser/tab") == "probe"  # saved by name
    again = browser(qtbot, service, settings)
    assert again.current_page() is again.page("probe")
    again.close()
    assert again.shutdown() and b.shutdown()


def test_pages_need_unique_names(qtbot: Any, service: MemoryService, settings: QSettings) -> None:
    with pytest.raises(ValueError, match="unique name"):
        MemoryBrowser(service, settings=settings, pages=(*PAGES, ProbePage, ProbePage))
    b = browser(qtbot, service, settings)
    with pytest.raises(KeyError):
        b.page("nothing")
    b.close()
    assert b.shutdown()


def test_a_page_placed_in_a_container_tab_is_still_found(
    qtbot: Any, service: MemoryService, settings: QSettings
) -> None:
    """A tab may hold a page inside another widget (e.g. a stack with a welcome page): the
    window still finds, shows and asks that page."""
    b = browser(qtbot, service, settings)
    probe = b.page_of(ProbePage)
    index = b.tabs.indexOf(probe)
    b.tabs.removeTab(index)
    stack = QStackedWidget()
    stack.addWidget(probe)
    b.tabs.insertTab(index, stack, probe.title)
    b.tabs.setCurrentIndex(0)
    assert b.show_page("probe") is probe
    assert b.tabs.currentWidget() is stack
    assert b.current_page() is probe and probe.is_current()
    other = QWidget()
    b.tabs.addTab(other, "Other")  # a tab holding no page
    b.tabs.setCurrentWidget(other)
    assert b.current_page() is None and not b.act_delete.isEnabled()
    b.close()
    assert b.shutdown()
