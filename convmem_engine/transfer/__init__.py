"""Export and import (ConvMem JSONL, Markdown, ChatGPT and Claude exports, the MCP reference
memory server's memory.json), backups, and the repair of a log damaged by a power cut. Over
MemoryService and Store; no Qt. See docs/transfer.md."""

from convmem_engine.transfer.backup import (
    BackupCancelled,
    BackupError,
    BackupInfo,
    create_backup,
    default_backup_dir,
    list_backups,
    prune_backups,
    restore_backup,
    verify_backup,
)
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
from convmem_engine.transfer.repair import (
    RepairError,
    RepairReport,
    damaged_log_offset,
    looks_like_a_power_cut,
    repair_store,
)

__all__ = [
    "EXPORT_FORMATS",
    "FORMATS",
    "BackupCancelled",
    "BackupError",
    "BackupInfo",
    "ExportCancelled",
    "ExportReport",
    "ImportFormatError",
    "ImportReport",
    "RepairError",
    "RepairReport",
    "Skip",
    "create_backup",
    "damaged_log_offset",
    "default_backup_dir",
    "export_jsonl",
    "export_markdown",
    "list_backups",
    "looks_like_a_power_cut",
    "prune_backups",
    "repair_store",
    "restore_backup",
    "run_import",
    "verify_backup",
    "write_jsonl",
]
