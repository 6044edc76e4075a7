"""Every text the agent shows a caller, in English (default) and Japanese (`language: ja`).

The Japanese texts the seed prints are used word for word; the others follow their style.
The status text's lines and their order are the seed's.
"""

from __future__ import annotations

from typing import Final

_TEXTS: Final[dict[str, dict[str, str]]] = {
    "queued_ack": {
        "en": "Task {task_id} was queued in session {session_id}.",
        "ja": "タスク {task_id} をセッション {session_id} に登録しました。",
    },
    "not_found": {
        "en": "Task {task_id} was not found.",
        "ja": "タスク {task_id} が見つかりません。",
    },
    "state.queued": {"en": "The task is waiting in the queue.", "ja": "タスクは実行待ちです。"},
    "state.planning": {
        "en": "The model is planning the task.",
        "ja": "タスクを計画しています。",
    },
    "state.running": {"en": "The task is running.", "ja": "タスクを実行しています。"},
    "state.completed": {"en": "The task completed.", "ja": "タスクが完了しました。"},
    "state.failed": {"en": "The task failed.", "ja": "タスクが失敗しました。"},
    "state.cancelled": {"en": "The task was cancelled.", "ja": "タスクは取り消されました。"},
    # failure reasons (the `result` line of a failed or cancelled task)
    "reason.cancelled": {
        "en": "Cancelled at the caller's request.",
        "ja": "要求によりタスクを取り消しました。",
    },
    "reason.shutdown": {
        "en": "Interrupted by shutdown: the process stopped while the task was {state}.",
        "ja": "シャットダウンにより中断されました (タスクは {state} でした)。",
    },
    "reason.unreachable": {
        "en": "Ollama is unreachable at {host}: start Ollama (ollama serve) or correct "
        "ollama.host in agent.yaml.",
        "ja": "{host} の Ollama に接続できません。Ollama を起動する (ollama serve) か、"
        "agent.yaml の ollama.host を修正してください。",
    },
    "reason.model_missing": {
        "en": "The model {model} is not installed in Ollama at {host}: run `ollama pull {model}`.",
        "ja": "モデル {model} が {host} の Ollama にありません。`ollama pull {model}` を実行して"
        "ください。",
    },
    "reason.no_model": {
        "en": "No model is configured: set ollama.model in agent.yaml.",
        "ja": "モデルが設定されていません。agent.yaml の ollama.model を設定してください。",
    },
    "reason.no_tools": {
        "en": "The model {model} does not support tool calling (its capabilities lack "
        "`tools`): choose a model with tool support.",
        "ja": "モデル {model} はツール呼び出しに対応していません (capabilities に `tools` が"
        "ありません)。ツール対応のモデルを選んでください。",
    },
    "reason.no_vision": {
        "en": "The task has images but the model {model} has no vision support (its "
        "capabilities lack `vision`): choose a vision model or send no images.",
        "ja": "画像が指定されましたが、モデル {model} は画像入力 (vision) に対応していません。"
        "Vision対応のモデルを選ぶか、画像なしで依頼してください。",
    },
    "reason.ollama_error": {
        "en": "Ollama at {host} answered with an error (HTTP {status}): {error}",
        "ja": "{host} の Ollama がエラーを返しました (HTTP {status}): {error}",
    },
    "reason.step_budget": {
        "en": "Step budget exhausted: the task used its {limit} tool calls "
        "(budgets.max_steps) before finishing.",
        "ja": "ステップ予算を使い切りました: 完了前にツール呼び出し {limit} 回 "
        "(budgets.max_steps) に達しました。",
    },
    "reason.token_budget": {
        "en": "Token budget exhausted: the task used {used} tokens, over its budget of {limit} "
        "(budgets.max_tokens).",
        "ja": "トークン予算を使い切りました: {used} トークンを使用し、予算 {limit} "
        "(budgets.max_tokens) を超えました。",
    },
    "reason.internal": {
        "en": "The agent failed unexpectedly ({kind}); see the log.",
        "ja": "エージェントが予期せず失敗しました ({kind})。ログを確認してください。",
    },
    "reason.agent_disabled": {
        "en": "The memory agent is disabled: set enabled: true in agent.yaml.",
        "ja": "メモリエージェントは無効です。agent.yaml で enabled: true を設定してください。",
    },
    # input errors (tool errors of agent_run / agent_status)
    "err.unknown_property": {
        "en": "{names}: unknown argument, not accepted (allowed arguments: {allowed})",
        "ja": "{names}: 未定義の引数です (使用できる引数: {allowed})",
    },
    "err.unknown_property_unnamed": {
        "en": "unknown argument: not accepted (allowed arguments: {allowed})",
        "ja": "未定義の引数があります (使用できる引数: {allowed})",
    },
    "err.required": {"en": "{field}: required", "ja": "{field}: 必須です"},
    "err.type": {"en": "{field}: must be {kind}", "ja": "{field}: {kind}でなければなりません"},
    "err.uuid": {
        "en": "{field}: must be a UUID (8-4-4-4-12 hexadecimal digits)",
        "ja": "{field}: UUID (16進数 8-4-4-4-12 桁) でなければなりません",
    },
    "err.blank": {
        "en": "{field}: must not be empty or only whitespace",
        "ja": "{field}: 空または空白だけにはできません",
    },
    "err.temperature": {
        "en": "temperature: must be between 0.0 and 2.0",
        "ja": "temperature: 0.0 以上 2.0 以下でなければなりません",
    },
    "err.unknown_session": {
        "en": "session_id: no agent session with this id (omit it to start a new session)",
        "ja": "session_id: このIDのAgent会話はありません (新しい会話にするには省略してください)",
    },
    "err.null": {"en": "{field}: must not be null", "ja": "{field}: null にはできません"},
    "err.mime": {
        "en": "{field}: must be image/png, image/jpeg or image/webp",
        "ja": "{field}: image/png、image/jpeg、image/webp のいずれかでなければなりません",
    },
    "err.base64": {
        "en": "{field}: must be valid base64",
        "ja": "{field}: 有効なBase64でなければなりません",
    },
    "err.image_count": {
        "en": "images: at most {limit} images (mcp.images.max_count)",
        "ja": "images: 画像は最大 {limit} 件です (mcp.images.max_count)",
    },
    "err.image_size": {
        "en": "{field}: the decoded image must be at most {limit} bytes "
        "(mcp.images.max_bytes_each)",
        "ja": "{field}: デコード後の画像は最大 {limit} バイトです (mcp.images.max_bytes_each)",
    },
    "err.image_total": {
        "en": "images: the decoded images must total at most {limit} bytes "
        "(mcp.images.max_bytes_total)",
        "ja": "images: デコード後の画像の合計は最大 {limit} バイトです "
        "(mcp.images.max_bytes_total)",
    },
    "err.disabled": {
        "en": "the memory agent is disabled: set enabled: true in agent.yaml",
        "ja": "メモリエージェントは無効です。agent.yaml で enabled: true を設定してください",
    },
    "kind.string": {"en": "a string", "ja": "文字列"},
    "kind.number": {"en": "a number", "ja": "数値"},
    "kind.array": {"en": "an array", "ja": "配列"},
    "kind.object": {"en": "an object", "ja": "オブジェクト"},
}


