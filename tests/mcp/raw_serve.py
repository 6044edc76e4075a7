"""A real `convmem serve` subprocess driven by raw JSON-RPC lines, synchronously.

For tests that send what no SDK client would (odd ids, surrogates, broken lines) and for
fuzzing, where one server answers thousands of generated calls: a reader thread parses every
stdout line (stdout must hold nothing but JSON-RPC lines) and files answers by id.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from mcp_helpers import child_env, serve_args

ANSWER_TIMEOUT = 60.0
"""Seconds one answer may take before the request counts as hung (generous: shared CI)."""


class Hung(AssertionError):
    """A request got no answer in time."""


class RawServe:
    def __init__(self, data_dir: Path, stderr: Path) -> None:
        self._stderr = stderr.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, *serve_args(data_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=child_env(),
        )
        self.lines: queue.Queue[dict[str, Any] | bytes | None] = queue.Queue()
        self.not_json: list[bytes] = []
        self._ids = itertools.count(1_000_000)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        answer = self.request(
            "initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "raw-serve", "version": "1"},
            },
        )
        assert answer["result"]["serverInfo"]["name"] == "convmem", answer
        self.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                value = json.loads(line)
            except ValueError:
                self.lines.put(line)
                continue
            self.lines.put(value if isinstance(value, dict) else line)
        self.lines.put(None)

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except OSError as exc:  # the server is gone: say how it ended
            try:
                status = self.proc.wait(10)
            except subprocess.TimeoutExpired:
                status = None
            raise AssertionError(f"cannot write to the server ({exc!r}; exit {status})") from exc

    def next_answer(self, timeout: float = ANSWER_TIMEOUT) -> dict[str, Any]:
        """The next line the server writes, parsed (a line that is not JSON fails)."""
        try:
            item = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise Hung(f"no answer within {timeout} s") from None
        if item is None:
            self.lines.put(None)
            raise AssertionError(f"the server ended its output (exit {self.proc.poll()})")
        if isinstance(item, bytes):
            raise AssertionError(f"not a JSON-RPC object on stdout: {item[:200]!r}")
        return item

    def answer_to(self, request_id: object, others: list[dict[str, Any]] | None = None) -> Any:
        """Wait for the answer with `request_id`; lines before it go to `others` (or fail)."""
        while True:
            answer = self.next_answer()
            if answer.get("id") == request_id and type(answer.get("id")) is type(request_id):
                return answer
            if others is None:
                raise AssertionError(f"unexpected answer {answer!r:.300}")
            others.append(answer)

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        request_id = next(self._ids)
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            body["params"] = params
        self.send(json.dumps(body).encode() + b"\n")
        answer: dict[str, Any] = self.answer_to(request_id)
        return answer

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """(isError, the tool result's JSON object); a JSON-RPC error fails."""
        answer = self.request("tools/call", {"name": name, "arguments": arguments})
        assert "result" in answer, f"{name}: JSON-RPC error {answer.get('error')!r:.300}"
        result = answer["result"]
        assert [block["type"] for block in result["content"]] == ["text"], result
        data: dict[str, Any] = json.loads(result["content"][0]["text"])
        return bool(result.get("isError")), data

    def kill(self) -> list[dict[str, Any]]:
        """SIGKILL the server; every answer it wrote before dying (read to end of output)."""
        self.proc.kill()
        self.proc.wait(60)
        self._reader.join(60)
        answers: list[dict[str, Any]] = []
        while (item := self.lines.get_nowait()) is not None:
            if isinstance(item, dict):
                answers.append(item)  # a line cut by the kill is no answer
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self._stderr.close()
        return answers

    def close(self, timeout: float = 60) -> int:
        """End of input: the server answers what it read and exits; its exit status."""
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):  # a dead server: the wait below tells
            self.proc.stdin.close()
        try:
            status = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._reader.join(30)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self._stderr.close()
        return status
