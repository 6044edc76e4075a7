"""The agent's durable state in the data dir: tasks, agent sessions, images, the audit journal.

Layout (all user-only, in `<data dir>/agent/`, created 0700):

- `state.json`: `{"format": "convmem-agent-state", "version": 1, "next_seq": N,
  "sessions": {id: {...}}, "tasks": [{...}, ...]}`, replaced atomically (temporary file, fsync,
  rename, directory fsync) on every state change, so a crash leaves the previous or the next
  state, never half of one.
- `images/<task id>.json`: a queued task's images (base64), written once before the task is
  acknowledged, removed when the task ends.
- `audit.jsonl`: the audit journal, one JSON object per line, appended and fsynced before the
  mutating call's result reaches the model: `{"v": 1, "at", "task_id", "tool", "message_ids",
  "before_revision", "after_revision", "ok"}`.

A file from a newer format version, or one that does not parse, is refused with a message that
names it (`AgentStoreError`); nothing is overwritten then. Terminal tasks beyond the newest
`KEEP_TERMINAL_TASKS` are dropped from `state.json` when a task ends (their audit records stay).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from convmem_engine.agent import files

FORMAT: Final = "convmem-agent-state"
VERSION: Final = 1
AUDIT_VERSION: Final = 1
KEEP_TERMINAL_TASKS: Final = 1000

STATES: Final = ("queued", "planning", "running", "completed", "failed", "cancelled")
TERMINAL: Final = frozenset({"completed", "failed", "cancelled"})
ACTIVE: Final = frozenset({"planning", "running"})


class AgentStoreError(Exception):
    """The agent's files cannot be used; the message names the file and the problem."""


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass(slots=True)
class Task:
    task_id: str
    session_id: str
    seq: int
    request: str
    temperature: float | None
    image_count: int
    state: str = "queued"
    created_at: str = ""
    updated_at: str = ""
    plan: list[str] = field(default_factory=list)
    completed_steps: int = 0
    current_task: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    critical_path_tokens: int = 0
    tool_calls: int = 0
    result: str = ""
    cancel_requested: bool = False

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def total_steps(self) -> int:
        return max(1, len(self.plan))

    def copy(self) -> Task:
        return Task(**{**asdict(self), "plan": list(self.plan)})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Task:
        task = cls(**data)
        if task.state not in STATES:
            raise ValueError("state")
        return task


@dataclass(slots=True)
class AgentSession:
    session_id: str
    created_at: str
    task_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class AuditRecord:
    at: str
    task_id: str
    tool: str
    message_ids: tuple[str, ...]
    before_revision: int | None
    after_revision: int | None
    ok: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "v": AUDIT_VERSION,
            "at": self.at,
            "task_id": self.task_id,
            "tool": self.tool,
            "message_ids": list(self.message_ids),
            "before_revision": self.before_revision,
            "after_revision": self.after_revision,
            "ok": self.ok,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AuditRecord:
        return cls(
            at=str(data["at"]),
            task_id=str(data["task_id"]),
            tool=str(data["tool"]),
            message_ids=tuple(str(m) for m in data["message_ids"]),
            before_revision=data.get("before_revision"),
            after_revision=data.get("after_revision"),
            ok=bool(data.get("ok", True)),
        )


