"""Import a file into a MemoryService: detect the format, validate, store in durable batches.

Every source yields ready messages (ids derived from the source, see records.py) and skipped
records with their position and reason. The importer drops what is already in the store (by
id) or repeated in the file, stores the rest in batches of `BATCH` messages (each batch durable
before the next starts: one fsync a batch) and reports counts. An interrupted import is
resumable: run it again and the batches already stored are found by id and skipped, so every
message ends up stored exactly once. A dry run does everything but store (`service` may be
None: an empty store).
"""

from __future__ import annotations

import json
import os
import threading
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Final, Protocol

from convmem_engine.domain.message import Message
from convmem_engine.service import MemoryService
from convmem_engine.service.ids import utc_millis
from convmem_engine.transfer import chatgpt, claude_ai, jsonl, memory_graph
from convmem_engine.transfer.records import ImportFormatError, Skip, random_bits_of

FORMATS: Final = ("chatgpt", "claude", "memory-json", "jsonl")
BATCH: Final = 2000
BATCH_BYTES: Final = 8 << 20
MAX_PROBLEMS: Final = 1000
"""Problems listed one by one (all are counted)."""

Progress = Callable[[int, int], None]


class Source(Protocol):
    name: str
    total: int

    def items(self) -> Iterator[tuple[int, Message | Skip]]: ...


@dataclass
class ImportReport:
    format: str
    dry_run: bool
    conversations: int = 0
    """Sessions that got (or would get) at least one message."""
    messages: int = 0
    """Messages stored (or that would be stored)."""
    skipped: Counter[str] = field(default_factory=Counter)
    """Skipped records by reason."""
    problems: list[Skip] = field(default_factory=list)
    """The first MAX_PROBLEMS skipped records, with their positions."""
    cancelled: bool = False

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    def skip(self, item: Skip) -> None:
        self.skipped[item.reason] += 1
        if item.position and len(self.problems) < MAX_PROBLEMS:
            self.problems.append(item)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "dry_run": self.dry_run,
            "conversations": self.conversations,
            "messages": self.messages,
            "skipped": self.skipped_total,
            "skipped_by_reason": dict(self.skipped.most_common()),
            "problems": [{"position": p.position, "reason": p.reason} for p in self.problems],
            "cancelled": self.cancelled,
        }


# -- reading and detecting ---------------------------------------------------------------------


