"""Claude's `conversations.json` (claude.ai → Settings → Privacy → Export data).

The file is a JSON array of conversations: `{uuid, name, created_at, updated_at,
chat_messages}`. Each chat message has `uuid`, `sender` (`human` or `assistant`), `text`,
`content` (blocks: `text`, `tool_use`, `tool_result`, `thinking`), `created_at` (ISO 8601) and
`attachments` (`file_name`, `extracted_content`) / `files`.

Mapping into ConvMem (docs/transfer.md): one session a conversation, `claude:<uuid>`, messages
in `created_at` order whatever their order in the file (ties keep the file order); the name is
the first message's `metadata.summary`; tag `import:claude`. A message's text is its text
blocks, tool use and results marked as such, and the text of its attachments, each under an
`[attachment: name]` line. Thinking blocks are the model's hidden reasoning and are left out.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, Final

from convmem_engine.domain.message import Message
from convmem_engine.transfer.records import (
    ConversationsSource,
    Skip,
    build_message,
    fitting_summary,
    identity_bits,
    make_id,
)

SOURCE: Final = "claude"
SOURCE_TAG: Final = "import:claude"
_ROLES: Final = {"human": "user", "user": "user", "assistant": "assistant"}


def looks_like(item: object) -> bool:
    return isinstance(item, dict) and isinstance(item.get("chat_messages"), list)


def iso_to_ms(value: object) -> int | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    ms = round(dt.timestamp() * 1000)
    return ms if ms >= 0 else None


def _block_text(block: object) -> str:
    if not isinstance(block, dict):
        return ""
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        return text if isinstance(text, str) else ""
    if kind == "tool_use":
        name = block.get("name")
        head = f"[tool use: {name}]" if isinstance(name, str) else "[tool use]"
        data = block.get("input")
        return head if data is None else f"{head}\n{json.dumps(data, ensure_ascii=False)}"
    if kind == "tool_result":
        name = block.get("name")
        head = f"[tool result: {name}]" if isinstance(name, str) else "[tool result]"
        inner = block.get("content")
        body = (
            "\n".join(t for t in (_block_text(b) for b in inner) if t)
            if isinstance(inner, list)
            else ""
        )
        return f"{head}\n{body}" if body else head
    return ""  # thinking and unknown blocks: not the conversation's text


def message_text(msg: dict[str, Any]) -> str:
    blocks = msg.get("content")
    text = ""
    if isinstance(blocks, list) and blocks:
        text = "\n\n".join(t for t in (_block_text(b) for b in blocks) if t)
    if not text:
        plain = msg.get("text")
        text = plain if isinstance(plain, str) else ""
    extras: list[str] = []
    for att in msg.get("attachments") or ():
        if isinstance(att, dict):
            name = att.get("file_name") if isinstance(att.get("file_name"), str) else "file"
            body = att.get("extracted_content")
            extras.append(f"[attachment: {name}]\n{body}" if isinstance(body, str) else "")
    for f in msg.get("files") or ():
        if isinstance(f, dict) and isinstance(f.get("file_name"), str):
            extras.append(f"[file: {f['file_name']}]")
    return "\n\n".join(t for t in (text, *extras) if t)


class ClaudeSource(ConversationsSource):
    """Items of one Claude `conversations.json`; progress counts conversations."""

    name = SOURCE

    def _conversation(self, ci: int, conv: object) -> Iterator[Message | Skip]:
        pos = f"conversation {ci}"
        if not looks_like(conv):
            yield Skip(pos, "not a Claude conversation (no chat_messages)")
            return
        assert isinstance(conv, dict)
        conv_id = conv.get("uuid")
        if not isinstance(conv_id, str) or not conv_id:
            yield Skip(pos, "uuid: missing")
            return
        name = conv.get("name")
        summary = fitting_summary(name if isinstance(name, str) else None)
        fallback = iso_to_ms(conv.get("created_at")) or 0
        timed: list[tuple[int, int, dict[str, Any]]] = []
        for mi, msg in enumerate(conv["chat_messages"], 1):
            if not isinstance(msg, dict):
                yield Skip(f"{pos}, message {mi}", "message: must be an object")
                continue
            ms = iso_to_ms(msg.get("created_at"))
            timed.append((fallback if ms is None else ms, mi, msg))
        timed.sort(key=lambda t: (t[0], t[1]))
        last_id_ms = -1
        for ms, mi, msg in timed:
            mpos = f"{pos}, message {mi}"
            role = _ROLES.get(msg.get("sender"))  # type: ignore[arg-type]
            if role is None:
                yield Skip(mpos, "sender: must be human or assistant")
                continue
            key = msg.get("uuid")
            id_ms = max(ms, last_id_ms + 1)
            built = build_message(
                mpos,
                message_id=make_id(
                    id_ms, identity_bits(SOURCE, conv_id, key if isinstance(key, str) else str(mi))
                ),
                session_id=f"{SOURCE}:{conv_id}",
                role=role,
                content=message_text(msg),
                timestamp=ms,
                updated_at=iso_to_ms(msg.get("updated_at")),
                tags=(SOURCE_TAG,),
                summary=summary,
            )
            if isinstance(built, Message):
                summary = None
                last_id_ms = id_ms
            yield built
