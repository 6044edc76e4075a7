"""ChatGPT's `conversations.json` (Settings → Data controls → Export data).

The file is a JSON array of conversations. Each holds `mapping`, a tree of nodes
(`{id, message, parent, children}`) whose root has no message, and `current_node`, the last node
of the branch the user saw last. Only that branch is the conversation: walking `parent` links up
from `current_node` skips regenerated answers and the prompts that were edited away (they are
counted as skipped). A message has `author.role` (user, assistant, system, tool),
`create_time` (Unix seconds, float, may be null), `content` (`content_type` plus `parts`, or
`text` for code and execution output) and `metadata`.

Mapping into ConvMem (docs/transfer.md): one session a conversation, `chatgpt:<conversation id>`;
the title is the first message's `metadata.summary` (the session's summary in the browser);
every message is tagged `import:chatgpt`. Tool output (role `tool`: code results, browsing,
file search) is stored with role `system` and tagged `tool-output` and `tool:<name>`, never as
the user's words. Skipped, each with its reason: messages hidden from the conversation
(`metadata.is_visually_hidden_from_conversation`, e.g. the system prompt and custom
instructions), the model's hidden reasoning, empty messages, unknown roles or content types.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Final

from convmem_engine.domain.message import Message
from convmem_engine.transfer.records import (
    ConversationsSource,
    Skip,
    build_message,
    fitting_summary,
    identity_bits,
    make_id,
    valid_tags,
)

SOURCE: Final = "chatgpt"
SOURCE_TAG: Final = "import:chatgpt"
_ROLES: Final = {"user": "user", "assistant": "assistant", "system": "system", "tool": "system"}
_REASONING: Final = ("thoughts", "reasoning_recap")
_HIDDEN_TYPES: Final = ("user_editable_context", "model_editable_context")


def looks_like(item: object) -> bool:
    return isinstance(item, dict) and isinstance(item.get("mapping"), dict)


def _seconds_to_ms(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return round(value * 1000)


def _part_text(part: object) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, dict):
        text = part.get("text")
        if isinstance(text, str):
            return text
        kind = part.get("content_type")
        if isinstance(kind, str) and kind.isidentifier():
            return f"[{kind}]"  # an image or a file: its bytes are not in conversations.json
        return "[attachment]"
    return ""


def content_text(content: object) -> str | Skip:
    """The text of a message's `content`, or why it is not part of the conversation."""
    if not isinstance(content, dict):
        return Skip("", "content: must be an object")
    kind = content.get("content_type")
    if kind in _REASONING:
        return Skip("", "the model's hidden reasoning (not part of the conversation)")
    if kind in _HIDDEN_TYPES:
        return Skip("", "custom instructions or memory context (hidden from the conversation)")
    parts = content.get("parts")
    if isinstance(parts, list):
        return "\n".join(t for t in (_part_text(p) for p in parts) if t)
    text = content.get("text")
    if isinstance(text, str):
        title = content.get("title")
        if kind == "tether_quote" and isinstance(title, str) and title:
            return f"{title}\n\n{text}"
        return text
    result = content.get("result")
    if isinstance(result, str):  # tether_browsing_display
        return result
    return Skip("", "content.content_type: not a supported content type")


def _branch(mapping: dict[str, Any], current: str) -> list[str] | None:
    """Node ids from the root to `current`, or None when the parent links loop or break."""
    out: list[str] = []
    seen: set[str] = set()
    node_id: object = current
    while node_id is not None:
        if not isinstance(node_id, str) or node_id in seen or node_id not in mapping:
            return None
        seen.add(node_id)
        out.append(node_id)
        node = mapping[node_id]
        node_id = node.get("parent") if isinstance(node, dict) else None
    out.reverse()
    return out


class ChatGPTSource(ConversationsSource):
    """Items of one `conversations.json`; progress counts conversations."""

    name = SOURCE

    def _conversation(self, ci: int, conv: object) -> Iterator[Message | Skip]:
        pos = f"conversation {ci}"
        if not looks_like(conv):
            yield Skip(pos, "not a ChatGPT conversation (no mapping)")
            return
        assert isinstance(conv, dict)
        conv_id = conv.get("conversation_id") or conv.get("id")
        if not isinstance(conv_id, str) or not conv_id:
            yield Skip(pos, "conversation_id: missing")
            return
        mapping: dict[str, Any] = conv["mapping"]
        current = conv.get("current_node")
        branch = _branch(mapping, current) if isinstance(current, str) else None
        if branch is None:
            yield Skip(pos, "current_node: missing, or its parent links are broken")
            return
        on_branch = set(branch)
        for node_id, node in mapping.items():
            if node_id not in on_branch and isinstance(node, dict) and node.get("message"):
                yield Skip(pos, "not on the conversation's current branch (regenerated or edited)")
        session_id = f"{SOURCE}:{conv_id}"
        title = conv.get("title")
        summary = fitting_summary(title if isinstance(title, str) else None)
        last_ms = _seconds_to_ms(conv.get("create_time")) or 0
        last_id_ms = -1
        for mi, node_id in enumerate(branch):
            node = mapping[node_id]
            msg = node.get("message") if isinstance(node, dict) else None
            if msg is None:
                continue  # the root (and other empty nodes): not a message
            mpos = f"{pos}, message {mi}"
            if not isinstance(msg, dict):
                yield Skip(mpos, "message: must be an object")
                continue
            meta = msg.get("metadata")
            if isinstance(meta, dict) and meta.get("is_visually_hidden_from_conversation"):
                yield Skip(mpos, "hidden from the conversation (system or context message)")
                continue
            author = msg.get("author")
            role = author.get("role") if isinstance(author, dict) else None
            if role not in _ROLES:
                yield Skip(mpos, "author.role: must be user, assistant, system or tool")
                continue
            text = content_text(msg.get("content"))
            if isinstance(text, Skip):
                yield Skip(mpos, text.reason)
                continue
            ms = _seconds_to_ms(msg.get("create_time"))
            ms = last_ms if ms is None else ms
            last_ms = ms
            id_ms = max(ms, last_id_ms + 1)
            tags: tuple[str, ...] = (SOURCE_TAG,)
            if role == "tool":
                name = author.get("name") if isinstance(author, dict) else None
                tool = f"tool:{name}" if isinstance(name, str) and name else "tool:unknown"
                tags = valid_tags(SOURCE_TAG, "tool-output", tool)
            elif role == "assistant" and msg.get("recipient") not in (None, "all"):
                tags = valid_tags(SOURCE_TAG, "tool-call")
            key = msg.get("id") if isinstance(msg.get("id"), str) else node_id
            built = build_message(
                mpos,
                message_id=make_id(id_ms, identity_bits(SOURCE, conv_id, str(key))),
                session_id=session_id,
                role=_ROLES[role],
                content=text,
                timestamp=ms,
                updated_at=_seconds_to_ms(msg.get("update_time")),
                tags=tags,
                summary=summary,
            )
            if isinstance(built, Message):
                summary = None  # the title goes on the first stored message only
                last_id_ms = id_ms
            yield built
