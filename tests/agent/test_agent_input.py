"""Every input rule of the seed, the seed's texts in English and Japanese, agent.yaml."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from convmem_engine.agent import (
    AgentConfig,
    AgentConfigError,
    AgentInputError,
    load_config,
    save_config,
)
from convmem_engine.agent.config import (
    ImageLimits,
    normalize_ollama_host,
    parse_config,
)
from convmem_engine.agent.validation import AGENT_RUN_SCHEMA, AGENT_STATUS_SCHEMA
from convmem_engine.mcp.agent_tools import transport_line_limit
from convmem_engine.mcp.line_transport import MAX_LINE_BYTES
from tests.agent.conftest import AgentFactory

PNG = base64.b64encode(b"\x89PNG" + b"x" * 60).decode()
SID = "2a8105cc-84f9-4d37-a5bd-e48e04654eb7"


def img(mime: object = "image/png", data: object = PNG) -> dict[str, object]:
    return {"mime_type": mime, "data_base64": data}


BAD_RUN = [
    ({"request": "x", "extra": 1}, "extra: unknown argument"),
    ({}, "request: required"),
    ({"request": 5}, "request: must be a string"),
    ({"request": "x", "session_id": "not-a-uuid"}, "session_id: must be a UUID"),
    ({"request": "x", "session_id": 7}, "session_id: must be a string"),
    ({"request": ""}, "request: must not be empty"),
    ({"request": " \n\t "}, "request: must not be empty"),
    ({"request": "x", "temperature": 2.01}, "temperature: must be between 0.0 and 2.0"),
    ({"request": "x", "temperature": -0.1}, "temperature: must be between 0.0 and 2.0"),
    ({"request": "x", "temperature": "hot"}, "temperature: must be a number"),
    ({"request": "x", "temperature": True}, "temperature: must be a number"),
    ({"request": "x", "session_id": SID}, "session_id: no agent session with this id"),
    ({"request": "x", "images": "a"}, "images: must be an array"),
    ({"request": "x", "images": [None]}, "images.0: must not be null"),
    ({"request": "x", "images": [img(mime=None)]}, "images.0.mime_type: must not be null"),
    ({"request": "x", "images": [img(data=None)]}, "images.0.data_base64: must not be null"),
    ({"request": "x", "images": [{"mime_type": "image/png"}]}, "images.0.data_base64: required"),
    ({"request": "x", "images": [{**img(), "name": "a"}]}, "images.0.name: unknown argument"),
    ({"request": "x", "images": [img(mime="image/gif")]}, "images.0.mime_type: must be image/png"),
    ({"request": "x", "images": [img(data="@@@@")]}, "images.0.data_base64: must be valid base64"),
    ({"request": "x", "images": [img(data="abc")]}, "images.0.data_base64: must be valid base64"),
    ({"request": "x", "images": [img()] * 5}, "images: at most 4 images"),
]


@pytest.mark.parametrize(("arguments", "message"), BAD_RUN)
def test_agent_run_rejects_bad_input_and_queues_nothing(
    make_agent: AgentFactory, arguments: dict[str, object], message: str
) -> None:
    agent = make_agent(start=False)
    with pytest.raises(AgentInputError) as info:
        agent.submit(arguments)
    assert info.value.message.startswith(message), info.value.message
    assert agent.tasks() == []
    assert agent.store.sessions == {}


def test_image_size_limits_count_decoded_bytes(make_agent: AgentFactory) -> None:
    limits = ImageLimits(max_count=3, max_bytes_each=30, max_bytes_total=50)
    agent = make_agent(start=False, images=limits)
    exactly = base64.b64encode(b"a" * 30).decode()  # 40 base64 characters, 30 bytes
    agent.submit({"request": "x", "images": [img(data=exactly)]})
    with pytest.raises(
        AgentInputError, match=r"images.0.data_base64: the decoded image must be at most 30 bytes"
    ):
        agent.submit({"request": "x", "images": [img(data=base64.b64encode(b"a" * 31).decode())]})
    with pytest.raises(
        AgentInputError, match=r"images: the decoded images must total at most 50 bytes"
    ):
        agent.submit({"request": "x", "images": [img(data=exactly), img(data=exactly)]})
    assert len(agent.tasks()) == 1


def test_japanese_error_texts(make_agent: AgentFactory) -> None:
    agent = make_agent(start=False, language="ja")
    with pytest.raises(AgentInputError, match="request: 空または空白だけにはできません"):
        agent.submit({"request": " "})
    with pytest.raises(AgentInputError, match=r"temperature: 0\.0 以上 2\.0 以下"):
        agent.submit({"request": "x", "temperature": 3})


def test_seed_texts_english_and_japanese(make_agent: AgentFactory) -> None:
    from convmem_engine.agent.texts import not_found_text, queued_text

    tid, sid = "9ab4a40b-86fe-432a-904f-8e429c01ea8b", SID
    assert queued_text(tid, sid, "ja") == (
        f"task_id: {tid}\nsession_id: {sid}\nstatus: queued\n"
        f"message: タスク {tid} をセッション {sid} に登録しました。"
    )
    assert queued_text(tid, sid, "en").endswith(f"message: Task {tid} was queued in session {sid}.")
    zero = "00000000-0000-0000-0000-000000000000"
    assert not_found_text(zero, "ja") == (
        f"task_id: {zero}\nstatus: failed\nmessage: タスク {zero} が見つかりません。"
    )
    agent = make_agent(start=False, language="ja")
    assert agent.status({"task_id": zero}) == not_found_text(zero, "ja")
    sub = agent.submit({"request": "x"})
    # a session that does not own the task: the same not-found text
    other = "11111111-2222-4333-8444-555555555555"
    assert agent.status({"task_id": sub.task_id, "session_id": other}) == not_found_text(
        sub.task_id, "ja"
    )
    text = agent.status({"task_id": sub.task_id, "session_id": sub.session_id})
    assert text.splitlines()[7] == "message: タスクは実行待ちです。"
    with pytest.raises(AgentInputError, match="task_id: UUID"):
        agent.status({"task_id": "nope"})
    with pytest.raises(AgentInputError, match="extra"):
        agent.status({"task_id": zero, "extra": 1})
    with pytest.raises(AgentInputError, match="task_id: 必須です"):
        agent.status({})


def test_disabled_agent_refuses(make_agent: AgentFactory) -> None:
    agent = make_agent(start=False, enabled=False)
    with pytest.raises(AgentInputError, match="enabled: true"):
        agent.submit({"request": "x"})


def test_schemas_are_the_seeds() -> None:
    assert AGENT_RUN_SCHEMA["required"] == ["request"]
    assert AGENT_RUN_SCHEMA["additionalProperties"] is False
    assert AGENT_RUN_SCHEMA["properties"]["session_id"] == {
        "description": "Existing session UUID, or omit to create a session.",
        "type": ["string", "null"],
        "format": "uuid",
        "default": None,
    }
    assert AGENT_RUN_SCHEMA["properties"]["images"]["items"]["required"] == [
        "mime_type",
        "data_base64",
    ]
    assert list(AGENT_STATUS_SCHEMA["properties"]) == ["task_id", "session_id"]


# -- agent.yaml ---------------------------------------------------------------------------


def test_config_defaults_round_trip_and_every_key(tmp_path: Path) -> None:
    assert load_config(tmp_path) == AgentConfig()
    assert AgentConfig().enabled is False
    config = AgentConfig(
        enabled=True,
        language="ja",
        ollama_host="localhost:1234",
        ollama_model="qwen3:8b",
        ollama_temperature=0.7,
        images=ImageLimits(2, 1000, 1500),
        max_steps=5,
        max_tokens=9000,
        max_plan_steps=3,
        allow_delete=True,
        allow_rebuild=True,
    )
    save_config(tmp_path, config)
    assert load_config(tmp_path) == config
    text = (tmp_path / "agent.yaml").read_text()
    for key in (
        "enabled",
        "host",
        "model",
        "temperature",
        "max_count",
        "max_bytes_each",
        "max_bytes_total",
        "language",
        "max_steps",
        "max_tokens",
        "allow_delete",
    ):
        assert f"{key}:" in text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("enabled: yes please", "enabled: must be true or false"),
        ("enabeld: true", "enabeld: unknown key"),
        ("ollama:\n  temperature: 5", "ollama.temperature: must be a number from 0.0 to 2.0"),
        ("ollama:\n  modle: x", "ollama.modle: unknown key"),
        ("ollama: 3", "ollama: must be a mapping"),
        ("ollama:\n  host: ftp://x", "ollama.host: must use http or https"),
        ("mcp:\n  images:\n    max_count: -1", "mcp.images.max_count: must be an integer"),
        (
            "mcp:\n  images:\n    max_bytes_each: big",
            "mcp.images.max_bytes_each: must be an integer",
        ),
        ("mcp:\n  images: 4", "mcp.images: must be a mapping"),
        ("language: fr", "language: must be en or ja"),
        ("budgets:\n  max_steps: 0", "budgets.max_steps: must be an integer"),
        ("tools:\n  allow_delete: 1", "tools.allow_delete: must be true or false"),
        ("enabled: [", "line 1: not valid YAML"),
        ("- a\n- b", "must be a mapping"),
    ],
)
def test_broken_config_names_the_key(text: str, message: str) -> None:
    with pytest.raises(AgentConfigError) as info:
        parse_config(text, "agent.yaml")
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("value", "url"),
    [
        ("", "http://127.0.0.1:11434"),
        ("1.2.3.4", "http://1.2.3.4:11434"),
        (":56789", "http://127.0.0.1:56789"),
        ("1.2.3.4:56789", "http://1.2.3.4:56789"),
        ("http://1.2.3.4", "http://1.2.3.4:80"),
        ("https://example.com", "https://example.com:443"),
        ("https://example.com:56789/path/", "https://example.com:56789/path"),
        ("example.com:56789/", "http://example.com:56789"),
        ("[0001:002:003:0004::1]:56789", "http://[0001:002:003:0004::1]:56789"),
        ("0.0.0.0", "http://127.0.0.1:11434"),
        ("0.0.0.0:11500", "http://127.0.0.1:11500"),
    ],
)
def test_ollama_host_in_ollamas_forms(value: str, url: str) -> None:
    assert normalize_ollama_host(value) == url


def test_ollama_host_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_HOST", "10.0.0.5:9999")
    assert AgentConfig().effective_host() == "http://10.0.0.5:9999"
    assert AgentConfig(ollama_host="localhost").effective_host() == "http://localhost:11434"
    monkeypatch.delenv("OLLAMA_HOST")
    assert AgentConfig().effective_host() == "http://127.0.0.1:11434"


def test_transport_limit_admits_the_configured_maximum_images() -> None:
    assert transport_line_limit(AgentConfig()) == MAX_LINE_BYTES  # disabled: unchanged
    default = transport_line_limit(AgentConfig(enabled=True))
    assert default >= 4 * (20 * 1024 * 1024) // 3 + 16
    big = AgentConfig(enabled=True, images=ImageLimits(8, 30 * 1024 * 1024, 100 * 1024 * 1024))
    assert transport_line_limit(big) >= 4 * (100 * 1024 * 1024) // 3
    tiny = AgentConfig(enabled=True, images=ImageLimits(0, 1, 1))
    assert transport_line_limit(tiny) == MAX_LINE_BYTES
