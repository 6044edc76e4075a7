"""The memory browser: Qt models and views over a MemoryService (never over storage)."""

from convmem_app.browser.window import SETTINGS_APP, SETTINGS_ORG, MemoryBrowser, default_settings

__all__ = ["SETTINGS_APP", "SETTINGS_ORG", "MemoryBrowser", "default_settings"]
