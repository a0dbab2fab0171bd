"""Audit: browse and filter the tamper-evident log, verify the chain, export it."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, DataTable, Digits, Input, Label, Static

from appliance.core.errors import ApplianceError
from tui.screens.base import ApplianceScreen
from tui.screens.dialogs import Dialog, FormDialog, fields
from tui.widgets import Table, ago

SHOWN = 500  # the newest records that match; a filter narrows them down


class AuditScreen(ApplianceScreen):
    NAME = "audit"
    TITLE = "Audit"
    HELP = ("Every change the appliance made, who made it and whether it worked, newest first. f goes to the "
            "filters: age (30m, 12h, 7d or a date), actor (user:alice) and action (globs work: model.*), then Enter. "
            "Who read what (api.read) is hidden until r shows it. v verifies the whole hash chain and its signed head, "
            "and says plainly whether anything was changed; e exports the records shown, filters and all, as JSON "
            "lines (admin only).")
    REFRESH_S: ClassVar[float] = 5.0
    BINDINGS: ClassVar = [Binding("v", "verify", "Verify chain"), Binding("e", "export", "Export"),
                          Binding("f", "filter", "Filter"), Binding("r", "reads", "Reads"),
                          Binding("escape", "leave_filters", show=False)]
    AUTO_FOCUS = "#audit"

    def compose_body(self) -> ComposeResult:
        with Horizontal(id="audit-filters"):
            yield Input(placeholder="since, e.g. 7d", id="since")
            yield Input(placeholder="actor, e.g. user:alice", id="actor")
            yield Input(placeholder="action, e.g. model.*", id="action")
        yield Static("", id="audit-shown", markup=False)
        yield Table("seq", "time", "actor", "action", "outcome", "object", id="audit")
        yield Static("", id="audit-detail", classes="detail", markup=False)

    def on_mount(self) -> None:
        super().on_mount()
        self._records: dict[str, dict[str, Any]] = {}
        self._reads = False  # api.read records: who looked at what, shown on r

    def _filters(self) -> dict[str, Any]:
        """What the list shows, as /v1/audit and its export take it."""
        typed = {name: value for name in ("since", "actor", "action")
                 if (value := self.query_one(f"#{name}", Input).value.strip())}
        return {**typed, "reads": self._reads}

    async def load(self) -> None:
        filters = self._filters()
        found = await self.app.request("GET", "/v1/audit", limit=SHOWN, **filters)
        self._records = {str(record["seq"]): record for record in found}
        table = self.query_one(Table)
        following = table.selected is None or table.cursor_row == 0  # on the newest: stay on the newest
        table.fill((str(r["seq"]), (r["seq"], ago(r["ts"]), r["actor"], r["action"], r["outcome"], r["object"]))
                   for r in reversed(found))
        if following and found:
            table.select(str(found[-1]["seq"]))
        self.query_one("#audit-shown", Static).update(
            f"newest first: {len(found)}{'' if len(found) < SHOWN else ' newest'} records; filters: "
            f"{_typed(filters) or 'none'}; "
            + ("reads shown (r hides them)" if self._reads else "reads hidden (r shows them)"))
        if not found:
            self.query_one("#audit-detail", Static).update("no records match these filters")

    @on(Input.Submitted)
    def _filtered(self) -> None:
        self.query_one(Table).focus()
        self.reload()

    @on(DataTable.RowHighlighted)
    def _show_detail(self) -> None:
        record = self._records.get(self.query_one(Table).selected or "")
        if record is not None:
            self.query_one("#audit-detail", Static).update(
                f"#{record['seq']} {record['ts']} {record['actor']} {record['action']} {record['object']}: "
                f"{record['outcome']}\n{json.dumps(record['details'], sort_keys=True)}")

    def action_filter(self) -> None:
        self.query_one("#since", Input).focus()

    def action_leave_filters(self) -> None:
        self.query_one(Table).focus()

    def action_reads(self) -> None:
        self._reads = not self._reads
        self.reload()

    @work(exclusive=True, group="verify", exit_on_error=False)
    async def action_verify(self) -> None:
        self.notify("verifying every record of the chain…", title="audit")
        try:
            result = await self.app.request("POST", "/v1/audit/verify")
        except ApplianceError as exc:
            self.app.report(exc)
            return
        await self.app.push_screen(VerificationResult(result))
        self.reload()

    def action_export(self) -> None:
        def exported(path: str | None) -> None:
            if path is not None:
                self.notify(f"audit log exported to {path}", title="audit")

        self.app.push_screen(ExportDialog(self._filters()), exported)


def _typed(filters: dict[str, Any]) -> str:
    """The filters typed into the Audit screen, in words ("action model.*, since 7d"); empty for none."""
    return ", ".join(f"{name} {value}" for name, value in filters.items() if name != "reads")


class VerificationResult(Dialog[None]):
    """The verdict on the chain, large enough to read from across the room, in words as well as colour."""

    BINDINGS: ClassVar = [*Dialog.BINDINGS, Binding("enter", "cancel", "Close")]

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__()
        self.result = result

    def compose(self) -> ComposeResult:
        ok = self.result["ok"]
        with Vertical(classes="dialog verdict " + ("ok" if ok else "tampered")):
            yield Label("AUDIT LOG VERIFIED: OK" if ok else "AUDIT LOG TAMPERED", classes="verdict-title")
            yield Digits(str(self.result["records"]))
            if ok:
                yield Label("records, every hash, MAC and link intact; the signed head matches the last one")
            else:
                yield Label(f"records intact before the problem: {self.result['problem']}", classes="problem-text")
                if self.result.get("first_bad") is not None:
                    yield Label(f"first bad record: {self.result['first_bad']}")
            yield Button("Close (Enter)", id="close")

    @on(Button.Pressed, "#close")
    def _close(self) -> None:
        self.dismiss(None)


class ExportDialog(FormDialog[str]):
    """Where to write the records the list shows (its filters too); an existing file is never overwritten, and the
    file is the operator's alone. The default is in the home folder, not wherever the TUI was started."""

    def __init__(self, filters: dict[str, Any]) -> None:
        super().__init__("Export the audit log (JSON lines)", "Export")
        self.filters = filters

    def compose_fields(self) -> ComposeResult:
        typed = _typed(self.filters)
        yield Label(f"Records: {'those filtered by ' + typed if typed else 'all'}"
                    + ("" if self.filters["reads"] else ", without reads (api.read)"))
        default = Path.home() / f"audit-{datetime.now():%Y%m%d-%H%M%S}.jsonl"
        yield fields(("File", Input(str(default), id="path")))

    @work(exclusive=True, exit_on_error=False)
    async def submit(self) -> None:
        path = Path(self.query_one("#path", Input).value.strip()).expanduser()
        if path.exists():
            self.show_problem(f"{path} exists already; choose another name")
            return
        try:
            text = await self.app.request("GET", "/v1/audit/export", **self.filters)
        except ApplianceError as exc:
            self.show_error(exc)
            return
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as out:
                out.write(text)
        except OSError as exc:
            self.show_problem(f"cannot write {path}: {exc.strerror}")
            return
        self.dismiss(str(path.resolve()))
