"""Small compositions of MemoryService calls used by several views (run them on workers)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from convmem_engine.domain import ConflictError, NotFoundError
from convmem_engine.domain.limits import CONTENT_LIMIT_MAX

if TYPE_CHECKING:
    from convmem_app.browser.jobs import Job
    from convmem_engine.service import MemoryService


def fetch_message(service: MemoryService, message_id: str) -> dict[str, Any]:
    """The live message (raises NotFoundError when it is gone)."""
    result = service.read_messages(
        view="context", message_id=message_id, before=0, after=0, relation_depth=0
    )
    return dict(result["message"])


def fetch_messages(service: MemoryService, message_ids: list[str]) -> list[dict[str, Any]]:
    """The live messages of `message_ids` that still exist, in that order."""
    messages = []
    for message_id in message_ids:
        try:
            messages.append(fetch_message(service, message_id))
        except NotFoundError:
            continue
    return messages


def fetch_content(
    service: MemoryService,
    job: Job,
    message_id: str,
    revision: int | None,
    chunk: int = CONTENT_LIMIT_MAX,
) -> tuple[str, int] | None:
    """Whole content through the content view, pinned to one revision; None when cancelled.

    If the message changes between chunks (CONFLICT) the read starts again at the new revision,
    so the text shown is always one revision's, never a mix.
    """
    for _attempt in range(3):
        parts: list[str] = []
        offset = 0
        expected = revision
        try:
            while True:
                if job.cancelled:
                    return None
                r = service.read_messages(
                    view="content",
                    message_id=message_id,
                    content_offset=offset,
                    content_limit=chunk,
                    expected_revision=expected,
                )["content_range"]
                expected = int(r["revision"])
                parts.append(r["content"])
                job.report(int(r["next_content_offset"]), int(r["total_bytes"]))
                if r["complete"]:
                    return "".join(parts), expected
                offset = int(r["next_content_offset"])
        except ConflictError:
            revision = None
    raise ConflictError("content: the message kept changing while it was being read")
