"""The operator's terminal UI (appliance-tui).

For now it shows the store: where it is, what it holds, and whether the audit log
verifies. Screens for datasets, jobs, models and serving join it as those parts of
the appliance arrive.
"""

from __future__ import annotations

import os

from textual import work
from textual.app import App, ComposeResult
from textual.widgets import Footer, Header, Static

from appliance import config, store
from appliance.errors import ApplianceError
from appliance.store import audit, lifecycle


class ApplianceApp(App[None]):
    """Read-only overview of the local store."""

    TITLE = "appliance"
    BINDINGS = [("q", "quit", "Quit"), ("r", "refresh", "Refresh")]

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("loading…", id="store")
        yield Static("", id="audit")
        yield Footer()

    def on_mount(self) -> None:
        self.action_refresh()

    @work(thread=True, exclusive=True)
    def action_refresh(self) -> None:
        try:
            with store.open(config.load(), os.environ.get("APPLIANCE_PASSPHRASE")) as opened:
                details = lifecycle.info(opened)
                result = audit.verify(opened)
        except ApplianceError as exc:
            message = f"error: {exc.message}" + (f"\nhint: {exc.hint}" if exc.hint else "")
            self.call_from_thread(self.query_one("#store", Static).update, message)
            return
        lines = "\n".join(f"{name:16} {value}" for name, value in details.items())
        verdict = (
            f"Audit log OK: {result.records} records"
            if result.ok
            else f"AUDIT LOG TAMPERED: {result.problem}"
        )
        self.call_from_thread(self.query_one("#store", Static).update, lines)
        self.call_from_thread(self.query_one("#audit", Static).update, verdict)


def main() -> None:
    ApplianceApp().run()
