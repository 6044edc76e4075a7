"""What `convmem serve`'s stdio front (`front.py`) makes of one line: whether it is a request
the front answers, and the answer's bytes.

Pure functions and constants over bytes: no threads, no file descriptors, no state, and the
standard library only (the front runs before the SDK is imported). `StdioFront` reads the lines
and writes the answers; this module only judges and plans:

- `handshake_for`: a session's first line, when it is a handshake whose SDK answer is known
  byte for byte: `initialize` (the handshake eras, 2025-11-25 and older) or `server/discover`
  (2026-07-28). The bytes come from `handshake_answers` (generated from the real server by
  `scripts/gen_handshake_answers.py`; tests/mcp/test_mcp_serve_front.py proves them identical
  to what the live SDK answers, for every protocol version and every request shape accepted
  here).
- `plan_for`: each line after that handshake, as a `Plan`: keep it for the SDK, answer it
  (`ping`), write the `tools/list` answer, run a memory tool, honour a cancellation, or leave
  it and everything after it to the SDK.
- `call_answer` and `call_failure`: a memory tool's answer line, shaped byte for byte as the
  SDK shapes it (the bytes around the result's text come from the generated answers; the text
  is encoded as the SDK's serialiser encodes it).
- `line_request_id`: the id of a kept request, for the error `StdioFront.fail` answers it with.

Only plainly valid requests are planned for the front (parsed by the standard library: for
these lines it gives what the SDK's parser gives): the envelope
`{"jsonrpc", "id", "method", "params"}` exactly, an id the SDK writes back the same way, params
of the known shapes (on 2026-07-28 the envelope's protocol version, client info and
capabilities in the shapes the handshake check accepts), a memory tool's name and an arguments
object (the tool itself checks the arguments, as under the SDK). Anything the front is not sure
about (another method, params it does not know, an unusual id, an escape sequence in a first
line, an agent tool, a cursor, a progress token, a batch, a line the SDK's parser refuses...)
is left to the SDK.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final

from convmem_engine.runtime import handshake_answers as answers

INTERNAL_ERROR: Final = -32603
LOG_LEVEL_KEY: Final = "io.modelcontextprotocol/logLevel"

_BOM: Final = b"\xef\xbb\xbf"
_PLAIN_STRING_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
_SURROGATE = re.compile("[\ud800-\udfff]")
_MAX_INT_ID: Final = 2**53


def _request_id(value: object) -> str | int | None:
    """The id of a request as the line transport reads it (a string or an integer)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str | int):
        return value
    return None


def line_request_id(line: bytes) -> str | int | None:
    """The id of the request on a kept `line` (as the line transport reads it), for the error
    the front answers it with when the runtime will not come; None for a notification or a
    line that is not a request."""
    line = line.strip()
    if line.startswith(_BOM):
        line = line[len(_BOM) :]
    try:
        value = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or "method" not in value:
        return None
    return _request_id(value.get("id"))


# ---- the first line: a handshake the front answers -------------------------------------------


