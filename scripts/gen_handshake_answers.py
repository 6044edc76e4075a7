#!/usr/bin/env python3
"""Write convmem_engine/runtime/handshake_answers.py: the SDK server's own early answers.

    python scripts/gen_handshake_answers.py           # rewrite the module
    python scripts/gen_handshake_answers.py --check   # exit 1 if it is out of date

`convmem serve`'s stdio front (convmem_engine/runtime/front.py) answers the first `initialize`
or `server/discover` with these bytes before the SDK is even imported, and then `tools/list`,
`ping` and the memory tools' `tools/call` results until the SDK takes over. They are taken from
the live server that `convmem serve` builds (a real Runtime with the agent part, on an empty
data dir, the agent disabled), exactly as the line transport writes them with the SDK serving
every request (`CONVMEM_MCP_FAST_PATH=0`): the handshakes one fresh session per request; per
protocol version one session for `tools/list`, `ping` and two `tools/call` results (one
success, one application error) whose text is cut out, leaving the bytes around it. Rerun
after changing the server's name, title, instructions, capabilities, tools or the SDK version;
tests/mcp/test_mcp_serve_front.py runs the check and compares the front with the live SDK.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

ROOT = Path(__file__).resolve().parent.parent
MODULE = ROOT / "convmem_engine" / "runtime" / "handshake_answers.py"
sys.path.insert(0, str(ROOT))

PREFIX = b'{"jsonrpc":"2.0","id":1'


def sdk_sessions(
    sessions: Sequence[Sequence[bytes]],
    texts: Sequence[tuple[str, dict[str, Any]]] = (),
) -> tuple[list[list[bytes]], list[tuple[str, bool]]]:
    """For each session (its lines, then the input ends): every line the live server writes,
    the SDK serving every request. With `texts`: also what the server's registry answers to each
    (tool name, arguments) on the same (empty) store, as (text, is_error)."""
    from convmem_engine.runtime.serve_cli import agent_runtime
    from convmem_engine.tools import ToolRegistry

    previous = os.environ.get("CONVMEM_MCP_FAST_PATH")
    os.environ["CONVMEM_MCP_FAST_PATH"] = "0"
    outs: list[list[bytes]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="convmem-handshake-") as folder:
            runtime, _agent = agent_runtime(Path(folder))
            runtime.open()
            try:
                registry = ToolRegistry.for_service(runtime.service)
                results = [registry.result(name, args) for name, args in texts]
                for lines in sessions:
                    chunks = [b"".join(x if x.endswith(b"\n") else x + b"\n" for x in lines), b""]
                    out: list[bytes] = []

                    async def read(chunks: list[bytes] = chunks) -> bytes:
                        return chunks.pop(0) if chunks else b""

                    async def send(data: bytes, out: list[bytes] = out) -> None:
                        out.append(data)

                    serving = runtime.serve_session("generator", read, send)
                    runtime.loop.submit(serving).result(60)
                    outs.append(out)
            finally:
                runtime.stop(0)
    finally:
        if previous is None:
            del os.environ["CONVMEM_MCP_FAST_PATH"]
        else:
            os.environ["CONVMEM_MCP_FAST_PATH"] = previous
    return outs, [(r.text, r.is_error) for r in results]


def sdk_first_answers(lines: Sequence[bytes]) -> list[bytes | None]:
    """For each line: the first line the live server writes when `line` opens a session (and
    the input then ends), or None when it writes nothing."""
    outs, _ = sdk_sessions([[line] for line in lines])
    return [out[0] if out else None for out in outs]


def initialize_line(version: str) -> bytes:
    return (
        b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"'
        + version.encode()
        + b'","capabilities":{},"clientInfo":{"name":"gen","version":"1"}}}'
    )


def discover_line(version: str) -> bytes:
    return (
        b'{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{'
        b'"io.modelcontextprotocol/protocolVersion":"' + version.encode() + b'",'
        b'"io.modelcontextprotocol/clientInfo":{"name":"gen","version":"1"},'
        b'"io.modelcontextprotocol/clientCapabilities":{}}}}'
    )


def _piece(data: bytes) -> str:
    """A bytes literal quoted as ruff format writes it (double quotes unless that escapes)."""
    text = repr(data)
    if b'"' not in data and b"'" not in data:
        text = 'b"' + text[2:-1] + '"'
    return text


def _literal(data: bytes, indent: str) -> str:
    pieces = [_piece(data[i : i + 64]) for i in range(0, len(data), 64)]
    if len(pieces) == 1:
        return pieces[0]
    return "(\n" + "".join(f"{indent}    {piece}\n" for piece in pieces) + f"{indent})"


def render() -> str:
    from importlib.metadata import version as dist_version

    import mcp_types
    from mcp_types.version import (
        HANDSHAKE_PROTOCOL_VERSIONS,
        LATEST_HANDSHAKE_VERSION,
        MODERN_PROTOCOL_VERSIONS,
    )

    handshake = list(HANDSHAKE_PROTOCOL_VERSIONS)
    modern = list(MODERN_PROTOCOL_VERSIONS)
    lines = [initialize_line(v) for v in handshake] + [discover_line(v) for v in modern]
    answers = sdk_first_answers(lines)
    tails: list[bytes] = []
    for line, answer in zip(lines, answers, strict=True):
        if answer is None or not answer.startswith(PREFIX + b',"result":'):
            raise SystemExit(f"the server did not answer {line!r} with a result: {answer!r}")
        tails.append(answer[len(PREFIX) :])
    keys = (
        mcp_types.PROTOCOL_VERSION_META_KEY,
        mcp_types.CLIENT_INFO_META_KEY,
        mcp_types.CLIENT_CAPABILITIES_META_KEY,
    )
    out = [
        '"""The SDK server\'s early answers (handshake, tools/list, ping, tool results), byte',
        "for byte.",
        "",
        "Generated by scripts/gen_handshake_answers.py from the live server of `convmem serve`",
        f"(mcp {dist_version('mcp')}); do not edit. convmem_engine/runtime/front.py sends",
        '`{"jsonrpc":"2.0","id":` + the request\'s id + one of these.',
        "tests/mcp/test_mcp_serve_front.py fails when they differ from what the SDK answers now.",
        '"""',
        "",
        "from typing import Final",
        "",
        f"LATEST_HANDSHAKE_VERSION: Final = {json.dumps(LATEST_HANDSHAKE_VERSION)}",
        '"""What the server counter-offers to an `initialize` with a version it does not speak."""',
        "ENVELOPE_KEYS: Final = (",
        *(f"    {json.dumps(key)}," for key in keys),
        ")",
        '"""The 2026-07-28 `_meta` keys: protocol version, client info, client capabilities."""',
        "",
        "INITIALIZE: Final[dict[str, bytes]] = {",
    ]
    for version, tail in zip(handshake, tails[: len(handshake)], strict=True):
        out.append(f"    {json.dumps(version)}: {_literal(tail, '    ')},")
    out.append("}")
    out.append('"""`initialize` by requested protocolVersion."""')
    out.append("")
    out.append("DISCOVER: Final[dict[str, bytes]] = {")
    for version, tail in zip(modern, tails[len(handshake) :], strict=True):
        out.append(f"    {json.dumps(version)}: {_literal(tail, '    ')},")
    out.append("}")
    out.append('"""`server/discover` by the envelope\'s protocol version."""')
    out.extend(_session_answers(handshake, modern))
    return "\n".join(out) + "\n"


