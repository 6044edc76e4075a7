"""Derived in-memory indexes over the store: history, search, relations. Rebuildable."""
