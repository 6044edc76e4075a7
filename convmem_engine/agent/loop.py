"""One agent task from `planning` to a terminal state: the plan/run loop on the Ollama model.

- Before the first chat call: `/api/show` the model. No `tools` capability, or images for a
  model without `vision`: the task fails with that reason and no chat call is made.
- `planning`: one chat call (no tools) asks for a numbered plan of at most
  `budgets.max_plan_steps` steps; each numbered or bulleted line is a step (no such line: the
  whole request is the one step).
- `running`: each step is its own exchange: the model is asked to carry out step i, with the
  request, the plan and the earlier steps' exchanges in its history, and the offered memory
  tools; every tool call it makes is run (in process) and its result sent back, until it
  answers without tool calls. That answer ends the step (`completed_tasks` k/n counts ended
  steps). The last step's answer is the task's result.
- Tokens: `prompt_eval_count` (input) and `eval_count` (output) summed over every chat call.
  `critical_path_tokens` counts the tokens of the steps that had to wait for an earlier step's
  outcome, i.e. of steps 2..n (a one-step plan gives 0).
- Budgets: more than `budgets.max_steps` tool calls, or more than `budgets.max_tokens` tokens,
  fail the task. Cancellation is honoured at safe points only: between streamed chunks of a
  reply (nothing of the reply has been applied), before each tool call, between steps; a tool
  call that has started always finishes, so no change is ever half made.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any, Final

from convmem_engine.agent.config import AgentConfig
from convmem_engine.agent.memory_tools import MemoryTools
from convmem_engine.agent.ollama_side import Cancelled, OllamaProblem, OllamaSide
from convmem_engine.agent.store import Task

PLAN_PROMPT: Final = """\
You are ConvMem's memory agent. ConvMem is a local, durable memory of conversations; you work on \
it with memory tools (write_message, update_message, read_messages, search_messages, \
get_system_health{extra}). Do not carry out the request yet: write a short plan for it as a \
numbered list of at most {max_steps} steps, one line per step, and nothing else."""

RUN_PROMPT: Final = """\
You are ConvMem's memory agent. ConvMem is a local, durable memory of conversations. Carry out \
the user's request step by step with the memory tools you are given. Call tools to read, search \
and change memory; never invent message ids. When the current step is done, answer in plain \
text with what you did (and, on the last step, the final answer for the user)."""

_STEP_LINE: Final = re.compile(r"^\s*(?:\d+\s*[.):]|[-*•])\s*(.+?)\s*$")


class BudgetExceeded(Exception):
    def __init__(self, key: str, **values: object) -> None:
        super().__init__(key)
        self.key = key
        self.values = values


def parse_plan(text: str, max_steps: int, request: str) -> list[str]:
    steps = []
    for line in text.splitlines():
        match = _STEP_LINE.match(line)
        if match and match.group(1).strip():
            steps.append(match.group(1).strip()[:500])
    if not steps:
        steps = [request.strip().splitlines()[0][:500]]
    return steps[:max_steps]


class TaskRun:
    """Runs one task; `update` publishes progress (the queue persists and notifies)."""

    def __init__(
        self,
        task: Task,
        *,
        config: AgentConfig,
        ollama: OllamaSide,
        tools: MemoryTools,
        history: list[dict[str, Any]],
        images: list[dict[str, str]],
        cancelled: threading.Event,
        update: Callable[[Callable[[Task], None]], None],
    ) -> None:
        self.task = task
        self.config = config
        self.ollama = ollama
        self.tools = tools
        self.history = history
        self.images = images
        self.cancelled = cancelled
        self.update = update

    def _check(self) -> None:
        if self.cancelled.is_set():
            raise Cancelled

    def _chat(self, messages: list[dict[str, Any]], *, tools: bool, critical: bool) -> Any:
        self._check()

        def chatting(task: Task) -> None:
            task.current_task = "ollama chat"

        self.update(chatting)
        reply = self.ollama.chat(
            model=self.config.ollama_model,
            messages=messages,
            tools=self.tools.ollama_tools() if tools else None,
            temperature=self._temperature(),
            cancelled=self.cancelled,
        )

        def count(task: Task) -> None:
            task.input_tokens += reply.input_tokens
            task.output_tokens += reply.output_tokens
            if critical:
                task.critical_path_tokens += reply.input_tokens + reply.output_tokens

        self.update(count)
        used = self.task.input_tokens + self.task.output_tokens
        if used > self.config.max_tokens:
            raise BudgetExceeded("reason.token_budget", used=used, limit=self.config.max_tokens)
        return reply

    def _temperature(self) -> float | None:
        if self.task.temperature is not None:
            return self.task.temperature
        return self.config.ollama_temperature

    def _request_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "user", "content": self.task.request}
        if self.images:
            message["images"] = [image["data_base64"] for image in self.images]
        return message

    def check_model(self) -> None:
        """`/api/show` before any chat: tool support, and vision when there are images."""
        model = self.config.ollama_model
        capabilities = self.ollama.capabilities(model)
        if "tools" not in capabilities:
            raise OllamaProblem("reason.no_tools", model=model)
        if self.images and "vision" not in capabilities:
            raise OllamaProblem("reason.no_vision", model=model)

    def plan(self) -> list[str]:
        extra = "".join(
            f", {name}" for name in ("delete_message", "rebuild_index") if name in self.tools.names
        )
        system = PLAN_PROMPT.format(extra=extra, max_steps=self.config.max_plan_steps)
        messages = [{"role": "system", "content": system}, *self.history, self._request_message()]
        reply = self._chat(messages, tools=False, critical=False)
        return parse_plan(reply.content, self.config.max_plan_steps, self.task.request)

    def run_steps(self, plan: list[str]) -> str:
        plan_text = "\n".join(f"{i}. {step}" for i, step in enumerate(plan, start=1))
        conversation: list[dict[str, Any]] = [
            {"role": "system", "content": RUN_PROMPT},
            *self.history,
            self._request_message(),
            {"role": "assistant", "content": "Plan:\n" + plan_text},
        ]
        answer = ""
        for index, step in enumerate(plan):
            self._check()
            number = index + 1

            conversation.append(
                {
                    "role": "user",
                    "content": f"Carry out step {number} of {len(plan)}: {step}",
                }
            )
            while True:
                reply = self._chat(conversation, tools=True, critical=index > 0)
                assistant: dict[str, Any] = {"role": "assistant", "content": reply.content}
                if reply.tool_calls:
                    assistant["tool_calls"] = [
                        {"function": {"name": c["name"], "arguments": c["arguments"]}}
                        for c in reply.tool_calls
                    ]
                conversation.append(assistant)
                if not reply.tool_calls:
                    answer = reply.content.strip()
                    break
                for call in reply.tool_calls:
                    self._check()
                    if self.task.tool_calls >= self.config.max_steps:
                        raise BudgetExceeded("reason.step_budget", limit=self.config.max_steps)
                    name = str(call["name"])

                    def calling(task: Task, name: str = name) -> None:
                        task.tool_calls += 1
                        task.current_task = name

                    self.update(calling)
                    text, _is_error = self.tools.call(self.task.task_id, name, call["arguments"])
                    conversation.append({"role": "tool", "content": text, "tool_name": name})

            def done(task: Task, number: int = number) -> None:
                task.completed_steps = number

            self.update(done)
        return answer
