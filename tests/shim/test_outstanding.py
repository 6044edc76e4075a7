"""The shim's record of unanswered requests (what it waits for after the host closes stdin),
fed the way the pump feeds it: arbitrary chunks of each direction's byte stream."""

from __future__ import annotations

import json

from convmem_app.shim.launcher import _Outstanding


def line(message: object, **dumps: object) -> bytes:
    return json.dumps(message, **dumps).encode() + b"\n"  # type: ignore[arg-type]


def sdk_request(request_id: object, content: str = "x") -> bytes:
    """As the SDK clients write it: jsonrpc, id, method, params; compact."""
    params = {"name": "write_message", "arguments": {"content": content}}
    message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    return line(message, separators=(",", ":"))


def answer(request_id: object) -> bytes:
    return line({"jsonrpc": "2.0", "id": request_id, "result": {}}, separators=(",", ":"))


def chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def pending(outstanding: _Outstanding) -> set[str]:
    return {key.decode() for key in outstanding._ids}


def test_requests_in_every_shape_and_chunking_are_tracked_until_answered() -> None:
    host = (
        sdk_request(1)
        + sdk_request('a"quoted" id', content="é" * 5000)
        + line({"method": "tools/call", "params": {}, "id": 3, "jsonrpc": "2.0"})  # id last
        + line([{"jsonrpc": "2.0", "id": 4, "method": "ping"}])  # a batch
        + line({"jsonrpc": "2.0", "method": "notifications/initialized"})  # no id: no answer
        + answer(99)  # the host answering a request of the server's: nothing to wait for
        + b"not json\n"
    )
    for size in (1, 7, 64, len(host)):  # byte by byte, mid-line cuts, all in one chunk
        outstanding = _Outstanding()
        for piece in chunks(host, size):
            outstanding.host_sent(piece)
        assert pending(outstanding) == {"1", '"a\\"quoted\\" id"', "3", "4"}
        app = (
            answer(1)
            + line({"jsonrpc": "2.0", "id": 'a"quoted" id', "error": {"code": 1}})
            + line({"result": {}, "id": 3, "jsonrpc": "2.0"})
            + line({"jsonrpc": "2.0", "id": 7, "method": "sampling/createMessage"})  # asks
        )
        for piece in chunks(app, size):
            outstanding.app_sent(piece)
        assert pending(outstanding) == {"4"}
        outstanding.app_sent(answer(4))
        assert pending(outstanding) == set()


def test_one_id_written_two_ways_is_one_id() -> None:
    """The app answers with its own spelling of an id (pydantic's): an escaped string, a
    non-ASCII one, `-0`, an id in a line of another shape; each answer settles its request."""
    host = (
        b'{"jsonrpc":"2.0","id":"\\u00e9t\\u00e9","method":"ping"}\n'  # escaped
        + sdk_request("日本")  # raw UTF-8
        + b'{"jsonrpc":"2.0","id":-0,"method":"ping"}\n'
        + line({"id": "x y", "method": "ping", "jsonrpc": "2.0"}, ensure_ascii=True)
        + b'{"jsonrpc":"2.0","id":007,"method":"ping"}\n'  # not JSON: nothing to answer
    )
    for size in (1, 5, len(host)):
        outstanding = _Outstanding()
        for piece in chunks(host, size):
            outstanding.host_sent(piece)
        assert pending(outstanding) == {'"été"', '"日本"', "0", '"x y"'}
        app = (
            line({"jsonrpc": "2.0", "id": "été", "result": {}}, ensure_ascii=False)
            + answer("日本")  # written with escapes by json.dumps
            + answer(0)
            + b'{"jsonrpc":"2.0","id":"x y","result":{}}\n'
        )
        for piece in chunks(app, size):
            outstanding.app_sent(piece)
        assert pending(outstanding) == set()
