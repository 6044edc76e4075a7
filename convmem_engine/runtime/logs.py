"""Logging for a headless runtime: everything to stderr (stdout may be the protocol), and never
message content."""

from __future__ import annotations

import logging
import sys
import traceback


class NoContentFilter(logging.Filter):
    """Keep message content out of the log whatever a library logs.

    Exception messages can quote input (pydantic's do), so a logged exception keeps its type
    and traceback frames and loses its message. The SDK's DEBUG records can print whole
    frames, so `mcp.*` is never logged below INFO.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.split(".")[0] == "mcp" and record.levelno < logging.INFO:
            return False
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            frames = "".join(traceback.format_tb(exc.__traceback__))
            head = record.getMessage()
            record.msg = f"{head} [{type(exc).__name__}; message withheld]\n{frames}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


def configure_logging(level: str) -> None:
    """Everything to stderr, without message content."""
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s convmem %(levelname)s %(name)s: %(message)s")
    )
    handler.addFilter(NoContentFilter())
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
