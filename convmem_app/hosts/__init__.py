"""LLM host setup: where each host keeps its MCP configuration (`locations`, stdlib only) and
safe edits of it (`configure`). No Qt: used by `convmem hosts` and by the app."""

from convmem_app.hosts.configure import (
    EditResult,
    HostConfigError,
    HostStatus,
    add,
    remove,
    shim_command,
    status,
    statuses,
)
from convmem_app.hosts.locations import HOST_KEYS, HOSTS, Env, HostSpec

__all__ = [
    "HOSTS",
    "HOST_KEYS",
    "EditResult",
    "Env",
    "HostConfigError",
    "HostSpec",
    "HostStatus",
    "add",
    "remove",
    "shim_command",
    "status",
    "statuses",
]
