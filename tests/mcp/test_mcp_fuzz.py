"""Fuzzing a real `convmem serve` over stdio (issue 15): tool calls generated from the tools'
own input schemas (as the server lists them), and hostile JSON-RPC lines.

- Every tool call is answered with a well-formed tool result: OK, or an error envelope with
  VALIDATION_ERROR, NOT_FOUND or CONFLICT; never INTERNAL_ERROR, never a JSON-RPC error, never
  a crash or a hang, never an error message that echoes what was sent.
- Every line that is not a valid notification or response gets exactly one answer, with the
  request's id when it has a usable one, and the session goes on.
- The store stays consistent: every acknowledged write reads back through the server, and after
  the server exits the store opens, checks clean and holds exactly what was acknowledged.

A fast subset runs by default; `-m slow` runs the large counts and records them for
docs/reliability.md (tests/reliability_log.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from raw_serve import Hung, RawServe
from reliability_log import Tally
from schema_strategies import MARKER, invalid_arguments, json_values, valid_arguments

from convmem_engine.service import MemoryService
from convmem_engine.storage import Store

FAST_CALLS = 120
SLOW_CALLS = 3000
FAST_LINES = 120
SLOW_LINES = 3000

ALLOWED_ERRORS = {"VALIDATION_ERROR", "NOT_FOUND", "CONFLICT"}
SESSIONS = ("fuzz-a", "fuzz-b")


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
        ],
    )


class Model:
    """What the server acknowledged: message id -> (session, content)."""

    def __init__(self) -> None:
        self.messages: dict[str, tuple[str, str]] = {}

    def apply(self, name: str, arguments: dict[str, Any], data: dict[str, Any]) -> None:
        if data.get("status", "OK") != "OK":
            return
        if name in ("write_message", "update_message"):
            message = data["message"]
            self.messages[message["message_id"]] = (message["session_id"], message["content"])
        elif name == "delete_message":
            self.messages.pop(arguments["message_id"], None)


def _aim(data: st.DataObject, arguments: dict[str, Any], model: Model) -> None:
    """Point generated ids and sessions at stored ones half of the time. The draws are the
    same whatever the model holds (Hypothesis replays them against a changed store)."""
    aim_id, pick = data.draw(st.booleans()), data.draw(st.integers(0, 2**16))
    aim_session, session = data.draw(st.booleans()), data.draw(st.sampled_from(SESSIONS))
    if "message_id" in arguments and model.messages and aim_id:
        stored = sorted(model.messages)
        arguments["message_id"] = stored[pick % len(stored)]
    if "session_id" in arguments and aim_session:
        arguments["session_id"] = session


def _read_back(server: RawServe, model: Model, tally: Tally) -> None:
    """Every acknowledged message, through the server: there, whole, unchanged."""
    for mid, (_session, content) in sorted(model.messages.items()):
        if _content(server, mid) is None:
            tally.lost += 1
        elif _content(server, mid) != content:
            tally.changed += 1


def _content(server: RawServe, mid: str) -> str | None:
    arguments = {"view": "content", "message_id": mid, "content_limit": 65536}
    is_error, data = server.call("read_messages", arguments)
    if is_error:
        return None
    assert data["content_range"]["complete"] is True
    return str(data["content_range"]["content"])


def _store_matches(data_dir: Path, model: Model, tally: Tally) -> None:
    """After the server exited: the store checks clean and holds exactly what was acknowledged."""
    with Store.open(data_dir) as store:
        if store.check():
            tally.crashed += 1
        stored = {mid: (m.session_id, m.content) for mid, m in store.messages.items()}
    tally.lost += len(model.messages.keys() - stored.keys())
    tally.changed += len(stored.keys() - model.messages.keys())
    for mid in model.messages.keys() & stored.keys():
        tally.changed += stored[mid] != model.messages[mid]


def fuzz_tool_calls(tmp_path: Path, examples: int) -> Tally:
    data_dir = tmp_path / "data"
    server = RawServe(data_dir, tmp_path / "serve.log")
    listed = server.request("tools/list")["result"]["tools"]
    schemas = {tool["name"]: tool["inputSchema"] for tool in listed}
    assert len(schemas) == 7
    model = Model()
    tally = Tally("hostile tool arguments (generated from the tools' schemas)")
    with tally:

        @_settings(examples)
        @given(data=st.data())
        def one_call(data: st.DataObject) -> None:
            name = data.draw(st.sampled_from(sorted(schemas)), label="tool")
            schema = schemas[name]
            valid = data.draw(st.booleans(), label="valid")
            if valid:
                arguments = data.draw(valid_arguments(schema), label="arguments")
                _aim(data, arguments, model)
            else:
                arguments = data.draw(invalid_arguments(schema), label="arguments")
            tally.cases += 1
            try:
                is_error, payload = server.call(name, arguments)
            except Hung:
                tally.hung += 1
                raise
            except AssertionError:
                tally.crashed += 1
                raise
            if is_error:
                error = payload["error"]
                if error["code"] not in ALLOWED_ERRORS:
                    tally.crashed += 1
                assert error["code"] in ALLOWED_ERRORS, (name, error)
                assert MARKER not in error["message"], (name, error)
                assert payload == {"status": "ERROR", "error": error}
                assert valid or error["code"] == "VALIDATION_ERROR", (name, arguments, error)
            else:
                assert valid, (name, arguments, payload)  # a broken schema rule is refused
                assert payload.get("status", "OK") in ("OK", "NOT_FOUND"), payload
                model.apply(name, arguments, payload)

        # a few stored messages first, so updates, reads and deletes find something
        for n in range(6):
            arguments = {"session_id": SESSIONS[n % 2], "role": "user", "content": f"seed {n}"}
            _, payload = server.call("write_message", arguments)
            model.apply("write_message", arguments, payload)
        one_call()
        _read_back(server, model, tally)
        status = server.close()
        tally.crashed += status != 0
        _store_matches(data_dir, model, tally)
    return tally


def test_generated_tool_calls_get_well_formed_answers_and_keep_the_store(tmp_path: Path) -> None:
    tally = fuzz_tool_calls(tmp_path, FAST_CALLS)
    assert (tally.lost, tally.crashed, tally.hung, tally.changed) == (0, 0, 0, 0)


@pytest.mark.slow
def test_generated_tool_calls_many(tmp_path: Path) -> None:
    tally = fuzz_tool_calls(tmp_path, SLOW_CALLS)
    assert (tally.lost, tally.crashed, tally.hung, tally.changed) == (0, 0, 0, 0)


# -- hostile lines -----------------------------------------------------------------------------

_SURROGATE_TEXT = st.text(
    alphabet=st.one_of(st.characters(), st.characters(categories=["Cs"])), max_size=12
)


def _odd_ids() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.floats(allow_nan=False, allow_infinity=False),
        st.booleans(),
        st.none(),
        st.integers(min_value=-(2**100), max_value=2**100),
        _SURROGATE_TEXT,
        st.lists(st.integers(), max_size=2),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    )


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()  # ASCII: lone surrogates become \\udXXX escapes


@st.composite
def _request_lines(draw: st.DrawFn) -> tuple[bytes, Any]:
    """(line, the id it carries): a request-shaped object with an odd id or odd parts."""
    body: dict[str, Any] = {"jsonrpc": draw(st.sampled_from(["2.0", "2.0", "1.0", 2]))}
    body["method"] = draw(
        st.one_of(
            st.sampled_from(["ping", "tools/list", "tools/call", "initialize", "resources/list"]),
            _SURROGATE_TEXT.map(lambda s: MARKER + s),
            st.integers(),
        )
    )
    if draw(st.booleans()):
        params = draw(
            st.one_of(
                json_values(6),
                st.fixed_dictionaries(
                    {
                        "name": st.sampled_from(["read_messages", "search_messages", MARKER]),
                        "arguments": st.dictionaries(
                            # names may be named back (they are fields); values never
                            st.sampled_from(["query", "session_id", "view", "no_such_arg"]),
                            st.one_of(_SURROGATE_TEXT.map(lambda s: MARKER + s), json_values(3)),
                            max_size=3,
                        ),
                    }
                ),
            )
        )
        body["params"] = params
    request_id = draw(_odd_ids())
    raw_id = _dumps(request_id)
    if draw(st.integers(0, 9)) == 0:  # a number JSON allows and a double cannot hold
        raw_id, request_id = b"1e400", float("inf")
    line = _dumps(body)[:-1] + (b', "id": ' if len(body) else b'"id": ') + raw_id + b"}"
    return line, request_id


def _nested_line(depth: int, request_id: int) -> bytes:
    inner = b"[" * depth + b"]" * depth
    return b'{"jsonrpc":"2.0","id":%d,"method":"ping","params":{"x":%s}}' % (request_id, inner)


_OTHER_LINES = st.one_of(  # one line each: a raw newline would make two
    json_values(10).map(_dumps),  # any JSON at all: scalars, arrays (batches), objects
    st.binary(max_size=60).map(lambda b: b.replace(b"\n", b" ")),
    _SURROGATE_TEXT.map(lambda s: b'{"jsonrpc":"2.0","id":' + s.encode("utf-8", "surrogatepass")),
    st.dictionaries(
        st.sampled_from(["jsonrpc", "method", "params", "result", "error"]),
        json_values(3),
        max_size=4,
    ).map(_dumps),
)


def _echo(request_id: Any) -> Any:
    """The id a JSON-RPC answer must carry for a request with `request_id`."""
    if isinstance(request_id, bool) or request_id is None:
        return None
    if isinstance(request_id, float):
        return request_id if request_id not in (float("inf"), float("-inf")) else None
    if isinstance(request_id, int | str):
        return request_id
    return None


def _check_answer(answer: dict[str, Any], tally: Tally) -> None:
    if answer.get("jsonrpc") != "2.0" or ("result" in answer) == ("error" in answer):
        tally.crashed += 1
        raise AssertionError(f"malformed answer {answer!r:.300}")
    shown = json.dumps(answer.get("error", {}))
    result = answer.get("result")
    if isinstance(result, dict) and result.get("isError"):
        shown += json.dumps(result)
    assert MARKER not in shown, answer


def fuzz_lines(tmp_path: Path, examples: int, *, huge: int = 0) -> Tally:
    data_dir = tmp_path / "data"
    server = RawServe(data_dir, tmp_path / "serve.log")
    kept = {"session_id": "kept", "role": "user", "content": "kept across hostile lines"}
    _, written = server.call("write_message", kept)
    kept_id = written["message"]["message_id"]
    tally = Tally("hostile JSON-RPC lines (odd ids, surrogates, nesting, junk, oversized)")
    with tally:

        def served(line: bytes, request_id: Any, *, is_request: bool) -> None:
            tally.cases += 1
            server.send(line + b"\n")
            others: list[dict[str, Any]] = []
            try:
                if is_request and _echo(request_id) is not None:
                    # served by the server (it may answer out of order): wait for that id
                    answer = server.answer_to(_echo(request_id), others)
                    ping = server.request("ping")
                    assert ping["result"] == {}
                    answers = [answer]
                else:
                    ping_id = "after-" + str(tally.cases)
                    server.send(_dumps({"jsonrpc": "2.0", "id": ping_id, "method": "ping"}) + b"\n")
                    server.answer_to(ping_id, others)
                    answers, others = others, []
            except Hung:
                tally.hung += 1
                raise
            assert others == [], others
            for answer in answers:
                _check_answer(answer, tally)
            if is_request:
                if len(answers) != 1:
                    tally.hung += 1
                assert len(answers) == 1, (line[:200], answers)
                assert answers[0]["id"] == _echo(request_id), (line[:200], answers)
            else:
                assert len(answers) <= 1, (line[:200], answers)
                stripped = line.strip()
                if stripped.startswith(b"\xef\xbb\xbf"):
                    stripped = stripped[3:].strip()
                if stripped:
                    try:
                        json.loads(stripped.decode("utf-8"))
                    except ValueError:  # not UTF-8 or not JSON: a parse error, id null
                        assert [a["error"]["code"] for a in answers] == [-32700], answers
                        assert answers[0]["id"] is None

        @_settings(examples)
        @given(data=st.data())
        def one_line(data: st.DataObject) -> None:
            kind = data.draw(st.sampled_from(["request", "nested", "other"]), label="kind")
            if kind == "request":
                line, request_id = data.draw(_request_lines(), label="line")
                served(line, request_id, is_request=True)
            elif kind == "nested":
                depth = data.draw(st.integers(1, 6000), label="depth")
                request_id = data.draw(st.integers(0, 2**40), label="id")
                served(_nested_line(depth, request_id), request_id, is_request=True)
            else:
                line = data.draw(_OTHER_LINES, label="line").replace(b"\n", b" ")
                served(line, None, is_request=False)

        one_line()
        for n in range(huge):  # over the line limit: skipped unread, answered with its id
            big = b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"x":"' % n
            served(big + b"\\ud800" * (2_400_000 + n) + b'"}}', n, is_request=True)
        if _content(server, kept_id) != kept["content"]:
            tally.lost += 1
        status = server.close()
        tally.crashed += status != 0
        with MemoryService.open(data_dir) as svc:
            tally.crashed += bool(svc.check())
            history = svc.read_messages(session_id="kept")["history"]
            tally.lost += [m["content"] for m in history] != [kept["content"]]
    return tally


def test_hostile_lines_each_get_their_answer_and_the_session_goes_on(tmp_path: Path) -> None:
    tally = fuzz_lines(tmp_path, FAST_LINES, huge=1)
    assert (tally.lost, tally.crashed, tally.hung, tally.changed) == (0, 0, 0, 0)


@pytest.mark.slow
def test_hostile_lines_many(tmp_path: Path) -> None:
    tally = fuzz_lines(tmp_path, SLOW_LINES, huge=4)
    assert (tally.lost, tally.crashed, tally.hung, tally.changed) == (0, 0, 0, 0)
