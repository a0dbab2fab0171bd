"""What every screen of the TUI shares: the navigation bar, the status line, the footer, and reloading.

A screen says what it shows (compose_body) and how to fetch it (load); it is reloaded
when it comes to the front and every REFRESH_S seconds while it stays there. An error
from the daemon becomes a notice (the app decides how), never a traceback.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, ClassVar

from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer
from textual.worker import Worker

from appliance.core.errors import ApplianceError
from tui.widgets import Connection, NavBar, StatusLine

if TYPE_CHECKING:
    from tui.app import ApplianceApp


class ApplianceScreen(Screen[None]):
    """One of the TUI's top-level screens (a mode, in Textual's terms)."""

    NAME: ClassVar[str]  # the mode's name, as the app and the navigation bar know it
    TITLE: ClassVar[str]
    HELP: ClassVar[str]  # what an operator does here, for the help screen
    REFRESH_S: ClassVar[float] = 2.0

    app: ApplianceApp  # type: ignore[assignment]

    def compose(self) -> ComposeResult:
        yield NavBar(self.NAME)
        with Vertical(id="body"):
            yield from self.compose_body()
        yield StatusLine(id="status")
        yield Footer()

    def compose_body(self) -> ComposeResult:
        raise NotImplementedError

    async def load(self) -> None:
        """Fetch what the screen shows and show it; may raise ApplianceError."""

    def on_mount(self) -> None:
        self._loading: Worker[None] | None = None
        self.set_interval(self.REFRESH_S, self._tick)
        self.watch(self.app, "connection", self._grey_when_stale)

    def _grey_when_stale(self, connection: Connection) -> None:
        """What the daemon said last, greyed while it cannot be asked again (the status line says since when)."""
        self.query_one("#body").set_class(connection.trouble, "stale")

    def on_screen_resume(self) -> None:
        self._loading = self.reload()

    def _tick(self) -> None:
        """Reload while shown; a load still under way (a slow daemon) is left to finish rather than restarted."""
        if self.is_current and not (self._loading and self._loading.is_running):
            self._loading = self.reload()

    @work(exclusive=True, group="reload", exit_on_error=False)
    async def reload(self) -> None:
        await self.reported(self.load())

    async def reported(self, fetch: Awaitable[None]) -> None:
        """Run a fetch; a daemon error is a notice (or the status line), the screen keeps what it shows."""
        try:
            await fetch
        except ApplianceError as exc:
            self.app.report(exc)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self.app.on_worker_state_changed(event)
