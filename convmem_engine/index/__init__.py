"""Derived in-memory indexes over the store: history, search, relations. Rebuildable."""

from convmem_engine.index.search_index import SearchHit, SearchIndex

__all__ = ["SearchHit", "SearchIndex"]
