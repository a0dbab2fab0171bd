"""The `appliance` command.

Each command module adds its group to the root group in base.py, loads the
settings, calls one thing and prints its result. main() is the one place that turns
an ApplianceError into a message and an exit code (0 ok, 1 failed, 2 usage).
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import sys
from typing import NoReturn

import click

from appliance.cli import (  # noqa: F401  registers the command groups
    alerts,
    audit,
    backup,
    compliance,
    daemon,
    data,
    doctor,
    feedback,
    hw,
    jobs,
    keys,
    models,
    optimize,
    privacy,
    quickstart,
    serve,
    store,
    tokens,
    train,
    tui,
    tune,
    usage,
    users,
)
from appliance.cli.base import cli
from appliance.core.errors import ApplianceError, StoreFull
from appliance.core.text import printable
from appliance.store import db as store_db

__all__ = ["cli", "main"]


def main() -> None:
    """Entry point: run the command, turn errors into messages and exit codes."""
    os.umask(0o077)  # whatever the appliance writes (logs, pid, exports, keys) is its user's alone unless made shared
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    try:
        cli.main(prog_name="appliance", standalone_mode=False)
    except ApplianceError as exc:
        _report(exc)
    except sqlite3.DatabaseError as exc:  # a damaged database file or a full disk is the disk's doing; any other, a bug
        _report(disk) if (disk := store_db.disk_error(exc)) is not None else _internal(exc)
    except click.exceptions.Abort as exc:  # a question answered no, or Ctrl-C (click's Abort from KeyboardInterrupt)
        click.echo("aborted", err=True)
        sys.exit(130 if isinstance(exc.__cause__, KeyboardInterrupt) else 1)
    except UnicodeEncodeError as exc:  # bytes typed in a terminal not set to UTF-8 reach Python as surrogates
        if "surrogates not allowed" not in str(exc) or os.environ.get("APPLIANCE_DEBUG"):
            _internal(exc)
        click.echo("error: a value given is not UTF-8 text", err=True)
        click.echo("  hint: type it again in a terminal set to UTF-8 ('locale' shows the setting)", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except OSError as exc:  # a path this machine does not let the command use: named, with what to check
        if exc.errno in (errno.ENOSPC, errno.EDQUOT) and not os.environ.get("APPLIANCE_DEBUG"):
            _report(StoreFull(f"no space left on the disk{f' for {exc.filename}' if exc.filename else ''}",
                              hint=store_db.FULL_HINT))
        if exc.filename is None or os.environ.get("APPLIANCE_DEBUG"):
            _internal(exc)
        click.echo(f"error: cannot use {exc.filename}: {exc.strerror}", err=True)
        click.echo(f"  hint: {_PATH_HINTS.get(type(exc), _PATH_HINTS[OSError])}", err=True)
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 (a bug: said so, or raised again under APPLIANCE_DEBUG)
        _internal(exc)


_A_FILE_FOR_A_FOLDER = ("a file stands where a folder should be: check APPLIANCE_STATE_DIR and the paths in the"
                        " configuration")
_PATH_HINTS = {
    PermissionError: "this user may not use it: run the command as the appliance's user (sudo -u appliance), or fix"
                     " its owner and mode",
    NotADirectoryError: _A_FILE_FOR_A_FOLDER,
    FileExistsError: _A_FILE_FOR_A_FOLDER,
    FileNotFoundError: "the folder it should be in does not exist: create it, or give another path",
    OSError: "check the path, the disk, and that this user may use it",
}


def _report(exc: ApplianceError) -> NoReturn:
    click.echo(f"error: {_shown(exc.message)}", err=True)
    if exc.hint:
        click.echo(f"  hint: {_shown(exc.hint)}", err=True)
    sys.exit(1)


def _shown(text: str, longest: int = 500) -> str:
    """A message as a terminal may show it: what a user typed into it (a name, a ref) can hold escape sequences or
    run to thousands of characters, so each line is printable and bounded."""
    return "\n".join(printable(line if len(line) <= longest else line[:longest] + "...") for line in text.split("\n"))


def _internal(exc: BaseException) -> NoReturn:
    """A bug: said plainly, the traceback kept for whoever debugs it (APPLIANCE_DEBUG=1)."""
    if os.environ.get("APPLIANCE_DEBUG"):
        raise exc
    click.echo(f"internal error: {type(exc).__name__}: {exc}", err=True)
    click.echo("  hint: this is a bug; run again with APPLIANCE_DEBUG=1 for the traceback", err=True)
    sys.exit(1)