class AgentStore:
    """Tasks and sessions in memory, mirrored durably to the data dir. Thread-safe."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.dir = os.path.join(os.fspath(data_dir), "agent")
        files.ensure_dir(self.dir)
        files.ensure_dir(os.path.join(self.dir, "images"))
        self.state_path = os.path.join(self.dir, "state.json")
        self.audit_path = os.path.join(self.dir, "audit.jsonl")
        self._lock = threading.RLock()
        self.tasks: dict[str, Task] = {}
        self.sessions: dict[str, AgentSession] = {}
        self.next_seq = 1
        self._load()
        self._audit = files.AppendFile(self.audit_path)

    # -- loading ---------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            raw = files.read_file(self.state_path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise AgentStoreError(f"{self.state_path}: cannot be read ({exc.strerror})") from None
        try:
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError("format")
            version = data.get("version")
            if not isinstance(version, int) or version > VERSION:
                raise AgentStoreError(
                    f"{self.state_path}: format version {version} is newer than this ConvMem "
                    f"understands ({VERSION}); use a newer ConvMem"
                )
            for item in data["tasks"]:
                task = Task.from_json(item)
                self.tasks[task.task_id] = task
            for sid, item in data["sessions"].items():
                self.sessions[sid] = AgentSession(
                    session_id=sid,
                    created_at=str(item["created_at"]),
                    task_ids=[str(t) for t in item["task_ids"]],
                )
            self.next_seq = int(data["next_seq"])
        except AgentStoreError:
            raise
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise AgentStoreError(
                f"{self.state_path}: damaged (not a ConvMem agent state file); move it away "
                "to start with no agent tasks"
            ) from None

    def recover_after_restart(self, reason: str) -> list[Task]:
        """Tasks that were planning/running when the process stopped end `failed` with
        `reason`; queued tasks stay queued (they run again, in their order). Returns the
        tasks failed."""
        failed = []
        with self._lock:
            for task in self.tasks.values():
                if task.state in ACTIVE:
                    task.result = reason.format(state=task.state)
                    task.state = "failed"
                    task.current_task = ""
                    task.updated_at = now_iso()
                    failed.append(task)
                    files.remove(self.image_path(task.task_id))
            if failed:
                self.save()
        return failed

    # -- saving ----------------------------------------------------------------------------

    def save(self) -> None:
        with self._lock:
            terminal = sorted((t for t in self.tasks.values() if t.terminal), key=lambda t: t.seq)
            for old in terminal[: max(0, len(terminal) - KEEP_TERMINAL_TASKS)]:
                del self.tasks[old.task_id]
            data = {
                "format": FORMAT,
                "version": VERSION,
                "next_seq": self.next_seq,
                "sessions": {
                    sid: {"created_at": s.created_at, "task_ids": s.task_ids}
                    for sid, s in self.sessions.items()
                },
                "tasks": [t.to_json() for t in sorted(self.tasks.values(), key=lambda t: t.seq)],
            }
            files.write_atomic(
                self.state_path, json.dumps(data, ensure_ascii=False).encode("utf-8")
            )

    def image_path(self, task_id: str) -> str:
        return os.path.join(self.dir, "images", f"{task_id}.json")

    def save_images(self, task_id: str, images: list[dict[str, str]]) -> None:
        files.write_atomic(self.image_path(task_id), json.dumps(images).encode("ascii"))

    def load_images(self, task_id: str) -> list[dict[str, str]]:
        try:
            raw = files.read_file(self.image_path(task_id))
        except FileNotFoundError:
            return []
        data = json.loads(raw.decode("ascii"))
        return [
            {"mime_type": str(i["mime_type"]), "data_base64": str(i["data_base64"])} for i in data
        ]

    def drop_images(self, task_id: str) -> None:
        files.remove(self.image_path(task_id))

    # -- audit -----------------------------------------------------------------------------

    def audit(self, record: AuditRecord) -> None:
        line = json.dumps(record.to_json(), ensure_ascii=False) + "\n"
        with self._lock:
            self._audit.append(line.encode("utf-8"))

    def audit_records(self, task_id: str | None = None) -> list[AuditRecord]:
        try:
            raw = files.read_file(self.audit_path)
        except FileNotFoundError:
            return []
        records = []
        for line in raw.decode("utf-8", errors="replace").splitlines():
            try:
                record = AuditRecord.from_json(json.loads(line))
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line after a crash: the call it describes never returned
            if task_id is None or record.task_id == task_id:
                records.append(record)
        return records

    def close(self) -> None:
        with self._lock:
            self._audit.close()
