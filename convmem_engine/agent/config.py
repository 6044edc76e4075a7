"""`agent.yaml` in the data dir: the memory agent's settings.

Every key is documented in the README ("The memory agent"). A missing file means every
default (the agent disabled). A broken file is an `AgentConfigError` whose message names the
key and the rule; it is never a crash and never a silently ignored setting: an unknown key is
an error too (a typo would otherwise be ignored).

PyYAML reads and writes the file: the issue fixes YAML as the format, and a hand-written YAML
reader would be a worse parser than the standard one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final
from urllib.parse import urlsplit

from convmem_engine.agent import files

CONFIG_FILE: Final = "agent.yaml"
DEFAULT_OLLAMA_HOST: Final = "http://127.0.0.1:11434"
DEFAULT_OLLAMA_PORT: Final = 11434
MIB: Final = 1024 * 1024
LANGUAGES: Final = ("en", "ja")

# Room for everything in an agent_run request that is not image data: the request text, the
# JSON-RPC envelope, `_meta`, and per-image framing.
_AGENT_REQUEST_SLACK_BYTES: Final = 2 * MIB


class AgentConfigError(Exception):
    """`agent.yaml` cannot be used; the message names the file, the key and the rule."""


@dataclass(frozen=True, slots=True)
class ImageLimits:
    max_count: int = 4
    max_bytes_each: int = 10 * MIB
    max_bytes_total: int = 20 * MIB


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """The parsed `agent.yaml`; every field has the documented default."""

    enabled: bool = False
    language: str = "en"
    ollama_host: str = ""  # "" = OLLAMA_HOST, else DEFAULT_OLLAMA_HOST (see `effective_host`)
    ollama_model: str = ""
    ollama_temperature: float | None = None
    ollama_timeout_seconds: float = 300.0
    images: ImageLimits = field(default_factory=ImageLimits)
    max_steps: int = 20
    max_tokens: int = 200_000
    max_plan_steps: int = 8
    allow_delete: bool = False
    allow_rebuild: bool = False

    def effective_host(self) -> str:
        """The Ollama base URL: `ollama.host`, else `OLLAMA_HOST`, else the default."""
        return normalize_ollama_host(self.ollama_host or os.environ.get("OLLAMA_HOST", ""))

    def with_changes(self, **changes: Any) -> AgentConfig:
        return replace(self, **changes)


def normalize_ollama_host(value: str) -> str:
    """An Ollama host in any of Ollama's own forms, as a base URL.

    `host`, `host:port`, `:port`, `scheme://host[:port][/path]` and bracketed IPv6 are
    accepted, as Ollama and its client accept them: without a scheme `http` and port 11434 are
    assumed; with a scheme and no port, the scheme's port. `0.0.0.0` (a listening address)
    means this machine.
    """
    text = value.strip()
    if not text:
        return DEFAULT_OLLAMA_HOST
    scheme, sep, rest = text.partition("://")
    explicit_scheme = bool(sep)
    if not explicit_scheme:
        scheme, rest = "http", text
    scheme = scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError("must use http or https")
    hostport, _, path = rest.partition("/")
    parsed = urlsplit(f"//{hostport}")
    try:
        port = parsed.port
    except ValueError:
        raise ValueError("has an invalid port") from None
    host = parsed.hostname or "127.0.0.1"
    if host == "0.0.0.0":
        host = "127.0.0.1"
    if port is None:
        port = (443 if scheme == "https" else 80) if explicit_scheme else DEFAULT_OLLAMA_PORT
    shown = f"[{host}]" if ":" in host else host
    path = path.strip("/")
    return f"{scheme}://{shown}:{port}" + (f"/{path}" if path else "")


def agent_request_bytes(config: AgentConfig) -> int:
    """The largest `agent_run` request the configuration admits, in bytes on the wire: the
    configured maximum images in base64 (4/3 of the decoded bytes, plus padding per image) plus
    room for the request text and the JSON-RPC envelope. Transports take the larger of this
    and their own limit (`convmem_engine.mcp.agent_tools.transport_line_limit`)."""
    limits = config.images
    total = min(limits.max_bytes_total, limits.max_count * limits.max_bytes_each)
    encoded = 4 * math.ceil(total / 3) + 4 * limits.max_count
    return encoded + _AGENT_REQUEST_SLACK_BYTES


# -- reading -------------------------------------------------------------------------------

_KEYS: Final = {
    "enabled",
    "language",
    "ollama",
    "mcp",
    "budgets",
    "tools",
}
_OLLAMA_KEYS: Final = {"host", "model", "temperature", "timeout_seconds"}
_MCP_KEYS: Final = {"images"}
_IMAGE_KEYS: Final = {"max_count", "max_bytes_each", "max_bytes_total"}
_BUDGET_KEYS: Final = {"max_steps", "max_tokens", "max_plan_steps"}
_TOOL_KEYS: Final = {"allow_delete", "allow_rebuild"}


class _Reader:
    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, key: str, rule: str) -> AgentConfigError:
        return AgentConfigError(f"{self.path}: {key}: {rule}")

    def section(
        self, data: Mapping[str, Any], key: str, allowed: set[str], prefix: str = ""
    ) -> Mapping[str, Any]:
        value = _get(data, key)
        key = prefix + key
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(key, "must be a mapping")
        for name in value:
            if name not in allowed:
                label = f"{key}.{name}" if isinstance(name, str) else key
                raise self.fail(label, f"unknown key (allowed: {', '.join(sorted(allowed))})")
        return value

    def boolean(self, data: Mapping[str, Any], key: str, label: str, default: bool) -> bool:
        value = _get(data, key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(label, "must be true or false")
        return value

    def integer(
        self, data: Mapping[str, Any], key: str, label: str, default: int, low: int, high: int
    ) -> int:
        value = _get(data, key)
        if value is None:
            return default
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise self.fail(label, f"must be an integer from {low} to {high}")
        return value

    def number(
        self, data: Mapping[str, Any], key: str, label: str, low: float, high: float
    ) -> float | None:
        value = _get(data, key)
        if value is None:
            return None
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
            or not low <= value <= high
        ):
            raise self.fail(label, f"must be a number from {low} to {high}")
        return float(value)

    def text(self, data: Mapping[str, Any], key: str, label: str) -> str:
        value = _get(data, key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self.fail(label, "must be a string")
        return value.strip()


def _get(data: Mapping[str, Any], key: str) -> Any:
    return data.get(key)


def parse_config(text: str, path: str = CONFIG_FILE) -> AgentConfig:
    """Parse the YAML text of `agent.yaml`; `AgentConfigError` names the broken key."""
    import yaml  # here: a data dir without agent.yaml (the default) never needs it

    r = _Reader(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "file"
        raise AgentConfigError(f"{path}: {where}: not valid YAML") from None
    if data is None:
        return AgentConfig()
    if not isinstance(data, Mapping):
        raise AgentConfigError(f"{path}: the file must be a mapping of keys")
    for key in data:
        if key not in _KEYS:
            label = key if isinstance(key, str) else "a key"
            raise r.fail(label, f"unknown key (allowed: {', '.join(sorted(_KEYS))})")
    ollama = r.section(data, "ollama", _OLLAMA_KEYS)
    mcp = r.section(data, "mcp", _MCP_KEYS)
    images = r.section(mcp, "images", _IMAGE_KEYS, "mcp.")
    budgets = r.section(data, "budgets", _BUDGET_KEYS)
    tools = r.section(data, "tools", _TOOL_KEYS)

    language = _get(data, "language")
    if language is None:
        language = "en"
    if language not in LANGUAGES:
        raise r.fail("language", "must be en or ja")
    host = r.text(ollama, "host", "ollama.host")
    if host:
        try:
            normalize_ollama_host(host)
        except ValueError as exc:
            raise r.fail("ollama.host", str(exc)) from None
    defaults = ImageLimits()
    limit = 1024 * MIB
    image_limits = ImageLimits(
        max_count=r.integer(images, "max_count", "mcp.images.max_count", defaults.max_count, 0, 64),
        max_bytes_each=r.integer(
            images, "max_bytes_each", "mcp.images.max_bytes_each", defaults.max_bytes_each, 1, limit
        ),
        max_bytes_total=r.integer(
            images,
            "max_bytes_total",
            "mcp.images.max_bytes_total",
            defaults.max_bytes_total,
            1,
            limit,
        ),
    )
    base = AgentConfig()
    return AgentConfig(
        enabled=r.boolean(data, "enabled", "enabled", base.enabled),
        language=str(language),
        ollama_host=host,
        ollama_model=r.text(ollama, "model", "ollama.model"),
        ollama_temperature=r.number(ollama, "temperature", "ollama.temperature", 0.0, 2.0),
        ollama_timeout_seconds=(
            r.number(ollama, "timeout_seconds", "ollama.timeout_seconds", 1.0, 86_400.0)
            or base.ollama_timeout_seconds
        ),
        images=image_limits,
        max_steps=r.integer(budgets, "max_steps", "budgets.max_steps", base.max_steps, 1, 10_000),
        max_tokens=r.integer(
            budgets, "max_tokens", "budgets.max_tokens", base.max_tokens, 1, 1_000_000_000
        ),
        max_plan_steps=r.integer(
            budgets, "max_plan_steps", "budgets.max_plan_steps", base.max_plan_steps, 1, 100
        ),
        allow_delete=r.boolean(tools, "allow_delete", "tools.allow_delete", base.allow_delete),
        allow_rebuild=r.boolean(tools, "allow_rebuild", "tools.allow_rebuild", base.allow_rebuild),
    )


def config_path(data_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(data_dir), CONFIG_FILE)


def load_config(data_dir: str | os.PathLike[str]) -> AgentConfig:
    """Read `agent.yaml` from the data dir (defaults when it does not exist)."""
    path = config_path(data_dir)
    try:
        raw = files.read_file(path)
    except FileNotFoundError:
        return AgentConfig()
    except OSError as exc:
        raise AgentConfigError(
            f"{path}: cannot be read ({exc.strerror or type(exc).__name__})"
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise AgentConfigError(f"{path}: the file is not UTF-8 text") from None
    return parse_config(text, path)


def to_yaml(config: AgentConfig) -> str:
    """The YAML text of `config`, every key written out."""
    data: dict[str, Any] = {
        "enabled": config.enabled,
        "language": config.language,
        "ollama": {
            "host": config.ollama_host or None,
            "model": config.ollama_model or None,
            "temperature": config.ollama_temperature,
            "timeout_seconds": config.ollama_timeout_seconds,
        },
        "mcp": {
            "images": {
                "max_count": config.images.max_count,
                "max_bytes_each": config.images.max_bytes_each,
                "max_bytes_total": config.images.max_bytes_total,
            }
        },
        "budgets": {
            "max_steps": config.max_steps,
            "max_tokens": config.max_tokens,
            "max_plan_steps": config.max_plan_steps,
        },
        "tools": {"allow_delete": config.allow_delete, "allow_rebuild": config.allow_rebuild},
    }
    import yaml

    header = "# ConvMem memory agent settings; every key is described in the README.\n"
    return header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def save_config(data_dir: str | os.PathLike[str], config: AgentConfig) -> None:
    """Write `agent.yaml` atomically (user-only); the written text parses back to `config`."""
    text = to_yaml(config)
    parse_config(text)  # never write a file we would refuse to read
    files.write_atomic(config_path(data_dir), text.encode("utf-8"))
