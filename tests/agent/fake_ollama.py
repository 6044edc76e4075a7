"""A fake Ollama server on 127.0.0.1 speaking Ollama's real HTTP API, scripted per test.

Endpoints: `GET /api/version`, `GET /api/tags`, `POST /api/show` (with `capabilities` and the
`model_info` the official client requires), `POST /api/chat` streaming (NDJSON chunks, the
last with `done`, `prompt_eval_count`, `eval_count`) and not streaming, tool calls in
`message.tool_calls`, error replies (`{"error": ...}` with a status), and a slow mode that
holds a reply between chunks until the test releases it (for cancellation).

This is the only stand-in the suite uses: everything on our side of the HTTP connection (the
official `ollama` client, the queue, the memory service) is real.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted chat reply."""

    content: str = ""
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    prompt_eval_count: int = 10
    eval_count: int = 5
    status: int = 200  # an error status answers {"error": error}
    error: str = ""
    hold: threading.Event | None = None  # slow mode: wait for this between chunks


Script = Callable[[dict[str, Any]], Reply]


class FakeOllama:
    def __init__(self) -> None:
        self.models: dict[str, list[str]] = {"memo:latest": ["completion", "tools"]}
        self.replies: list[Reply] = []
        self.script: Script | None = None
        self.chats: list[dict[str, Any]] = []
        self.shows: list[str] = []
        self.show_error: tuple[int, str] | None = None
        self.chat_started = threading.Event()
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _json(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict[str, Any]:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                return dict(json.loads(raw or b"{}"))

            def do_GET(self) -> None:
                if self.path == "/api/version":
                    self._json(200, {"version": "0.13.0"})
                elif self.path == "/api/tags":
                    self._json(
                        200,
                        {
                            "models": [
                                {
                                    "name": name,
                                    "model": name,
                                    "modified_at": "2026-11-01T10:00:00Z",
                                    "size": 1000,
                                    "digest": "0" * 64,
                                    "details": {"family": "fake", "format": "gguf"},
                                }
                                for name in sorted(fake.models)
                            ]
                        },
                    )
                else:
                    self._json(404, {"error": "not found"})

            def do_POST(self) -> None:
                body = self._body()
                if self.path == "/api/show":
                    name = str(body.get("model") or body.get("name"))
                    with fake._lock:
                        fake.shows.append(name)
                    if fake.show_error is not None:
                        self._json(fake.show_error[0], {"error": fake.show_error[1]})
                        return
                    caps = fake.models.get(name) or fake.models.get(f"{name}:latest")
                    if caps is None:
                        self._json(404, {"error": f"model '{name}' not found"})
                        return
                    self._json(
                        200,
                        {
                            "modelfile": "FROM fake",
                            "parameters": "",
                            "template": "{{ .Prompt }}",
                            "details": {"family": "fake", "format": "gguf"},
                            "model_info": {"general.architecture": "fake"},
                            "capabilities": caps,
                            "modified_at": "2026-11-01T10:00:00Z",
                        },
                    )
                elif self.path == "/api/chat":
                    self._chat(body)
                else:
                    self._json(404, {"error": "not found"})

            def _chat(self, body: dict[str, Any]) -> None:
                with fake._lock:
                    fake.chats.append(body)
                    if fake.script is not None:
                        reply = fake.script(body)
                    elif fake.replies:
                        reply = fake.replies.pop(0)
                    else:
                        reply = Reply(content="done")
                fake.chat_started.set()
                model = str(body.get("model"))
                if model not in fake.models and f"{model}:latest" not in fake.models:
                    self._json(404, {"error": f"model '{model}' not found, try pulling it first"})
                    return
                if reply.status != 200:
                    self._json(reply.status, {"error": reply.error or "failed"})
                    return
                message: dict[str, Any] = {"role": "assistant", "content": reply.content}
                calls = [
                    {"function": {"name": name, "arguments": args}}
                    for name, args in reply.tool_calls
                ]
                final = {
                    "model": model,
                    "created_at": "2026-11-30T12:00:00Z",
                    "done": True,
                    "done_reason": "stop",
                    "total_duration": 1000,
                    "prompt_eval_count": reply.prompt_eval_count,
                    "eval_count": reply.eval_count,
                }
                if body.get("stream") is False:
                    if calls:
                        message["tool_calls"] = calls
                    self._json(200, {**final, "message": message})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chunks: list[dict[str, Any]] = []
                text = reply.content
                pieces = [text[i : i + 8] for i in range(0, len(text), 8)] or [""]
                for piece in pieces:
                    chunks.append(
                        {
                            "model": model,
                            "created_at": "2026-11-30T12:00:00Z",
                            "message": {"role": "assistant", "content": piece},
                            "done": False,
                        }
                    )
                if calls:
                    chunks.append(
                        {
                            "model": model,
                            "created_at": "2026-11-30T12:00:00Z",
                            "message": {"role": "assistant", "content": "", "tool_calls": calls},
                            "done": False,
                        }
                    )
                chunks.append({**final, "message": {"role": "assistant", "content": ""}})
                try:
                    for index, chunk in enumerate(chunks):
                        self._chunk(json.dumps(chunk).encode() + b"\n")
                        if index == 0 and reply.hold is not None:
                            reply.hold.wait(30)
                    self._chunk(b"")
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.host = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> FakeOllama:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
