"""Set or remove `[mcp_servers.convmem]` in Codex's config.toml, keeping everything else.

Line-based and checked: the convmem tables (`[mcp_servers.convmem]` and its sub-tables) are cut
out and a fresh table is appended; then both versions are parsed with `tomllib` and must be
equal except for the convmem entry. A file where convmem is written another way (an inline
table, dotted keys) fails that check and is refused rather than guessed at. Standard library
only (no formatting-preserving TOML writer is needed for one table at the end).
"""

from __future__ import annotations

import json
import re
import tomllib
from typing import Any, Final

_HEADER: Final = re.compile(r"^\s*\[\[?\s*([^\]]*?)\s*\]\]?\s*(#.*)?$")
_CONVMEM_KEYS: Final = ("mcp_servers.convmem", 'mcp_servers."convmem"', "mcp_servers.'convmem'")


class TomlEditError(ValueError):
    pass


def parse(text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TomlEditError(f"not valid TOML: {e}") from None


def _is_convmem_header(inner: str, name: str) -> bool:
    key = re.sub(r"\s*\.\s*", ".", inner)
    heads = [k.replace("convmem", name) for k in _CONVMEM_KEYS]
    return any(key == h or key.startswith(h + ".") for h in heads)


def cut_tables(text: str, name: str) -> str:
    """`text` without the tables of server `name` (header through the line before the next
    header)."""
    out: list[str] = []
    skipping = False
    for line in text.splitlines(keepends=True):
        m = _HEADER.match(line)
        if m is not None:
            skipping = _is_convmem_header(m.group(1), name)
        if not skipping:
            out.append(line)
    return "".join(out)


def table_text(name: str, entry: dict[str, Any], newline: str) -> str:
    lines = [f"[mcp_servers.{name}]"]
    for key, value in entry.items():
        lines.append(f"{key} = {json.dumps(value, ensure_ascii=False)}")
    return newline.join(lines) + newline


def _without(doc: dict[str, Any], name: str) -> dict[str, Any]:
    servers = doc.get("mcp_servers")
    if not isinstance(servers, dict) or name not in servers:
        return doc
    copy = dict(doc)
    rest = {k: v for k, v in servers.items() if k != name}
    if rest:
        copy["mcp_servers"] = rest
    else:
        del copy["mcp_servers"]
    return copy


def _same_rest(old: dict[str, Any], new: dict[str, Any], name: str) -> bool:
    a, b = _without(old, name), _without(new, name)
    # an emptied [mcp_servers] table may remain as {}: same meaning
    if b.get("mcp_servers") == {} and "mcp_servers" not in a:
        b = {k: v for k, v in b.items() if k != "mcp_servers"}
    if a.get("mcp_servers") == {} and "mcp_servers" not in b:
        a = {k: v for k, v in a.items() if k != "mcp_servers"}
    return a == b


def set_server(text: str, name: str, entry: dict[str, Any], newline: str) -> str:
    old = parse(text)
    body = cut_tables(text, name)
    # one blank line between the rest and our table, however often it is re-added
    body = body.rstrip("\r\n") + newline + newline if body.strip() else ""
    new_text = body + table_text(name, entry, newline)
    try:
        new = tomllib.loads(new_text)
    except tomllib.TOMLDecodeError:
        raise TomlEditError(
            "the mcp_servers table is written in a form this version cannot edit "
            "(e.g. an inline table); add the entry by hand"
        ) from None
    if new.get("mcp_servers", {}).get(name) != entry or not _same_rest(old, new, name):
        raise TomlEditError(
            f"the {name} entry is written in a form this version cannot edit "
            "(e.g. an inline table or dotted keys); edit it by hand"
        )
    return new_text


def remove_server(text: str, name: str) -> str:
    old = parse(text)
    new_text = cut_tables(text, name)
    if new_text.strip() and text.endswith("\n"):  # no blank lines left where the table was
        newline = "\r\n" if text.endswith("\r\n") else "\n"
        new_text = new_text.rstrip("\r\n") + newline
    new = parse(new_text)
    if name in (new.get("mcp_servers") or {}) or not _same_rest(old, new, name):
        raise TomlEditError(
            f"the {name} entry is written in a form this version cannot edit "
            "(e.g. an inline table or dotted keys); remove it by hand"
        )
    return new_text