def text(key: str, language: str, **values: object) -> str:
    entry = _TEXTS[key]
    template = entry.get(language) or entry["en"]
    return template.format(**values)


def status_text(
    *,
    task_id: str,
    session_id: str,
    status: str,
    completed: int,
    total: int,
    current_task: str,
    input_tokens: int,
    output_tokens: int,
    critical_path_tokens: int,
    result: str,
    language: str,
) -> str:
    """The seed's nine-line status text (`result` may continue on further lines)."""
    lines = [
        f"task_id: {task_id}",
        f"session_id: {session_id}",
        f"status: {status}",
        f"completed_tasks: {completed}/{total}",
        _field("current_task", current_task),
        f"token_usage: input={input_tokens} output={output_tokens} "
        f"total={input_tokens + output_tokens}",
        f"critical_path_tokens: {critical_path_tokens}",
        f"message: {text('state.' + status, language)}",
        _field("result", result),
    ]
    return "\n".join(lines)


def _field(name: str, value: str) -> str:
    return f"{name}: {value}" if value else f"{name}:"


def queued_text(task_id: str, session_id: str, language: str) -> str:
    """The seed's four-line answer of `agent_run` without the Tasks extension."""
    return "\n".join(
        [
            f"task_id: {task_id}",
            f"session_id: {session_id}",
            "status: queued",
            "message: " + text("queued_ack", language, task_id=task_id, session_id=session_id),
        ]
    )


def not_found_text(task_id: str, language: str) -> str:
    """The seed's three-line answer for an unknown task (or a session that does not own it)."""
    return "\n".join(
        [
            f"task_id: {task_id}",
            "status: failed",
            "message: " + text("not_found", language, task_id=task_id),
        ]
    )
