"""Export and import: ConvMem JSONL (lossless), Markdown, ChatGPT and Claude exports, and the
MCP reference memory server's memory.json. Over MemoryService; no Qt. See docs/transfer.md."""

from convmem_engine.transfer.exporter import (
    EXPORT_FORMATS,
    ExportCancelled,
    ExportReport,
    export_jsonl,
    export_markdown,
    write_jsonl,
)
from convmem_engine.transfer.importer import FORMATS, ImportReport, run_import
from convmem_engine.transfer.records import ImportFormatError, Skip

__all__ = [
    "EXPORT_FORMATS",
    "FORMATS",
    "ExportCancelled",
    "ExportReport",
    "ImportFormatError",
    "ImportReport",
    "Skip",
    "export_jsonl",
    "export_markdown",
    "run_import",
    "write_jsonl",
]
