"""Export through the service's public reads: JSONL (lossless) and Markdown (readable).

Exports read pages of `read_messages` (sessions, then each session's history), so they run
while hosts keep writing and change nothing. Every file is written whole or not at all
(files.atomic_file) and is user-only.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from convmem_engine.domain import validation as v
from convmem_engine.domain.errors import NotFoundError
from convmem_engine.service import MemoryService
from convmem_engine.service.ids import utc_millis
from convmem_engine.transfer import jsonl
from convmem_engine.transfer.files import atomic_file, make_private_dir

PAGE: Final = 1000
EXPORT_FORMATS: Final = ("jsonl", "markdown")
_SUMMARY_SHOWN_MAX: Final = 500

Progress = Callable[[int, int], None]


class ExportCancelled(Exception):
    """The export was cancelled (a JSONL file is not written; Markdown files done are kept)."""


@dataclass(frozen=True, slots=True)
class ExportReport:
    format: str
    path: str
    sessions: int
    messages: int
    files: int

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "path": self.path,
            "sessions": self.sessions,
            "messages": self.messages,
            "files": self.files,
        }


def session_entries(service: MemoryService, session_id: str | None) -> list[dict[str, Any]]:
    """The sessions view entries to export: all, or the one named (NotFoundError if empty)."""
    entries: list[dict[str, Any]] = []
    cursor: str | None = None
    want = None if session_id is None else v.session_id(session_id, "session")
    while True:
        page = service.read_messages(view="sessions", limit=PAGE, cursor=cursor)
        for entry in page["sessions"]:
            if want is None or entry["session_id"] == want:
                entries.append(entry)
        cursor = page.get("nextCursor")
        if cursor is None or (want is not None and entries):
            break
    if want is not None and not entries:
        raise NotFoundError("session: no session with this id has live messages")
    return entries


def session_messages(service: MemoryService, session_id: str) -> Iterator[dict[str, Any]]:
    """Every live message of a session in history order, as the tools return it."""
    cursor: str | None = None
    while True:
        page = service.read_messages(
            view="history", session_id=session_id, limit=PAGE, cursor=cursor
        )
        yield from page["history"]
        cursor = page.get("nextCursor")
        if cursor is None:
            return


def _check(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise ExportCancelled("export: cancelled")


def write_jsonl(
    path: str,
    messages: Iterable[dict[str, Any]],
    *,
    cancel: threading.Event | None = None,
    tick: Callable[[], None] | None = None,
) -> int:
    """Write messages (their `to_json()` form) as a ConvMem JSONL file. Returns the count."""
    count = 0
    with atomic_file(path) as f:
        f.write(jsonl.header_line(utc_millis()))
        for m in messages:
            f.write(jsonl.message_line(m))
            count += 1
            if count % PAGE == 0:
                _check(cancel)
                if tick is not None:
                    tick()
    return count


def export_jsonl(
    service: MemoryService,
    path: str | os.PathLike[str],
    *,
    session_id: str | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> ExportReport:
    out = os.fspath(path)
    entries = session_entries(service, session_id)
    total = sum(int(e["message_count"]) for e in entries)
    done = [0]

    def all_messages() -> Iterator[dict[str, Any]]:
        for e in entries:
            yield from session_messages(service, e["session_id"])

    def tick() -> None:
        done[0] += PAGE
        if progress is not None:
            progress(min(done[0], total), total)

    count = write_jsonl(out, all_messages(), cancel=cancel, tick=tick)
    if progress is not None:
        progress(total, total)
    return ExportReport("jsonl", out, len(entries), count, 1)


# -- Markdown ----------------------------------------------------------------------------------


def markdown_name(session_id: str) -> str:
    """A portable file name for a session: its id made safe, plus a hash (ids may differ only
    in characters the file system cannot hold)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", session_id).strip("-.")[:60] or "session"
    digest = hashlib.sha256(session_id.encode("utf-8")).hexdigest()[:8]
    return f"{safe}-{digest}.md"


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def session_markdown(entry: dict[str, Any], messages: Iterable[dict[str, Any]]) -> str:
    lines = [f"# {entry['session_id']}", ""]
    summary = str(entry.get("representative_summary") or "")
    if summary and len(summary) <= _SUMMARY_SHOWN_MAX and "\n" not in summary:
        lines += [f"> {summary}", ""]
    lines += [
        f"{entry['message_count']} messages, {_utc(int(entry['started_at']))} to "
        f"{_utc(int(entry['last_message_at']))}",
        "",
    ]
    for m in messages:
        md = m["metadata"]
        facts = [
            f"`{m['message_id']}`",
            f"revision {m['revision']}",
            md["memory_kind"],
            f"tier {md['memory_tier']}",
            f"importance {md['importance']}",
        ]
        if md["tags"]:
            facts.append("tags: " + ", ".join(md["tags"]))
        lines += ["---", "", f"## {m['role']} · {_utc(int(m['timestamp']))}", ""]
        lines += ["<sub>" + " · ".join(facts) + "</sub>", ""]
        if md.get("summary"):
            lines += [f"*Summary:* {md['summary']}", ""]
        lines += [m["content"], ""]
    return "\n".join(lines)


def export_markdown(
    service: MemoryService,
    folder: str | os.PathLike[str],
    *,
    session_id: str | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> ExportReport:
    """One Markdown file a session in `folder` (created user-only when missing). A file of
    the same name is replaced; other files in the folder are left alone."""
    out = os.fspath(folder)
    entries = session_entries(service, session_id)
    total = sum(int(e["message_count"]) for e in entries)
    make_private_dir(out)
    done = 0
    for entry in entries:
        _check(cancel)
        text = session_markdown(entry, session_messages(service, entry["session_id"]))
        with atomic_file(os.path.join(out, markdown_name(entry["session_id"]))) as f:
            f.write(text.encode("utf-8"))
        done += int(entry["message_count"])
        if progress is not None:
            progress(done, total)
    return ExportReport("markdown", out, len(entries), done, len(entries))
