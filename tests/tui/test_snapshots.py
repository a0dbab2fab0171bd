"""Every screen and dialog as an operator sees it, at 80x24 (the least the TUI promises) and 120x40, held against
reviewed SVG snapshots.

A change in layout fails here; if the new look is right, accept it with `pytest --snapshot-update tests/tui`
and review the SVGs in the diff.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input

from appliance.core.errors import DaemonUnreachable
from tests.tui.conftest import RECORDED_STUDY, SIZE
from tui.app import ApplianceApp
from tui.screens.search import SearchDialog


async def _loaded(pilot: Any) -> None:
    """Every fetch has landed. The event streams stay open (the app's, and a job's log while its last event has not
    come), and so does a DirectoryTree's loader (Textual's own "_loader" group): none of them counts."""
    streams = ("events", "job-log", "_loader")
    while any(worker.is_running and worker.group not in streams for worker in pilot.app.workers):
        await pilot.pause(0.05)
    await pilot.pause(0.2)


SIZES = pytest.mark.parametrize("size", [SIZE, (120, 40)], ids=["80x24", "120x40"])


@SIZES
@pytest.mark.parametrize("key", ["1", "2", "3", "4", "5", "6"])
def test_each_screen(snap_compare: Any, recorded_app: ApplianceApp, key: str, size: tuple[int, int]) -> None:
    async def show(pilot: Any) -> None:
        await pilot.press(key)
        await _loaded(pilot)
        await _loaded(pilot)  # a screen's detail pane follows its table

    assert snap_compare(recorded_app, terminal_size=size, run_before=show)


@SIZES
def test_help(snap_compare: Any, recorded_app: ApplianceApp, size: tuple[int, int]) -> None:
    assert snap_compare(recorded_app, terminal_size=size, press=["question_mark"])


def test_import_problems_are_listed_by_line(snap_compare: Any, recorded_app: ApplianceApp, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tickets.csv").write_text("text,label\n")
    monkeypatch.chdir(tmp_path / "data")  # the file browser opens here; a fixed name keeps the picture stable

    async def import_a_bad_file(pilot: Any) -> None:
        await pilot.press("2", "i")
        pilot.app.screen.query_one("#path").value = "tickets.csv"  # in the working folder: it is sent
        pilot.app.screen.query_one("#name").value = "tickets"
        await pilot.click("#submit")
        await _loaded(pilot)

    assert snap_compare(recorded_app, terminal_size=SIZE, run_before=import_a_bad_file)


async def _advanced_open(pilot: Any) -> None:
    """Open the dialog's advanced options and Tab to its last field: it scrolls into view, the buttons stay."""
    await _loaded(pilot)
    pilot.app.screen.query_one("Collapsible").collapsed = False
    await pilot.pause()
    fields = [field for field in pilot.app.screen.query("Input, Select, Switch") if field.focusable]
    fields[-1].focus()
    await _loaded(pilot)


@SIZES
def test_import_with_advanced_options(snap_compare: Any, recorded_app: ApplianceApp, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]) -> None:
    monkeypatch.chdir(tmp_path)

    async def open_it(pilot: Any) -> None:
        await pilot.press("2", "i")
        await _advanced_open(pilot)

    assert snap_compare(recorded_app, terminal_size=size, run_before=open_it)


@SIZES
def test_fine_tune_wizard(snap_compare: Any, recorded_app: ApplianceApp, size: tuple[int, int]) -> None:
    async def open_it(pilot: Any) -> None:
        await pilot.press("3", "n")
        await _loaded(pilot)

    assert snap_compare(recorded_app, terminal_size=size, run_before=open_it)


@SIZES
def test_fine_tune_wizard_with_advanced_options(snap_compare: Any, recorded_app: ApplianceApp,
                                                size: tuple[int, int]) -> None:
    async def open_it(pilot: Any) -> None:
        await pilot.press("3", "n")
        await _advanced_open(pilot)

    assert snap_compare(recorded_app, terminal_size=size, run_before=open_it)


@SIZES
@pytest.mark.parametrize("keys", [("4", "d"), ("4", "k"), ("4", "r"), ("4", "x"), ("4", "e"), ("6", "e"), ("3", "l"),
                                  ("3", "c"), ("2", "x")],
                         ids=["deploy", "canary", "rollback", "delete-the-candidate", "export-model", "export", "log",
                              "cancel", "delete-dataset"])
def test_dialog(snap_compare: Any, recorded_app: ApplianceApp, keys: tuple[str, str], size: tuple[int, int]) -> None:
    async def open_it(pilot: Any) -> None:
        await pilot.press(keys[0])
        await _loaded(pilot)
        await _loaded(pilot)
        await pilot.press(keys[1])
        for path in pilot.app.screen.query("#path"):
            path.value = "audit-20260302-140509.jsonl"  # the export's default name has the time in it: pinned
        for field in pilot.app.screen.query(Input):
            field.cursor_blink = False  # else the picture depends on when, in its half-second blink, it is taken
        await _loaded(pilot)

    assert snap_compare(recorded_app, terminal_size=size, run_before=open_it)


@SIZES
def test_search(snap_compare: Any, recorded_app: ApplianceApp, size: tuple[int, int]) -> None:
    async def open_it(pilot: Any) -> None:
        await pilot.press("3")
        await _loaded(pilot)
        pilot.app.push_screen(SearchDialog(RECORDED_STUDY))
        await _loaded(pilot)

    assert snap_compare(recorded_app, terminal_size=size, run_before=open_it)


def test_a_terminal_below_80x24_is_told_so(snap_compare: Any, recorded_app: ApplianceApp) -> None:
    assert snap_compare(recorded_app, terminal_size=(60, 20))


def test_audit_verdict(snap_compare: Any, recorded_app: ApplianceApp) -> None:
    async def verify(pilot: Any) -> None:
        await pilot.press("6")
        await _loaded(pilot)
        await pilot.press("v")
        await _loaded(pilot)

    assert snap_compare(recorded_app, terminal_size=SIZE, run_before=verify)


def test_a_daemon_gone_greys_the_screen_and_says_since_when(snap_compare: Any, recorded_app: ApplianceApp,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    async def lose_it(pilot: Any) -> None:
        await pilot.press("3")
        await _loaded(pilot)
        await _loaded(pilot)
        pilot.app.answered_at = datetime(2026, 3, 2, 14, 5, 9)  # the clock of the last answer, pinned for the picture

        async def gone(*_args: Any, **_kwargs: Any) -> Any:
            raise DaemonUnreachable("the daemon is not reachable: nothing listens on /run/appliance/control.sock",
                                    hint="start it with 'appliance daemon' (or 'systemctl start appliance')")

        monkeypatch.setattr(pilot.app.daemon, "get", gone)
        while not pilot.app.connection.trouble:
            await pilot.pause(0.1)
        await _loaded(pilot)

    assert snap_compare(recorded_app, terminal_size=SIZE, run_before=lose_it)