def _plain_id(value: object) -> bytes | None:
    """The id as the SDK writes it back, for ids whose spelling cannot differ; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and -_MAX_INT_ID < value < _MAX_INT_ID:
        return str(value).encode("ascii")
    if isinstance(value, str) and _PLAIN_STRING_ID.fullmatch(value):
        return b'"' + value.encode("ascii") + b'"'
    return None


def _is_str_map(value: object, required: frozenset[str], optional: frozenset[str]) -> bool:
    return (
        isinstance(value, dict)
        and required <= value.keys() <= required | optional
        and all(isinstance(v, str) for v in value.values())
    )


_IMPLEMENTATION_REQUIRED: Final = frozenset({"name", "version"})
_IMPLEMENTATION_OPTIONAL: Final = frozenset({"title", "description", "websiteUrl"})


def _empty_object(value: object) -> bool:
    return isinstance(value, dict) and not value


def _object_tree(value: object) -> bool:
    """An object whose values are objects of the same kind, down to empty ones."""
    return isinstance(value, dict) and all(_object_tree(item) for item in value.values())


def _empty_objects(value: object) -> bool:
    """An object whose values are all empty objects (`{}`, `{"a": {}}`)."""
    return isinstance(value, dict) and all(map(_empty_object, value.values()))


def _known_capabilities(value: object, *, modern: bool) -> bool:
    """Client capabilities in the shapes hosts send, each of which the SDK accepts and answers
    as it answers none (the tests check every one against the live SDK):

    - roots: `{}` or `{"listChanged": <bool>}`;
    - sampling and elicitation: `{}` or their empty sub-capabilities;
    - tasks (2025-11-25): objects down to empty ones (`{"list": {}, "requests": {...}}`);
    - experimental: any object per name;
    - extensions: empty settings per extension (the MCP Inspector sends its tasks and skills
      extensions in both eras).

    Anything else (a flag that is not a boolean, a setting the SDK may check or answer by) is
    left to the SDK."""
    if not isinstance(value, dict):
        return False
    for key, item in value.items():
        if not isinstance(item, dict):
            return False
        if key == "roots":
            if not item.keys() <= {"listChanged"} or not all(
                isinstance(flag, bool) for flag in item.values()
            ):
                return False
        elif key == "sampling":
            if not item.keys() <= {"context", "tools"} or not _empty_objects(item):
                return False
        elif key == "elicitation":
            if not item.keys() <= {"form", "url"} or not _empty_objects(item):
                return False
        elif key == "tasks":
            if modern or not _object_tree(item):
                return False
        elif key == "experimental":
            if not all(isinstance(settings, dict) for settings in item.values()):
                return False
        elif key == "extensions":
            if not all(isinstance(name, str) for name in item) or not _empty_objects(item):
                return False
        else:
            return False
    return True


def _initialize_answer(params: object) -> tuple[bytes, str] | None:
    if not isinstance(params, dict) or params.keys() != {
        "protocolVersion",
        "capabilities",
        "clientInfo",
    }:
        return None
    version = params["protocolVersion"]
    if not isinstance(version, str) or not _is_str_map(
        params["clientInfo"], _IMPLEMENTATION_REQUIRED, _IMPLEMENTATION_OPTIONAL
    ):
        return None
    if not _known_capabilities(params["capabilities"], modern=False):
        return None
    if version not in answers.INITIALIZE:  # the server counter-offers its latest
        version = answers.LATEST_HANDSHAKE_VERSION
    return answers.INITIALIZE[version], version


LOG_LEVELS: Final = frozenset(
    {"debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"}
)
"""The values of the 2026-07-28 `logLevel` request key (RFC 5424's names, as in the schema)."""


def _envelope_version(meta: object, *, request: bool = False) -> str | None:
    """The protocol version of a 2026-07-28 `_meta` envelope in a shape the SDK is known to
    accept (the version, the client capabilities, optionally the client info, and on a
    request after the handshake the log level the client asks of this request, which the
    memory tools never log at); else None."""
    version_key, info_key, capabilities_key = answers.ENVELOPE_KEYS
    if not isinstance(meta, dict) or not {version_key, capabilities_key} <= meta.keys():
        return None
    extra = meta.keys() - {version_key, info_key, capabilities_key}
    level = meta.get(LOG_LEVEL_KEY)
    if extra and (
        not request
        or extra != {LOG_LEVEL_KEY}
        or not isinstance(level, str)
        or level not in LOG_LEVELS
    ):
        return None
    version = meta[version_key]
    if not isinstance(version, str) or version not in answers.DISCOVER:
        return None
    if info_key in meta and not _is_str_map(
        meta[info_key], _IMPLEMENTATION_REQUIRED, _IMPLEMENTATION_OPTIONAL
    ):
        return None
    if not _known_capabilities(meta[capabilities_key], modern=True):
        return None
    return version


def _discover_answer(params: object) -> tuple[bytes, str] | None:
    if not isinstance(params, dict) or params.keys() != {"_meta"}:
        return None
    version = _envelope_version(params["_meta"])
    if version is None:
        return None
    return answers.DISCOVER[version], version


@dataclass(frozen=True, slots=True)
class Handshake:
    """A first request the front answers: the id as written back, the answer line, the era
    ("legacy" after `initialize`, "modern" after `server/discover`) and the protocol version
    (the negotiated one; for "modern" the discover request's)."""

    request_id: bytes
    answer: bytes
    era: str
    version: str


def handshake_for(line: bytes) -> Handshake | None:
    """The handshake on `line`, as the first request of a session, when the front knows the
    SDK's answer byte for byte; else None."""
    line = line.strip()
    if line.startswith(_BOM) or not line.startswith(b"{") or b"\\" in line:
        return None  # escapes may be read differently by the SDK's parser: leave them to it
    try:
        value = json.loads(line.decode("utf-8"), parse_constant=_refuse_constant)
    except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
        return None
    if not isinstance(value, dict) or value.keys() != {"jsonrpc", "id", "method", "params"}:
        return None
    if not _plain_value(value):  # (experimental capabilities may hold any JSON)
        return None
    if value["jsonrpc"] != "2.0":
        return None
    request_id = _plain_id(value["id"])
    if request_id is None:
        return None
    method = value["method"]
    if method == "initialize":
        found = _initialize_answer(value["params"])
        era = "legacy"
    elif method == "server/discover":
        found = _discover_answer(value["params"])
        era = "modern"
    else:
        return None
    if found is None:
        return None
    tail, version = found
    return Handshake(request_id, b'{"jsonrpc":"2.0","id":' + request_id + tail, era, version)


def answer_for(line: bytes) -> tuple[bytes, bytes] | None:
    """(the id as written back, the complete answer line) when `line`, as the first request of
    a session, is a handshake whose SDK answer the front knows byte for byte; else None."""
    found = handshake_for(line)
    return None if found is None else (found.request_id, found.answer)


# ---- the lines after the handshake -----------------------------------------------------------


def _id_key(value: str | int) -> str | int:
    """The id as the SDK correlates it ("7" and 7 are one id: `coerce_request_id`)."""
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    return value


@dataclass(frozen=True, slots=True)
class Plan:
    """What the front does with one line after the handshake.

    kind: "keep" (pass it on to the SDK, go on), "sdk" (pass it and everything after it on),
    "answer" (write `answer`), "list" (write the `tools/list` answer of `version`), "call"
    (run the memory tool `name` with `arguments`), "cancel" (a cancellation of `key`)."""

    kind: str
    request_id: bytes = b""
    key: str | int = 0
    answer: bytes = b""
    version: str = ""
    name: str = ""
    arguments: dict[str, Any] | None = None
    raw_id: str | int = 0


KEEP: Final = Plan("keep")
TO_SDK: Final = Plan("sdk")


def _notification_plan(body: dict[str, Any]) -> Plan:
    if not body.keys() <= {"jsonrpc", "method", "params"} or body.get("jsonrpc") != "2.0":
        return TO_SDK
    if body.get("method") != "notifications/cancelled":
        return KEEP  # (initialized, ...): the SDK sees it as if the front had not been there
    params = body.get("params")
    if not isinstance(params, dict) or not params.keys() <= {"requestId", "reason"}:
        return TO_SDK
    target = params.get("requestId")
    if isinstance(target, bool) or not isinstance(target, str | int):
        return TO_SDK
    if "reason" in params and not isinstance(params["reason"], str):
        return TO_SDK
    return Plan("cancel", key=_id_key(target))


_MAX_DEPTH: Final = 64


def _plain_value(value: object, depth: int = 0) -> bool:
    """Every string valid Unicode (no lone surrogate) and nesting at most `_MAX_DEPTH` deep:
    then the standard library's parser gives exactly what the SDK's (pydantic_core's) gives
    (they differ only there, and on NaN/Infinity, which `_loads` refuses)."""
    if isinstance(value, str):
        return not _SURROGATE.search(value)
    if depth >= _MAX_DEPTH:
        return False
    if isinstance(value, dict):
        return all(_plain_value(k, depth) and _plain_value(v, depth + 1) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain_value(item, depth + 1) for item in value)
    return True


def _refuse_constant(name: str) -> object:
    raise ValueError(name)  # NaN, Infinity: Python's extensions, refused by the SDK's parser


def plan_for(line: bytes, era: str, version: str) -> Plan:
    """What the front does with `line` (a complete line, read after the handshake it answered
    with `era` and `version`)."""
    stripped = line.strip()
    if not stripped:
        return KEEP
    if stripped.startswith(_BOM):
        return TO_SDK
    try:
        body = json.loads(stripped.decode("utf-8"), parse_constant=_refuse_constant)
    except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
        return TO_SDK  # the SDK's own rare paths answer it
    if not _plain_value(body):
        return TO_SDK
    if not isinstance(body, dict):
        return TO_SDK
    if "id" not in body:
        return _notification_plan(body)
    if body.keys() not in ({"jsonrpc", "id", "method", "params"}, {"jsonrpc", "id", "method"}):
        return TO_SDK
    raw_id = body["id"]
    request_id = _plain_id(raw_id)
    if body["jsonrpc"] != "2.0" or request_id is None:
        return TO_SDK
    has_params = "params" in body
    params = body.get("params")
    if has_params and type(params) is not dict:
        return TO_SDK
    rest: dict[str, Any] = dict(params or {})
    if era == "modern":
        version = _envelope_version(rest.pop("_meta", None), request=True) or ""
        if not version:
            return TO_SDK
    elif "_meta" in rest:
        return TO_SDK  # a progress token, or the 2026 envelope the SDK refuses here
    method = body["method"]
    if method == "ping" and not rest:
        return Plan("answer", request_id, answer=answers.PING[version])
    if method == "tools/list" and not rest:
        return Plan("list", request_id, version=version)
    if method != "tools/call" or not has_params:
        return TO_SDK
    name = rest.pop("name", None)
    arguments = rest.pop("arguments", {})
    if rest or type(name) is not str or type(arguments) is not dict:
        return TO_SDK
    key = _id_key(raw_id)
    return Plan(
        "call", request_id, key, version=version, name=name, arguments=arguments, raw_id=raw_id
    )


def _json_text(text: str) -> bytes:
    """`text` as a JSON string, as the SDK's serialiser (pydantic_core) writes it: the same
    bytes as the standard library's with ensure_ascii off, for every string that is valid
    Unicode (tests/mcp/test_mcp_serve_front.py checks every code point); a string with a lone
    surrogate is escaped, as the line transport's fallback writes it."""
    encoded = json.dumps(text, ensure_ascii=False)
    try:
        return encoded.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(text).encode()


def call_answer(plan: Plan, text: str, is_error: bool) -> bytes:
    """The SDK's answer line to the `tools/call` of `plan` whose result is (text, is_error)."""
    before, after = answers.TOOL_RESULT[(plan.version, is_error)]
    return b'{"jsonrpc":"2.0","id":' + plan.request_id + before + _json_text(text) + after


def call_failure(plan: Plan, exc: Exception) -> bytes:
    """What the SDK answers when the tool's handler raises something `result` did not map."""
    if plan.version in answers.DISCOVER:
        error: dict[str, Any] = {"code": INTERNAL_ERROR, "message": "Internal server error"}
    else:
        error = {"code": 0, "message": str(exc)}
    body = {"jsonrpc": "2.0", "id": plan.raw_id, "error": error}
    encoded = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    try:
        return encoded.encode("utf-8") + b"\n"
    except UnicodeEncodeError:
        return json.dumps(body, separators=(",", ":")).encode() + b"\n"
