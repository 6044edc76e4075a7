"""A page of the memory browser: one tab, found by its `name`.

Every page (Browse, Search, Maintenance, and whatever comes next) subclasses `BrowserPage` and
is listed once, in tab order, in `convmem_app.browser.pages.PAGES`. The window builds each page
from a `PageContext`, adds its tab and a View-menu entry (Ctrl+1, Ctrl+2, … by position), and
from then on talks to pages only through the hooks below and the signals they emit, so adding a
page never means editing the window. How to add one: docs/browser.md, "Adding a page".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from PySide6.QtCore import QSettings, Signal
from PySide6.QtWidgets import QTabWidget, QWidget

from convmem_app.browser.bulk import Target
from convmem_app.browser.jobs import JobRunner
from convmem_app.browser.service_panel import ServicePanel

if TYPE_CHECKING:
    from convmem_engine.runtime import Runtime
    from convmem_engine.service import ChangeEvent, MemoryService


@dataclass(frozen=True)
class PageContext:
    """What a page is built from."""

    service: MemoryService
    runner: JobRunner  # the window's shared background-job runner: no service call on the GUI
    settings: QSettings
    runtime: Runtime | None = None  # the app's runtime (clients, parts); None outside the app


class BrowserPage(ServicePanel):
    """One tab of the memory browser. Subclasses set `name` and `title` and override the hooks
    they need; every hook's default does nothing."""

    name: ClassVar[str] = ""
    """Unique key: tabs are found by it (`MemoryBrowser.page(name)`), the last shown tab is
    saved under it."""
    title: ClassVar[str] = ""
    """Tab text and View-menu entry, with its mnemonic (e.g. "Sea&rch")."""

    openRequested = Signal(str, str)
    """(message_id, session_id): show that message in its session (the window opens Browse)."""
    sessionChanged = Signal(object)
    """The session this page works in (str) changed, or none is selected (None); the window
    passes it to every page's `set_current_session`."""
    selectionChanged = Signal()
    """What `delete_targets()` returns may have changed (the window re-enables its actions)."""
    statusMessage = Signal(str)
    """A line for the window's status bar."""

    def __init__(self, context: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(context.service, context.runner, parent)
        self.context = context

    def is_current(self) -> bool:
        """Its tab is the one shown in the window (whether or not the window is visible)."""
        parent = self.parentWidget()
        while parent is not None and not isinstance(parent, QTabWidget):
            parent = parent.parentWidget()
        shown = parent.currentWidget() if parent is not None else None
        return shown is not None and (shown is self or shown.isAncestorOf(self))

    # ---- hooks the window calls (GUI thread) -----------------------------------------------

    def page_shown(self) -> None:
        """Its tab has become the current one."""

    def focus(self) -> None:
        """Put the keyboard focus where work on this page starts (after `show_page`)."""

    def refresh(self, current: bool) -> None:
        """F5: re-read what the page shows. `current`: its tab is the one shown."""

    def on_changes(self, changes: Sequence[ChangeEvent]) -> None:
        """Durable changes to the store, oldest first (each `kind` "write", "update", "delete"
        or "rebuild", with its `message_id` and `session_id`), made by any host or by the
        browser itself; deleted messages also arrive in `messages_deleted`. Called once per
        batch (the first change after a quiet spell at once, then at most every 250 ms while
        hosts keep writing; only while the window is seen): do the page's work once per batch
        (one refresh, one read), not once per event."""

    def set_current_session(self, session_id: str | None) -> None:
        """The session selected in the browser (see `sessionChanged`)."""

    def delete_targets(self) -> list[Target]:
        """The messages the Delete action (and bulk curation) works on while this page is
        current, each with the revision shown and its session; [] when it deletes nothing here.
        A message whose revision changed meanwhile is reported, not deleted."""
        return []

    def messages_deleted(self, message_ids: set[str]) -> None:
        """These messages were deleted (by a host or by the browser): take them out."""

    def apply_palette(self) -> None:
        """The palette changed (light / dark)."""

    def restore_state(self, settings: QSettings) -> None:
        """Restore the layout saved by `save_state` (keys under "browser/")."""

    def save_state(self, settings: QSettings) -> None:
        """Save the page's layout (splitters, headers)."""

    def stop(self) -> None:
        """The window closes or shuts down: cancel what the page is loading."""