def _load_json(stream: IO[bytes], what: str) -> Any:
    try:
        return json.loads(stream.read().decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise ImportFormatError(f"{what}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ImportFormatError(
            f"{what}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})"
        ) from None
    except RecursionError:
        raise ImportFormatError(f"{what}: JSON nested too deeply") from None


def _conversations_format(data: object, forced: str | None, what: str) -> str:
    if forced is not None:
        return forced
    if not isinstance(data, list):
        raise ImportFormatError(f"{what}: not an export this version can read (use --format)")
    for item in data[:50]:
        if chatgpt.looks_like(item):
            return "chatgpt"
        if claude_ai.looks_like(item):
            return "claude"
    if not data:
        return "chatgpt"  # empty: nothing to import either way
    raise ImportFormatError(
        f"{what}: a JSON array, but not of ChatGPT or Claude conversations (use --format)"
    )


def _zip_member(archive: zipfile.ZipFile) -> str:
    names = [n for n in archive.namelist() if n.rsplit("/", 1)[-1] == "conversations.json"]
    if not names:
        raise ImportFormatError("zip: holds no conversations.json")
    return min(names, key=lambda n: (n.count("/"), n))


def _first_line(path: str) -> tuple[bytes, bytes]:
    """(first non-blank byte, first non-blank line) of a file, after a UTF-8 BOM."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    return text[:1], text.split(b"\n", 1)[0]


class _Opened:
    """A source and the file it reads (closed by the importer)."""

    def __init__(self, source: Source, stream: IO[bytes] | None = None) -> None:
        self.source = source
        self.stream = stream


def _memory_known(service: MemoryService | None) -> dict[int, str]:
    """Random bits -> id of the messages already in memory.json's session."""
    known: dict[int, str] = {}
    if service is None:
        return known
    cursor: str | None = None
    while True:
        page = service.read_messages(
            view="history", session_id=memory_graph.SESSION, limit=1000, cursor=cursor
        )
        for m in page["history"]:
            known[random_bits_of(m["message_id"])] = m["message_id"]
        cursor = page.get("nextCursor")
        if cursor is None:
            return known


def open_source(path: str, fmt: str | None, service: MemoryService | None, now_ms: int) -> _Opened:
    if fmt is not None and fmt not in FORMATS:
        raise ImportFormatError("format: must be one of " + " / ".join(FORMATS))
    name = os.path.basename(path)
    if zipfile.is_zipfile(path):
        if fmt in ("memory-json", "jsonl"):
            raise ImportFormatError(f"{name}: a zip archive, not a {fmt} file")
        with zipfile.ZipFile(path) as archive:
            member = _zip_member(archive)
            with archive.open(member) as stream:
                data = _load_json(stream, "conversations.json")
        kind = _conversations_format(data, fmt, "conversations.json")
        return _Opened(_conversations_source(kind, data))
    first_byte, first_line = _first_line(path)
    if fmt in ("chatgpt", "claude") or (fmt is None and first_byte == b"["):
        with open(path, "rb") as f:
            data = _load_json(f, name)
        kind = _conversations_format(data, fmt, name)
        return _Opened(_conversations_source(kind, data))
    if fmt is None:
        if first_byte != b"{":
            raise ImportFormatError(f"{name}: not a format this version can read (use --format)")
        try:
            first = json.loads(first_line)
        except ValueError:
            raise ImportFormatError(
                f"{name}: line 1 is not valid JSON (use --format to import the rest)"
            ) from None
        if jsonl.looks_like(first):
            fmt = "jsonl"
        elif memory_graph.looks_like(first):
            fmt = "memory-json"
        else:
            raise ImportFormatError(f"{name}: not a format this version can read (use --format)")
    if fmt == "memory-json":
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            lines = f.read().splitlines()
        known = _memory_known(service)
        return _Opened(memory_graph.MemoryGraphSource(lines, now_ms=now_ms, known_bits=known))
    stream = open(path, "rb")  # noqa: SIM115 (closed by run_import)
    first_bytes = stream.read(3)
    if first_bytes != b"\xef\xbb\xbf":
        stream.seek(0)
    return _Opened(jsonl.JsonlSource(stream, os.fstat(stream.fileno()).st_size), stream)


def _conversations_source(kind: str, data: object) -> Source:
    if kind == "chatgpt":
        return chatgpt.ChatGPTSource(data)
    if kind == "claude":
        return claude_ai.ClaudeSource(data)
    raise ImportFormatError(f"format: {kind} files are JSON Lines, not a JSON array")


# -- importing ---------------------------------------------------------------------------------


class _Batcher:
    def __init__(self, report: ImportReport, service: MemoryService | None, dry_run: bool) -> None:
        self.report = report
        self.service = service
        self.dry_run = dry_run
        self.batch: list[Message] = []
        self.bytes = 0
        self.seen: set[str] = set()
        self.sessions: set[str] = set()

    def add(self, msg: Message) -> None:
        # Counted, not listed (no position): expected when a file is imported again.
        if msg.message_id in self.seen:
            self.report.skip(Skip("", "repeats an earlier record of the file"))
            return
        self.seen.add(msg.message_id)
        self.batch.append(msg)
        self.bytes += len(msg.content) + 256
        if len(self.batch) >= BATCH or self.bytes >= BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        batch, self.batch, self.bytes = self.batch, [], 0
        if not batch:
            return
        existing: set[str] = set()
        if self.service is not None:
            existing = self.service.existing_ids(m.message_id for m in batch)
        todo: list[Message] = []
        for msg in batch:
            if msg.message_id in existing:
                self.report.skip(Skip("", "already in the store"))
            else:
                todo.append(msg)
        if not self.dry_run and todo:
            assert self.service is not None
            stored = self.service.import_messages(todo)
            if len(stored) != len(todo):  # written meanwhile by someone else with these ids
                got = {m.message_id for m in stored}
                for msg in todo:
                    if msg.message_id not in got:
                        self.report.skip(Skip("", "already in the store"))
            todo = stored
        self.report.messages += len(todo)
        self.sessions.update(m.session_id for m in todo)
        self.report.conversations = len(self.sessions)


def run_import(
    path: str | os.PathLike[str],
    *,
    service: MemoryService | None,
    fmt: str | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    now_ms: Callable[[], int] = utc_millis,
) -> ImportReport:
    """Import one file. `service` None is only for a dry run (an empty store). Raises
    ImportFormatError when the file is not in a format we read (nothing stored), OSError
    when it cannot be read, and the store's errors (StoreIOError...) when storing fails
    (the batches stored before are durable: run it again to finish)."""
    if service is None and not dry_run:
        raise ValueError("run_import: a service is required unless dry_run")
    opened = open_source(os.fspath(path), fmt, service, now_ms())
    source = opened.source
    report = ImportReport(format=source.name, dry_run=dry_run)
    batcher = _Batcher(report, service, dry_run)
    last_tick = 0
    step = max(1, source.total // 1000)
    try:
        for done, item in source.items():
            if cancel is not None and cancel.is_set():
                report.cancelled = True
                break
            if isinstance(item, Skip):
                report.skip(item)
            else:
                batcher.add(item)
            if progress is not None and done - last_tick >= step:
                last_tick = done
                progress(done, source.total)
        batcher.flush()  # also when cancelled: what was read so far is stored, durably
        if progress is not None and not report.cancelled:
            progress(source.total, source.total)
    finally:
        if opened.stream is not None:
            opened.stream.close()
    return report
