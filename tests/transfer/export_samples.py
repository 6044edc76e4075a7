"""Realistic export files built from the documented formats (also used by bench/bench_transfer.py).

ChatGPT `conversations.json`: a JSON array of conversations, each a `mapping` tree of nodes
`{id, message, parent, children}` under a message-less root, with `current_node`; messages with
`author.role`, `create_time` (float seconds or null), `content` (`content_type` + `parts`, or
`text`), `metadata` (`is_visually_hidden_from_conversation`), `recipient`, `status`, `weight`.
Claude `conversations.json`: `{uuid, name, created_at, updated_at, account, chat_messages}` with
messages `{uuid, text, content: [blocks], sender, created_at, updated_at, attachments, files}`.
memory.json: JSON Lines of `{"type":"entity",...}` and `{"type":"relation",...}`.
"""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime
from typing import Any

_WORD_TEXT = (
    "memory durable session export import branch answer question garden recipe travel python "
    "rust kernel budget meeting weekend mountain river coffee violin chapter"
)
WORDS = tuple(_WORD_TEXT.split())


def _text(rng: random.Random, n: int = 12) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def chatgpt_message(
    msg_id: str,
    role: str,
    content: dict[str, Any],
    t: float | None,
    *,
    hidden: bool = False,
    name: str | None = None,
    recipient: str = "all",
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"model_slug": "gpt-4o"} if role == "assistant" else {}
    if hidden:
        metadata["is_visually_hidden_from_conversation"] = True
    return {
        "id": msg_id,
        "author": {"role": role, "name": name, "metadata": {}},
        "create_time": t,
        "update_time": None,
        "content": content,
        "status": "finished_successfully",
        "end_turn": role == "assistant" or None,
        "weight": 0.0 if hidden else 1.0,
        "metadata": metadata,
        "recipient": recipient,
        "channel": None,
    }


def text_content(*parts: str) -> dict[str, Any]:
    return {"content_type": "text", "parts": list(parts)}


class ChatGPTBuilder:
    """Builds one conversation tree; `add` appends under a parent and returns the node id."""

    def __init__(self, rng: random.Random, title: str, t0: float) -> None:
        self.rng = rng
        self.conv_id = _uuid(rng)
        self.title = title
        self.t0 = t0
        self.root = _uuid(rng)
        self.mapping: dict[str, Any] = {
            self.root: {"id": self.root, "message": None, "parent": None, "children": []}
        }

    def add(self, parent: str, message: dict[str, Any]) -> str:
        node = message["id"]
        self.mapping[node] = {"id": node, "message": message, "parent": parent, "children": []}
        self.mapping[parent]["children"].append(node)
        return node

    def msg(
        self, parent: str, role: str, content: dict[str, Any], dt: float | None, **kw: Any
    ) -> str:
        t = None if dt is None else self.t0 + dt
        return self.add(parent, chatgpt_message(_uuid(self.rng), role, content, t, **kw))

    def done(self, current: str) -> dict[str, Any]:
        return {
            "title": self.title,
            "create_time": self.t0,
            "update_time": self.t0 + 3600,
            "mapping": self.mapping,
            "moderation_results": [],
            "current_node": current,
            "plugin_ids": None,
            "conversation_id": self.conv_id,
            "conversation_template_id": None,
            "gizmo_id": None,
            "is_archived": False,
            "safe_urls": [],
            "default_model_slug": "gpt-4o",
            "id": self.conv_id,
        }


