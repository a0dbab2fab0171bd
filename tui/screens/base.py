"""What every screen of the TUI shares: the navigation bar, the status line, the footer, and reloading.

A screen says what it shows (compose_body) and how to fetch it (load); it is reloaded
when it comes to the front and every REFRESH_S seconds while it stays there. An error
from the daemon becomes a notice (the app decides how), never a traceback.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar

from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer, Input
from textual.worker import Worker

from appliance.core.errors import ApplianceError
from tui.screens.dialogs import Confirm
from tui.widgets import Connection, FindBar, NavBar, StatusLine, Table

if TYPE_CHECKING:
    from tui.app import ApplianceApp

COMPACT_BELOW = 100  # columns


class ApplianceScreen(Screen[None]):
    """One of the TUI's top-level screens (a mode, in Textual's terms)."""

    NAME: ClassVar[str]  # the mode's name, as the app and the navigation bar know it
    TITLE: ClassVar[str]
    HELP: ClassVar[str]  # what an operator does here, for the help screen
    REFRESH_S: ClassVar[float] = 2.0

    app: ApplianceApp  # type: ignore[assignment]

    # Every screen's, so the footer leaves them to the help and shows the screen's own keys.
    BINDINGS: ClassVar = [Binding("slash", "find", "Find", show=False),
                          Binding("greater_than_sign", "sort", "Sort", show=False)]

    def compose(self) -> ComposeResult:
        yield NavBar(self.NAME)
        with Vertical(id="body"):
            yield from self.compose_body()
        yield FindBar()
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

    # -- the list: find and sort -----------------------------------------------------------

    def _list(self) -> Table | None:
        """The screen's main list: its first table."""
        return self.query(Table).first() if self.query(Table) else None

    def action_find(self) -> None:
        bar = self.query_one(FindBar)
        bar.display = True
        bar.focus()

    @on(Input.Changed, "#find")
    def _narrowed(self, event: Input.Changed) -> None:
        if (table := self._list()) is not None:
            table.narrow(event.value)

    @on(Input.Submitted, "#find")
    def _kept(self) -> None:
        if (table := self._list()) is not None:
            table.focus()

    def action_sort(self) -> None:
        if (table := self._list()) is not None:
            self.notify(f"sorted {table.sort_next()} (> for the next column)", timeout=3)

    def on_resize(self, event: events.Resize) -> None:
        """Below 100 columns the key hints close up, so every one of them fits in 80."""
        self.query_one(Footer).compact = event.size.width < COMPACT_BELOW

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

    # -- changes: asked first, sent, told ---------------------------------------------------

    def confirm_and_send(self, question: Confirm, method: str, path: str, done: Callable[[Any], str],
                         body: dict[str, Any] | None = None) -> None:
        """Ask first; on yes, send() the request."""
        def answered(yes: bool | None) -> None:
            if yes:
                self.send(method, path, done, body)

        self.app.push_screen(question, answered)

    @work(exit_on_error=False)
    async def send(self, method: str, path: str, done: Callable[[Any], str], body: dict[str, Any] | None = None) -> None:
        """Ask the daemon to change something; say what it did (done(answer)) or why not, and show the result."""
        try:
            answer = await self.app.request(method, path, body)
        except ApplianceError as exc:
            self.app.report(exc)
            return
        self.notify(done(answer))
        self.reload()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self.app.on_worker_state_changed(event)
