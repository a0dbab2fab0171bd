"""What the service writes to stderr, seen from outside as journald sees it: a fresh process per test."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta

import pytest

from appliance.core import logs


def stderr_lines(code: str) -> list[str]:
    """Run ``code`` after ``import logging; from appliance.core import logs`` and return its stderr lines."""
    result = subprocess.run(
        [sys.executable, "-c", "import logging\nfrom appliance.core import logs\n" + code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,  # the assert below shows stderr when it fails
    )
    assert result.returncode == 0, result.stderr
    return result.stderr.splitlines()


def test_text_lines_carry_the_syslog_priority_and_logger_name() -> None:
    lines = stderr_lines(
        "logs.setup('text', logging.DEBUG)\n"
        "log = logging.getLogger('appliance.demo')\n"
        "log.debug('d'); log.info('serving %d models', 2); log.warning('w'); log.error('e'); log.critical('c')\n"
    )
    assert lines == [
        "<7>appliance.demo: d",
        "<6>appliance.demo: serving 2 models",
        "<4>appliance.demo: w",
        "<3>appliance.demo: e",
        "<2>appliance.demo: c",
    ]


def test_records_below_the_level_are_dropped() -> None:
    lines = stderr_lines("logs.setup()\nlogging.getLogger('a').debug('hidden')\nlogging.getLogger('a').info('shown')\n")
    assert lines == ["<6>a: shown"]


def test_a_traceback_stays_one_text_line() -> None:
    lines = stderr_lines(
        "logs.setup('text')\n"
        "try:\n    1 / 0\nexcept ZeroDivisionError:\n    logging.getLogger('job').exception('step failed')\n"
    )
    assert len(lines) == 1
    assert lines[0].startswith("<3>job: step failed\\nTraceback (most recent call last):\\n")
    assert lines[0].endswith("ZeroDivisionError: division by zero")


def test_json_lines_hold_the_fields_and_extras() -> None:
    lines = stderr_lines(
        "from pathlib import Path\n"
        "logs.setup('json')\n"
        "logging.getLogger('appliance.operations.jobs').warning('job %s slow', 'j1', extra={'job': 'j1', 'step': 3,"
        " 'dir': Path('/var/lib/x')})\n"
    )
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert datetime.fromisoformat(entry.pop("ts")).utcoffset() == timedelta(0)
    assert entry == {
        "level": "WARNING",
        "logger": "appliance.operations.jobs",
        "message": "job j1 slow",
        "job": "j1",
        "step": 3,
        "dir": "/var/lib/x",
    }


def test_a_traceback_goes_in_exc_of_one_json_line() -> None:
    lines = stderr_lines(
        "logs.setup('json')\n"
        "try:\n    1 / 0\nexcept ZeroDivisionError:\n    logging.getLogger('job').exception('step failed')\n"
    )
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert (entry["level"], entry["message"]) == ("ERROR", "step failed")
    assert entry["exc"].startswith("Traceback (most recent call last):")
    assert entry["exc"].endswith("ZeroDivisionError: division by zero")


def test_setup_twice_prints_each_record_once_in_the_latest_format() -> None:
    lines = stderr_lines("logs.setup('text')\nlogs.setup('json')\nlogging.getLogger('a').info('once')\n")
    assert len(lines) == 1 and json.loads(lines[0])["message"] == "once"
    assert stderr_lines("logs.setup()\nlogs.setup()\nlogging.getLogger('a').info('once')\n") == ["<6>a: once"]


def test_request_logs_of_chatty_libraries_are_quieted() -> None:
    lines = stderr_lines(
        "logs.setup()\n"
        "for name in ('uvicorn.access', 'httpx'):\n"
        "    logging.getLogger(name).info('GET / 200')\n"
        "    logging.getLogger(name).warning('slow')\n"
    )
    assert lines == ["<4>uvicorn.access: slow", "<4>httpx: slow"]


def test_an_unknown_format_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="text, json"):
        logs.setup("xml")


def test_lines_below_warning_are_written_in_batches_soon_and_a_warning_at_once_after_them() -> None:
    """A server's access lines go out a batch at a time, never more than FLUSH_S late; nothing is reordered."""
    lines = stderr_lines(
        "import sys, time\n"
        "logs.setup()\n"
        "log = logging.getLogger('a')\n"
        "log.info('first'); log.info('second')\n"
        "sys.stderr.write('right after\\n'); sys.stderr.flush()\n"  # the two lines still wait
        f"time.sleep({logs.FLUSH_S} * 5)\n"
        "sys.stderr.write('a while later\\n'); sys.stderr.flush()\n"  # by now they were written, the process alive
        "log.info('third'); log.warning('now')\n"
        "sys.stderr.write('after the warning\\n'); sys.stderr.flush()\n"
        "log.info('last')\n"  # written at exit
    )
    assert lines == ["right after", "<6>a: first", "<6>a: second", "a while later", "<6>a: third", "<4>a: now",
                     "after the warning", "<6>a: last"]
