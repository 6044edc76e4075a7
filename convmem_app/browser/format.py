"""Turn tool-result values into short text for cells, labels and tooltips."""

from __future__ import annotations

from collections.abc import Mapping

from PySide6.QtCore import QDateTime

from convmem_engine.domain.message import MEMORY_KINDS

PREVIEW_CHARS = 160
KIND_ABBREV = {
    "conversation": "conv",
    "episode": "epis",
    "semantic": "sem",
    "procedure": "proc",
    "preference": "pref",
    "summary": "summ",
}


def time_text(ms: int | None, seconds: bool = False) -> str:
    if not ms:
        return ""
    fmt = "yyyy-MM-dd HH:mm:ss" if seconds else "yyyy-MM-dd HH:mm"
    return QDateTime.fromMSecsSinceEpoch(int(ms)).toString(fmt)


def bytes_text(n: int | float) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # pragma: no cover - loop always returns


def one_line(text: str, limit: int = PREVIEW_CHARS) -> str:
    """First `limit` characters with whitespace runs collapsed to single spaces."""
    head = text[: limit * 4]
    flat = " ".join(head.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def kind_counts_text(counts: Mapping[str, int]) -> str:
    parts = [f"{KIND_ABBREV.get(k, k)} {counts[k]}" for k in MEMORY_KINDS if counts.get(k)]
    return " · ".join(parts)


def kind_counts_tooltip(counts: Mapping[str, int]) -> str:
    return "\n".join(f"{k}: {counts.get(k, 0)}" for k in MEMORY_KINDS)


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))
