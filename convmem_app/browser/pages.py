"""The memory browser's pages, in tab order: the one place a page is registered.

To add a page: subclass `BrowserPage` (convmem_app/browser/page.py) with a unique `name` and a
`title`, override the hooks it needs, and add the class here. The window gives it a tab, a
View-menu entry with the next Ctrl+<n> shortcut, live change events, the Delete action, F5,
palette changes and saved layout; nothing in window.py changes. See docs/browser.md.
"""

from __future__ import annotations

from convmem_app.browser.browse_panel import BrowsePanel
from convmem_app.browser.maintenance_panel import MaintenancePanel
from convmem_app.browser.page import BrowserPage
from convmem_app.browser.search_panel import SearchPanel

PAGES: tuple[type[BrowserPage], ...] = (BrowsePanel, SearchPanel, MaintenancePanel)
"""Every page of the browser, in tab order. `BrowsePanel` must stay: messages open in it."""
