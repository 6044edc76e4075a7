"""MemoryService: the seven memory operations of seed 000, thread-safe, with change events."""

from convmem_engine.service.budget import result_json
from convmem_engine.service.events import ChangeEvent
from convmem_engine.service.memory_service import MemoryService

__all__ = ["ChangeEvent", "MemoryService", "result_json"]
