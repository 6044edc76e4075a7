"""The Ollama side, through the official `ollama` Python client.

`OllamaSide` turns the client's errors into `OllamaProblem`s whose `reason` key says what to
do (start Ollama at HOST, `ollama pull MODEL`, ...), checks a model's capabilities with
`/api/show` before any chat, and streams chat replies so a cancellation can stop between
chunks (the model's reply is not applied to anything until it is whole).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: a server whose agent never runs never loads them
    import ollama


class OllamaProblem(Exception):
    """Ollama cannot do what the task needs; `key`/`values` build the localized reason."""

    def __init__(self, key: str, **values: object) -> None:
        super().__init__(key)
        self.key = key
        self.values = values


class Cancelled(Exception):
    """The task was cancelled; raised at a safe point."""


@dataclass(slots=True)
class ChatReply:
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0


class OllamaSide:
    def __init__(self, host: str, timeout_seconds: float) -> None:
        import httpx
        import ollama

        self.host = host
        self._client = ollama.Client(
            host=host, timeout=httpx.Timeout(timeout_seconds, connect=min(10.0, timeout_seconds))
        )

    def close(self) -> None:
        self._client._client.close()

    def _problem(self, exc: BaseException, model: str) -> OllamaProblem:
        import httpx
        import ollama

        if isinstance(exc, ConnectionError | httpx.ConnectError | httpx.ConnectTimeout):
            return OllamaProblem("reason.unreachable", host=self.host)
        if isinstance(exc, ollama.ResponseError):
            if exc.status_code == 404:
                return OllamaProblem("reason.model_missing", model=model, host=self.host)
            error = str(exc.error)[:300].replace("\n", " ")
            return OllamaProblem(
                "reason.ollama_error", host=self.host, status=exc.status_code, error=error
            )
        if isinstance(exc, httpx.HTTPError):
            return OllamaProblem("reason.unreachable", host=self.host)
        raise exc

    # -- metadata --------------------------------------------------------------------------

    def version(self) -> str:
        import httpx

        try:
            response = self._client._client.get("/api/version")
            response.raise_for_status()
            return str(response.json().get("version", ""))
        except (httpx.HTTPError, ValueError) as exc:
            if isinstance(exc, httpx.HTTPStatusError):
                raise OllamaProblem(
                    "reason.ollama_error",
                    host=self.host,
                    status=exc.response.status_code,
                    error="/api/version",
                ) from None
            raise OllamaProblem("reason.unreachable", host=self.host) from None

    def models(self) -> list[str]:
        try:
            listing = self._client.list()
        except Exception as exc:
            raise self._problem(exc, "") from None
        return sorted(m.model for m in listing.models if m.model)

    def capabilities(self, model: str) -> list[str]:
        try:
            shown = self._client.show(model)
        except Exception as exc:
            raise self._problem(exc, model) from None
        return list(shown.capabilities or [])

    # -- chat ------------------------------------------------------------------------------

    def chat(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        temperature: float | None,
        cancelled: threading.Event,
        on_chunk: Callable[[], None] | None = None,
    ) -> ChatReply:
        options = {"temperature": temperature} if temperature is not None else None
        try:
            stream: Iterator[ollama.ChatResponse] = self._client.chat(
                model=model,
                messages=list(messages),
                tools=list(tools) if tools else None,
                options=options,
                stream=True,
            )
        except Exception as exc:
            raise self._problem(exc, model) from None
        reply = ChatReply()
        parts: list[str] = []
        try:
            for chunk in stream:
                if cancelled.is_set():
                    raise Cancelled
                message = chunk.message
                if message.content:
                    parts.append(message.content)
                for call in message.tool_calls or ():
                    reply.tool_calls.append(
                        {"name": call.function.name, "arguments": dict(call.function.arguments)}
                    )
                if chunk.done:
                    reply.input_tokens += chunk.prompt_eval_count or 0
                    reply.output_tokens += chunk.eval_count or 0
                if on_chunk is not None:
                    on_chunk()
        except (Cancelled, OllamaProblem):
            raise
        except Exception as exc:
            raise self._problem(exc, model) from None
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        if cancelled.is_set():
            raise Cancelled
        reply.content = "".join(parts)
        return reply
