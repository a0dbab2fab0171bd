"""The main screens as an operator sees them at 80x24, held against reviewed SVG snapshots.

A change in layout fails here; if the new look is right, accept it with `pytest --snapshot-update tests/tui`
and review the SVGs in the diff.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.tui.conftest import SIZE
from tui.app import ApplianceApp


async def _loaded(pilot: Any) -> None:
    """Every fetch has landed. The event streams stay open (the app's, and a job's log while its last event has not
    come), and so does a DirectoryTree's loader (Textual's own "_loader" group): none of them counts."""
    streams = ("events", "job-log", "_loader")
    while any(worker.is_running and worker.group not in streams for worker in pilot.app.workers):
        await pilot.pause(0.05)
    await pilot.pause(0.2)


@pytest.mark.parametrize("key", ["1", "2", "3", "4", "5", "6"])
def test_each_screen(snap_compare: Any, recorded_app: ApplianceApp, key: str) -> None:
    async def show(pilot: Any) -> None:
        await pilot.press(key)
        await _loaded(pilot)
        await _loaded(pilot)  # a screen's detail pane follows its table

    assert snap_compare(recorded_app, terminal_size=SIZE, run_before=show)


def test_help(snap_compare: Any, recorded_app: ApplianceApp) -> None:
    assert snap_compare(recorded_app, terminal_size=SIZE, press=["question_mark"])


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


def test_fine_tune_wizard(snap_compare: Any, recorded_app: ApplianceApp) -> None:
    async def open_it(pilot: Any) -> None:
        await pilot.press("3", "n")
        await _loaded(pilot)

    assert snap_compare(recorded_app, terminal_size=SIZE, run_before=open_it)


def test_audit_verdict(snap_compare: Any, recorded_app: ApplianceApp) -> None:
    async def verify(pilot: Any) -> None:
        await pilot.press("6")
        await _loaded(pilot)
        await pilot.press("v")
        await _loaded(pilot)

    assert snap_compare(recorded_app, terminal_size=SIZE, run_before=verify)