def chatgpt_rich_conversation(
    rng: random.Random, t0: float = 1_714_000_000.25
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """One conversation with every documented feature. Returns it and the expected stored
    (role, content) sequence."""
    b = ChatGPTBuilder(rng, "Planning a trip to Lisbon", t0)
    sys_node = b.msg(b.root, "system", text_content(""), None, hidden=True)
    ctx = b.msg(
        sys_node,
        "user",
        {
            "content_type": "user_editable_context",
            "user_profile": "I like trains",
            "user_instructions": "",
        },
        None,
        hidden=True,
    )
    u1 = b.msg(ctx, "user", text_content("Plan three days in Lisbon for me."), 1.5)
    a_old = b.msg(u1, "assistant", text_content("An answer that was regenerated."), 3.0)
    del a_old
    a1 = b.msg(u1, "assistant", text_content("Day 1: Alfama. Day 2: Belém. Day 3: Sintra."), 4.0)
    u_edit = b.msg(a1, "user", text_content("A prompt the user edited away."), 10.0)
    del u_edit
    u2 = b.msg(a1, "user", text_content("What does a tram ticket cost?"), 11.0)
    think = b.msg(
        u2,
        "assistant",
        {"content_type": "thoughts", "thoughts": [{"summary": "s", "content": "c"}]},
        11.5,
    )
    call = b.msg(
        think,
        "assistant",
        {
            "content_type": "code",
            "language": "unknown",
            "text": "search('Lisbon tram 28 ticket price')",
        },
        12.0,
        recipient="browser",
    )
    tool = b.msg(
        call,
        "tool",
        {
            "content_type": "tether_browsing_display",
            "result": "Carris: a single tram 28 ticket costs 3.10 EUR on board.",
            "summary": None,
        },
        13.0,
        name="browser",
    )
    a2 = b.msg(
        tool, "assistant", text_content("About 3.10 EUR on board; a day pass is cheaper."), 14.0
    )
    img = b.msg(
        a2,
        "user",
        {
            "content_type": "multimodal_text",
            "parts": [
                {
                    "content_type": "image_asset_pointer",
                    "asset_pointer": "file-service://file-abc",
                    "width": 10,
                    "height": 10,
                },
                "Is this the right tram?",
            ],
        },
        20.0,
    )
    same_ms = b.msg(img, "assistant", text_content("Yes, that is tram 28."), 20.0)
    current = same_ms
    expected = [
        ("user", "Plan three days in Lisbon for me."),
        ("assistant", "Day 1: Alfama. Day 2: Belém. Day 3: Sintra."),
        ("user", "What does a tram ticket cost?"),
        ("assistant", "search('Lisbon tram 28 ticket price')"),
        ("system", "Carris: a single tram 28 ticket costs 3.10 EUR on board."),
        ("assistant", "About 3.10 EUR on board; a day pass is cheaper."),
        ("user", "[image_asset_pointer]\nIs this the right tram?"),
        ("assistant", "Yes, that is tram 28."),
    ]
    return b.done(current), expected


def chatgpt_export(conversations: int, messages_per: int, seed: int = 1) -> list[dict[str, Any]]:
    """A large export: every conversation has a hidden system root, a user/assistant chain
    and one regenerated answer off the branch."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for c in range(conversations):
        b = ChatGPTBuilder(rng, f"Conversation {c}: {_text(rng, 3)}", 1_600_000_000 + c * 7200.0)
        node = b.msg(b.root, "system", text_content(""), None, hidden=True)
        for i in range(messages_per):
            role = "user" if i % 2 == 0 else "assistant"
            if i == 1:
                b.msg(node, "assistant", text_content("regenerated " + _text(rng, 5)), i * 30.0)
            node = b.msg(node, role, text_content(_text(rng, rng.randint(5, 40))), i * 30.0 + 1)
        out.append(b.done(node))
    return out


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def claude_message(
    rng: random.Random, sender: str, text: str, t: float, **extra: Any
) -> dict[str, Any]:
    return {
        "uuid": _uuid(rng),
        "text": text,
        "content": [
            {
                "start_timestamp": _iso(t),
                "stop_timestamp": _iso(t + 1),
                "type": "text",
                "text": text,
                "citations": [],
            }
        ],
        "sender": sender,
        "created_at": _iso(t),
        "updated_at": _iso(t),
        "attachments": extra.get("attachments", []),
        "files": extra.get("files", []),
    }


def claude_conversation(
    rng: random.Random, name: str, texts: list[tuple[str, str]], t0: float
) -> dict[str, Any]:
    msgs = [claude_message(rng, s, txt, t0 + 60 * i) for i, (s, txt) in enumerate(texts)]
    return {
        "uuid": _uuid(rng),
        "name": name,
        "created_at": _iso(t0),
        "updated_at": _iso(t0 + 60 * len(texts)),
        "account": {"uuid": _uuid(rng)},
        "chat_messages": msgs,
    }


def claude_export(conversations: int, messages_per: int, seed: int = 2) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for c in range(conversations):
        texts = [
            ("human" if i % 2 == 0 else "assistant", _text(rng, rng.randint(5, 40)))
            for i in range(messages_per)
        ]
        out.append(claude_conversation(rng, f"Claude chat {c}", texts, 1_650_000_000 + c * 7200.0))
    return out


def memory_graph_lines() -> list[str]:
    """A memory.json as the reference server writes it (entities first, then relations)."""
    records: list[dict[str, Any]] = [
        {
            "type": "entity",
            "name": "Ada_Lovelace",
            "entityType": "person",
            "observations": ["Wrote the first program", "Prefers tea over coffee"],
        },
        {
            "type": "entity",
            "name": "Analytical Engine",
            "entityType": "machine",
            "observations": ["Designed by Charles Babbage"],
        },
        {
            "type": "entity",
            "name": "Zürich office",
            "entityType": "organization",
            "observations": [],
        },
        {
            "type": "relation",
            "from": "Ada_Lovelace",
            "to": "Analytical Engine",
            "relationType": "wrote_programs_for",
        },
        {
            "type": "relation",
            "from": "Ada_Lovelace",
            "to": "Zürich office",
            "relationType": "visits",
        },
    ]
    return [json.dumps(r, ensure_ascii=False) for r in records]


def write_json(path: Any, data: Any, *, crlf: bool = False, bom: bool = False) -> None:
    text = json.dumps(data, ensure_ascii=False, indent=2 if crlf else None)
    if crlf:
        text = text.replace("\n", "\r\n")
    raw = text.encode("utf-8")
    with open(path, "wb") as f:
        f.write((b"\xef\xbb\xbf" if bom else b"") + raw)
