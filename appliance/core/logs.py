"""Logging for a service whose stderr goes to journald: one record, one line, one journal entry.

``text`` is for people reading ``journalctl``; ``json`` is for shipping logs to a collector.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from appliance.core import clock

FORMATS = ("text", "json")
# Libraries that log every request at INFO, drowning the appliance's own lines.
CHATTY = ("uvicorn.access", "httpx")
# Attributes every LogRecord has; anything else on a record came from extra={...}.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}

_installed: logging.Handler | None = None  # the handler the last setup() added to the root logger


class JournalFormatter(logging.Formatter):
    """``<priority>logger: message``, with the syslog priority journald reads from the line's prefix.

    Newlines are escaped as a literal ``\\n`` rather than indented: journald splits its stdout
    stream on every newline, so an indented continuation line would still become an entry of
    its own, without the priority prefix, and a traceback would be torn apart.
    """

    def __init__(self) -> None:
        super().__init__("%(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return f"<{_priority(record.levelno)}>" + super().format(record).replace("\n", "\\n")


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ts, level, logger, message, the record's extra fields and exc.

    Fields from ``extra`` come first, so one named like a fixed field cannot forge it; values JSON
    cannot hold are written with str().
    """

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {key: value for key, value in vars(record).items() if key not in _STANDARD}
        entry |= {
            "ts": clock.stamp(datetime.fromtimestamp(record.created, UTC)),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup(fmt: str = "text", level: int = logging.INFO) -> None:
    """Send every log record to stderr in ``fmt`` ("text" or "json") from ``level`` up.

    Replaces the handler an earlier call installed, so calling it again changes the format
    instead of printing each line twice; handlers others added (pytest's, for one) are kept.
    """
    global _installed
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r}: use one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JournalFormatter() if fmt == "text" else JsonFormatter())
    root = logging.getLogger()
    if _installed is not None:
        root.removeHandler(_installed)
    root.addHandler(handler)
    root.setLevel(level)
    _installed = handler
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.WARNING)


def _priority(levelno: int) -> int:
    """The syslog priority for a logging level: crit 2, err 3, warning 4, info 6, debug 7."""
    for threshold, priority in ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6)):
        if levelno >= threshold:
            return priority
    return 7
