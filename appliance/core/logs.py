"""Logging for a service whose stderr goes to journald: one record, one line, one journal entry.

``text`` is for people reading ``journalctl``; ``json`` is for shipping logs to a collector.
Lines below WARNING are written in batches, at most ``FLUSH_S`` after they were logged: the
access log writes a line per inference request, and one write per line cost a loaded server
more than the line's formatting did. A warning or worse goes out at once, with everything
before it, and so does the rest when the process exits.

Neither format says where a line was logged from, nor its thread or process, so `setup` turns
off their gathering as the logging HOWTO's "Optimization" section shows: a record then costs
half as much to make (an access line 7 µs of the event loop's time instead of 16).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

from appliance.core import clock

FORMATS = ("text", "json")
# Libraries that log every request at INFO, drowning the appliance's own lines.
CHATTY = ("uvicorn.access", "httpx")
# Attributes every LogRecord has; anything else on a record came from extra={...}.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}

FLUSH_S = 0.2  # the longest a line below WARNING waits to be written
BATCH_LINES = 256  # or until this many wait

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


class Batched(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes lines below WARNING in batches (see the module's notes).

    A thread of its own writes what waits every FLUSH_S, started by the first line that waits and ended by a round
    that finds none. A stream that cannot be written to loses what waited, as a failed write of logging's own
    handlers loses its line; the caller never hears of it.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._waiting: list[str] = []
        self._writer: threading.Thread | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
        except Exception:  # noqa: BLE001  as logging's own handlers do: report it, never raise into the caller
            self.handleError(record)
            return
        with self.lock:
            self._waiting.append(line)
            urgent = record.levelno >= logging.WARNING or len(self._waiting) >= BATCH_LINES
            if not urgent and (self._writer is None or not self._writer.is_alive()):
                self._writer = threading.Thread(target=self._write_now_and_then, name="log-writer", daemon=True)
                self._writer.start()
        if urgent:
            self.flush()

    def flush(self) -> None:
        with self.lock:
            waiting, self._waiting = "".join(self._waiting), []
            try:
                if waiting:
                    self.stream.write(waiting)
                super().flush()
            except (OSError, ValueError):  # the stream is gone or closed: nowhere to say so either
                pass

    def _write_now_and_then(self) -> None:
        """Write what waits every FLUSH_S; when a round finds nothing, end (the next line starts another)."""
        while True:
            time.sleep(FLUSH_S)
            with self.lock:
                if not self._waiting:
                    self._writer = None
                    return
                self.flush()


def setup(fmt: str = "text", level: int = logging.INFO) -> None:
    """Send every log record to stderr in ``fmt`` ("text" or "json") from ``level`` up.

    Replaces the handler an earlier call installed, so calling it again changes the format
    instead of printing each line twice; handlers others added (pytest's, for one) are kept.
    """
    global _installed
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r}: use one of {', '.join(FORMATS)}")
    logging._srcfile = None  # no caller looked up: sys._getframe walks for each record
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = Batched(sys.stderr)
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
