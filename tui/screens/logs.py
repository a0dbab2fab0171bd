"""A job's log: the one stream of its lines, and a full-screen viewer of them with their times."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Label, RichLog, Static

from appliance.core.errors import ApplianceError
from appliance.operations import jobs
from tui.screens.dialogs import Dialog

if TYPE_CHECKING:
    from tui.app import Daemon


async def log_events(daemon: Daemon, job_id: str) -> AsyncIterator[dict[str, Any]]:
    """The job's log events from its first, in order, live while it runs, until its log is whole: at `exited` after
    the event that ended the job (its process's last lines come after that one), or at that event if no process
    ran. A lost daemon ends it early (DaemonUnreachable)."""
    end = jobs.LogEnd()
    async for event in daemon.events(subject=job_id):
        if event["kind"] == "log":
            yield event
        elif end.whole_after(event["kind"]):
            return


class LogViewer(Dialog[None]):
    """Every line of a job's log with its time, the whole terminal for it; live while the job runs."""

    BINDINGS: ClassVar = [*Dialog.BINDINGS, Binding("l,q", "cancel", "Close"), Binding("w", "wrap", "Wrap"),
                          Binding("f", "follow", "Follow")]

    def __init__(self, job_id: str) -> None:
        super().__init__()
        self.job_id = job_id
        self._lines: list[str] = []
        self._wrap, self._follow, self._whole = False, True, False
        self._cut: str | None = None  # why the live log stopped before it was whole

    def compose(self) -> ComposeResult:
        with Vertical(id="log-viewer"):
            yield Label(f"Log of job {self.job_id}", classes="title")
            yield RichLog(id="log-lines", markup=False, highlight=False, wrap=False, auto_scroll=True)
            yield Static("", id="log-state", markup=False)

    def on_mount(self) -> None:
        self._show_state()
        self._read()

    @work(exclusive=True, group="job-log", exit_on_error=False)
    async def _read(self) -> None:
        try:
            async for event in log_events(self.app.daemon, self.job_id):
                moment = datetime.fromisoformat(event["ts"]).astimezone()
                line = f"{moment:%H:%M:%S}  {event['data']['line']}"
                self._lines.append(line)
                self.query_one(RichLog).write(line, scroll_end=self._follow)
            self._whole = True
        except ApplianceError as exc:  # refused (too many streams open) or cut: said, not left as "live"
            self._cut = exc.message
            self.app.report(exc)
        self._show_state()

    def action_wrap(self) -> None:
        """Long lines wrapped, or cut at the edge (scroll sideways): the lines are written again either way."""
        self._wrap = not self._wrap
        shown = self.query_one(RichLog)
        shown.wrap = self._wrap
        shown.clear()
        for line in self._lines:
            shown.write(line, scroll_end=self._follow)
        self._show_state()

    def action_follow(self) -> None:
        self._follow = not self._follow
        self.query_one(RichLog).auto_scroll = self._follow
        self._show_state()

    def _show_state(self) -> None:
        reading = ("the whole log" if self._whole else f"interrupted: {self._cut}" if self._cut
                   else "live, as the job writes it")
        follow, wrap = ("on" if self._follow else "off"), ("on" if self._wrap else "off")
        self.query_one("#log-state", Static).update(f"{reading} · f: follow {follow} · w: wrap {wrap} · Esc: close")
