"""Edit one member of a JSON (or JSON with comments) file, keeping every other byte as it is.

Hosts keep their MCP servers in JSON files that people also edit by hand (VS Code's even allow
comments and trailing commas). Rewriting the whole file with `json.dumps` would lose the
user's formatting, comments and key order, so this module parses the text into spans
(where each value and member starts and ends) and splices only the bytes of the one member it
changes. Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


class JsoncError(ValueError):
    """The text does not parse; `line` and `column` (1-based) say where."""

    def __init__(self, why: str, text: str, pos: int) -> None:
        self.line = text.count("\n", 0, pos) + 1
        self.column = pos - (text.rfind("\n", 0, pos) + 1) + 1
        self.why = why
        super().__init__(f"{why} at line {self.line}, column {self.column}")


@dataclass
class Node:
    start: int
    end: int
    value: Any
    members: list[Member] = field(default_factory=list)  # objects only


@dataclass
class Member:
    key: str
    key_start: int
    value: Node
    comma_end: int | None = None  # just past the comma after the value, if there is one


class _Parser:
    def __init__(self, text: str, comments: bool) -> None:
        self.text = text
        self.comments = comments
        self.i = 0

    def fail(self, why: str, pos: int | None = None) -> JsoncError:
        return JsoncError(why, self.text, self.i if pos is None else pos)

    def skip(self) -> None:
        t, n = self.text, len(self.text)
        while self.i < n:
            c = t[self.i]
            if c in " \t\r\n":
                self.i += 1
            elif c == "/" and self.i + 1 < n and t[self.i + 1] in "/*":
                if not self.comments:
                    raise self.fail("a comment (not allowed in this JSON file)")
                if t[self.i + 1] == "/":
                    nl = t.find("\n", self.i)
                    self.i = n if nl < 0 else nl + 1
                else:
                    close = t.find("*/", self.i + 2)
                    if close < 0:
                        raise self.fail("an unterminated /* comment")
                    self.i = close + 2
            else:
                return

    def value(self, depth: int = 0) -> Node:
        if depth > 200:
            raise self.fail("nesting too deep")
        self.skip()
        if self.i >= len(self.text):
            raise self.fail("unexpected end of file")
        c = self.text[self.i]
        if c == "{":
            return self.obj(depth)
        if c == "[":
            return self.array(depth)
        if c == '"':
            start = self.i
            return Node(start, self.string_end(), self.string_value(start))
        start = self.i
        decoder = json.JSONDecoder()
        try:
            value, end = decoder.raw_decode(self.text, self.i)
        except json.JSONDecodeError:
            raise self.fail("a value was expected") from None
        if isinstance(value, dict | list | str):
            raise self.fail("a value was expected")
        self.i = end
        return Node(start, end, value)

    def string_end(self) -> int:
        t, i = self.text, self.i + 1
        while i < len(t):
            c = t[i]
            if c == "\\":
                i += 2
                continue
            if c == '"':
                self.i = i + 1
                return self.i
            if c == "\n":
                break
            i += 1
        raise self.fail("an unterminated string")

    def string_value(self, start: int) -> str:
        try:
            value = json.loads(self.text[start : self.i])
        except json.JSONDecodeError:
            raise self.fail("a bad string escape", start) from None
        assert isinstance(value, str)
        return value

    def obj(self, depth: int) -> Node:
        start = self.i
        self.i += 1
        node = Node(start, start, {})
        seen: set[str] = set()
        while True:
            self.skip()
            if self.i < len(self.text) and self.text[self.i] == "}":
                if node.members and node.members[-1].comma_end is not None and not self.comments:
                    raise self.fail("a trailing comma (not allowed in this JSON file)")
                self.i += 1
                node.end = self.i
                return node
            if node.members and node.members[-1].comma_end is None:
                raise self.fail("',' or '}' was expected")
            if self.i >= len(self.text) or self.text[self.i] != '"':
                raise self.fail("a member name in double quotes was expected")
            key_start = self.i
            self.string_end()
            key = self.string_value(key_start)
            if key in seen:
                raise self.fail("a duplicate member name", key_start)
            seen.add(key)
            self.skip()
            if self.i >= len(self.text) or self.text[self.i] != ":":
                raise self.fail("':' was expected")
            self.i += 1
            value = self.value(depth + 1)
            member = Member(key, key_start, value)
            node.members.append(member)
            node.value[key] = value.value
            self.skip()
            if self.i < len(self.text) and self.text[self.i] == ",":
                self.i += 1
                member.comma_end = self.i

    def array(self, depth: int) -> Node:
        start = self.i
        self.i += 1
        items: list[Any] = []
        comma = False
        while True:
            self.skip()
            if self.i < len(self.text) and self.text[self.i] == "]":
                if comma and not self.comments:
                    raise self.fail("a trailing comma (not allowed in this JSON file)")
                self.i += 1
                return Node(start, self.i, items)
            if items and not comma:
                raise self.fail("',' or ']' was expected")
            items.append(self.value(depth + 1).value)
            self.skip()
            comma = self.i < len(self.text) and self.text[self.i] == ","
            if comma:
                self.i += 1


def parse(text: str, *, comments: bool) -> Node:
    """The document's root node (values included). Raises JsoncError naming line and column."""
    p = _Parser(text, comments)
    root = p.value()
    p.skip()
    if p.i != len(text):
        raise p.fail("text after the end of the JSON document")
    return root


