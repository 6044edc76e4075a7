"""The MCP reference memory server's `memory.json` (@modelcontextprotocol/server-memory).

A JSON Lines file of a knowledge graph, one object a line:
`{"type":"entity","name":...,"entityType":...,"observations":[...]}` and
`{"type":"relation","from":...,"to":...,"relationType":...}`.

Mapping into ConvMem (docs/transfer.md): everything goes to the session `mcp-memory`, role
`assistant` (the model wrote it), kind `semantic`, tier `long`, tag `import:memory-json`.
An entity is one message: first line `<name> (<entityType>)` (also its summary), then one line
per observation, tag `entity`. A relation is one message `<from> <relationType> <to>`, tag
`relation`, with `related_to` relations to the messages of both entities when they are in the
file. So a search finds every entity by name or type, every observation and every relation.

The graph has no times: the messages get the time of their first import. Their ids' random
bits come from the record itself (its type, name, type and observations, or its three
fields), so importing the same file again finds them and stores nothing twice; an entity whose
observations changed since is stored again as a new message next to the old one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Final

from convmem_engine.domain.message import Message, Relation
from convmem_engine.transfer.records import (
    Skip,
    build_message,
    fitting_summary,
    identity_bits,
    make_id,
    valid_tags,
)

SOURCE: Final = "memory-json"
SOURCE_TAG: Final = "import:memory-json"
SESSION: Final = "mcp-memory"


def looks_like(first: object) -> bool:
    return isinstance(first, dict) and first.get("type") in ("entity", "relation")


def _str(value: object) -> bool:
    return isinstance(value, str) and bool(value)


class MemoryGraphSource:
    """Items of one memory.json; progress counts lines. `known_bits`: random bits -> id of
    the messages already in the session (imported before); `now_ms`: the time of new ones."""

    name = SOURCE

    def __init__(self, lines: list[str], *, now_ms: int, known_bits: dict[int, str]) -> None:
        self._lines = lines
        self._now = now_ms
        self._known = known_bits
        self.total = len(lines)

    def items(self) -> Iterator[tuple[int, Message | Skip]]:
        entities: dict[str, str] = {}  # name -> message id (this file)
        relations: list[tuple[int, dict[str, Any]]] = []
        seen: dict[int, int] = {}  # identity bits -> line
        for n, line in enumerate(self._lines, 1):
            if not line.strip():
                continue
            pos = f"line {n}"
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):
                yield n, Skip(pos, "not valid JSON")
                continue
            kind = rec.get("type") if isinstance(rec, dict) else None
            if kind == "relation":
                relations.append((n, rec))
                continue
            if kind != "entity":
                yield n, Skip(pos, "type: must be entity or relation")
                continue
            name, etype, obs = rec.get("name"), rec.get("entityType"), rec.get("observations")
            if not _str(name) or not isinstance(etype, str):
                yield n, Skip(pos, "name, entityType: must be strings (name not empty)")
                continue
            if not isinstance(obs, list) or not all(isinstance(o, str) for o in obs):
                yield n, Skip(pos, "observations: must be an array of strings")
                continue
            bits = identity_bits(SOURCE, "entity", name, etype, *obs)
            mid = self._known.get(bits) or make_id(self._now, bits)
            entities.setdefault(name, mid)
            item = self._one(pos, n, bits, seen, mid, f"{name} ({etype})", obs, "entity", ())
            yield n, item
        for n, rec in relations:
            pos = f"line {n}"
            src, dst, rtype = rec.get("from"), rec.get("to"), rec.get("relationType")
            if not (isinstance(src, str) and isinstance(dst, str) and isinstance(rtype, str)):
                yield n, Skip(pos, "from, to, relationType: must be non-empty strings")
                continue
            if not (src and dst and rtype):
                yield n, Skip(pos, "from, to, relationType: must be non-empty strings")
                continue
            bits = identity_bits(SOURCE, "relation", src, rtype, dst)
            mid = self._known.get(bits) or make_id(self._now, bits)
            links = tuple(
                Relation("related_to", entities[e])
                for e in dict.fromkeys((src, dst))
                if e in entities
            )
            item = self._one(pos, n, bits, seen, mid, f"{src} {rtype} {dst}", [], "relation", links)
            yield n, item

    def _one(
        self,
        pos: str,
        line: int,
        bits: int,
        seen: dict[int, int],
        mid: str,
        head: str,
        body: list[str],
        tag: str,
        links: tuple[Relation, ...],
    ) -> Message | Skip:
        if bits in self._known:
            return Skip("", "already in the store")  # counted, not listed
        if bits in seen:
            return Skip(pos, f"duplicate of line {seen[bits]}")
        seen[bits] = line
        return build_message(
            pos,
            message_id=mid,
            session_id=SESSION,
            role="assistant",
            content="\n".join([head, *(f"- {o}" for o in body)]),
            timestamp=self._now,
            tags=valid_tags(SOURCE_TAG, tag),
            memory_tier="long",
            memory_kind="semantic",
            summary=fitting_summary(head),
            relations=links,
        )