CALL_TEXTS: Final = (
    ("read_messages", {"view": "sessions"}),
    ("read_messages", {"view": "nonsense"}),
)
"""Two calls whose answers frame every tool result: a success and an application error."""


def _rpc(request_id: int, method: str, params: dict[str, Any] | None) -> bytes:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        body["params"] = params
    return json.dumps(body, separators=(",", ":")).encode()


def session_lines(version: str, modern: bool) -> list[bytes]:
    """One session at `version`: tools/list (id 1), ping (id 2), then the `CALL_TEXTS` calls
    (ids 3 and 4); after the handshake for a handshake-era version, each with the envelope
    for a modern one."""
    import mcp_types

    meta = {
        mcp_types.PROTOCOL_VERSION_META_KEY: version,
        mcp_types.CLIENT_INFO_META_KEY: {"name": "gen", "version": "1"},
        mcp_types.CLIENT_CAPABILITIES_META_KEY: {},
    }
    lines: list[bytes] = []
    if not modern:
        lines.append(initialize_line(version).replace(b'"id":1', b'"id":0', 1))
        lines.append(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    envelope = {"_meta": meta} if modern else None
    lines.append(_rpc(1, "tools/list", envelope))
    lines.append(_rpc(2, "ping", envelope))
    for number, (name, arguments) in enumerate(CALL_TEXTS, start=3):
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if modern:
            params["_meta"] = meta
        lines.append(_rpc(number, "tools/call", params))
    return lines


def _by_id(out: list[bytes]) -> dict[object, bytes]:
    return {json.loads(line).get("id"): line for line in out}


def _session_answers(handshake: list[str], modern: list[str]) -> list[str]:
    """The module's tools/list, ping and tool-result sections."""
    import pydantic_core

    versions = [(v, False) for v in handshake] + [(v, True) for v in modern]
    outs, texts = sdk_sessions([session_lines(v, m) for v, m in versions], CALL_TEXTS)
    tools: dict[str, bytes] = {}
    pings: dict[str, bytes] = {}
    frames: dict[tuple[str, bool], tuple[bytes, bytes]] = {}
    for (version, _modern), out in zip(versions, outs, strict=True):
        answers = _by_id(out)
        for number in (1, 2):  # tools/list: a result; ping: whatever the SDK answers
            head = b'{"jsonrpc":"2.0","id":' + str(number).encode()
            answer = answers.get(number, b"")
            ok = (b',"result":', b',"error":') if number == 2 else (b',"result":',)
            if not answer.startswith(head) or not answer[len(head) :].startswith(ok):
                raise SystemExit(f"{version}: no answer to request {number}: {answer!r}")
            (tools if number == 1 else pings)[version] = answer[len(head) :]
        for number, (text, is_error) in enumerate(texts, start=3):
            answer = answers.get(number, b"")
            encoded = pydantic_core.to_json(text)
            head = b'{"jsonrpc":"2.0","id":' + str(number).encode()
            if not answer.startswith(head) or answer.count(encoded) != 1:
                raise SystemExit(f"{version}: the tool result does not frame its text: {answer!r}")
            before, after = answer[len(head) :].split(encoded)
            if not (before + after).isascii() or b'"isError":' not in before + after:
                raise SystemExit(f"{version}: unexpected tool result frame: {answer!r}")
            frames[(version, is_error)] = (before, after)
    out = ["", "# ---- after the handshake (the memory tools; the agent disabled) ----", ""]
    names: dict[bytes, str] = {}
    for body in tools.values():
        if body not in names:
            names[body] = f"_TOOLS_LIST_{len(names)}"
            out.append(f"{names[body]}: Final = {_literal(body, '')}")
    out.append("")
    out.append("TOOLS_LIST: Final[dict[str, bytes]] = {")
    out.extend(f"    {json.dumps(v)}: {names[body]}," for v, body in tools.items())
    out.append("}")
    out.append('"""`tools/list` by protocol version (negotiated, or the request\'s envelope)."""')
    out.append("")
    out.append("PING: Final[dict[str, bytes]] = {")
    out.extend(f"    {json.dumps(v)}: {_literal(body, '    ')}," for v, body in pings.items())
    out.append("}")
    out.append('"""`ping` by protocol version (2026-07-28 has none: the SDK\'s error)."""')
    out.append("")
    out.append("TOOL_RESULT: Final[dict[tuple[str, bool], tuple[bytes, bytes]]] = {")
    for (version, is_error), (before, after) in frames.items():
        out.append(f"    ({json.dumps(version)}, {is_error}): (")
        out.append(f"        {_literal(before, '        ')},")
        out.append(f"        {_literal(after, '        ')},")
        out.append("    ),")
    out.append("}")
    out.append(
        '"""A `tools/call` answer by (protocol version, isError): the bytes after the id up '
        "to the\nresult's text (JSON-encoded as pydantic_core encodes it), and the bytes after "
        'it."""'
    )
    return out


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if MODULE.read_text(encoding="utf-8") != text:
            print(
                f"{MODULE.relative_to(ROOT)} is out of date: run python "
                "scripts/gen_handshake_answers.py",
                file=sys.stderr,
            )
            return 1
        return 0
    MODULE.write_text(text, encoding="utf-8")
    print(f"wrote {MODULE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