# -- splicing ------------------------------------------------------------------------------------


def _line_indent(text: str, pos: int) -> str:
    line_start = text.rfind("\n", 0, pos) + 1
    head = text[line_start:pos]
    return head if not head.strip() else ""


def indent_unit(text: str) -> str:
    """The file's indentation step: a tab, or the smallest run of leading spaces (default 2)."""
    widths = []
    for line in text.splitlines()[:200]:
        stripped = line.lstrip(" \t")
        if not stripped or stripped == line:
            continue
        lead = line[: len(line) - len(stripped)]
        if lead.startswith("\t"):
            return "\t"
        widths.append(len(lead))
    return " " * min(widths) if widths else "  "


def render(value: Any, indent: str, unit: str, newline: str) -> str:
    """`value` as JSON whose continuation lines start at `indent`."""
    text = json.dumps(value, indent=unit, ensure_ascii=False)
    return text.replace("\n", newline + indent)


def set_member(text: str, obj: Node, key: str, value: Any, newline: str) -> str:
    """`text` with `obj`'s member `key` set to `value` (replaced in place, or added last)."""
    unit = indent_unit(text)
    for m in obj.members:
        if m.key == key:
            indent = _line_indent(text, m.key_start)
            return (
                text[: m.value.start] + render(value, indent, unit, newline) + text[m.value.end :]
            )
    obj_indent = _line_indent(text, obj.start)
    if obj.members:
        indent = _line_indent(text, obj.members[-1].key_start) or obj_indent + unit
        last = obj.members[-1]
        member = f"{json.dumps(key)}: {render(value, indent, unit, newline)}"
        if last.comma_end is not None:  # a trailing comma already: keep the style
            return text[: last.comma_end] + newline + indent + member + "," + text[last.comma_end :]
        return text[: last.value.end] + "," + newline + indent + member + text[last.value.end :]
    indent = obj_indent + unit
    member = f"{json.dumps(key)}: {render(value, indent, unit, newline)}"
    inner = text[obj.start + 1 : obj.end - 1]
    if not inner.strip():
        inner = ""
    return (
        text[: obj.start + 1]
        + newline
        + indent
        + member
        + inner.rstrip(" \t\r\n")
        + newline
        + obj_indent
        + text[obj.end - 1 :]
    )


def remove_member(text: str, obj: Node, key: str) -> str:
    """`text` without `obj`'s member `key` (and the comma that separated it)."""
    index = next((i for i, m in enumerate(obj.members) if m.key == key), None)
    if index is None:
        return text
    m = obj.members[index]
    if index + 1 < len(obj.members):
        # not the last: remove from the start of its line to the start of the next member's line
        start = m.key_start - len(_line_indent(text, m.key_start))
        nxt = obj.members[index + 1].key_start
        end = nxt - len(_line_indent(text, nxt))
        return text[:start] + text[end:]
    if index > 0:
        prev = obj.members[index - 1]
        assert prev.comma_end is not None
        if m.comma_end is not None:  # trailing-comma style: the previous comma becomes trailing
            return text[: prev.comma_end] + text[m.comma_end :]
        return text[: prev.comma_end - 1] + text[m.value.end :]
    end = m.comma_end if m.comma_end is not None else m.value.end
    inner_before = text[obj.start + 1 : m.key_start]
    inner_after = text[end : obj.end - 1]
    if not inner_before.strip() and not inner_after.strip():
        return text[: obj.start + 1] + text[obj.end - 1 :]
    return text[: m.key_start] + text[end:]
