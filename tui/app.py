"""appliance-tui: the operator's terminal UI, on the daemon's control API.

Six screens, one per thing an operator does (keys 1-6): the overview, datasets, jobs,
models, serving and the audit log; `?` explains them all. Every screen asks the local
daemon over its control socket with the operator's token ($APPLIANCE_TOKEN, else the
daemon's local admin token) and refreshes itself while shown. One stream of the
daemon's events feeds live job progress and notices. When the daemon goes away the
screens keep their last data, greyed, the status line says since when and what is
wrong, and everything picks up again once it answers. A daemon error is a message,
never a traceback. In a terminal smaller than 80x24 one screen says so instead of
panels cut mid-word.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Protocol

from textual import events, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Static
from textual.worker import Worker, WorkerState

from appliance.core import config
from appliance.core.errors import ApplianceError, DaemonUnreachable, Unauthenticated
from appliance.daemon import client
from tui.screens.audit import AuditScreen
from tui.screens.base import ApplianceScreen
from tui.screens.datasets import DatasetsScreen
from tui.screens.help import HelpScreen
from tui.screens.jobs import JobsScreen
from tui.screens.models import ModelsScreen
from tui.screens.overview import OverviewScreen
from tui.screens.serving import ServingScreen
from tui.widgets import Connection

RETRY_S = 2.0  # how soon the event stream asks again after the daemon went away
MIN_SIZE = (80, 24)  # the smallest terminal every screen and dialog fits


class Daemon(Protocol):
    """What the TUI asks of the daemon: appliance.daemon.client.AsyncClient, or a stand-in in tests."""

    async def get(self, path: str, **params: Any) -> Any: ...

    async def post(self, path: str, body: dict[str, Any] | None = None) -> Any: ...

    async def upload(self, path: Path, options: dict[str, Any], *, to: str = client.DATASETS,
                     content: bytes | None = None) -> Any: ...

    def events(self, after: int = 0, subject: str | None = None) -> AsyncIterator[dict[str, Any]]: ...


class TooSmall(Screen[None]):
    """Shown instead of everything else while the terminal is smaller than MIN_SIZE; gone once it is large enough."""

    BINDINGS: ClassVar = [Binding("q", "app.quit", "Quit")]

    def compose(self) -> ComposeResult:
        yield Static(id="too-small")

    def on_resize(self, event: events.Resize) -> None:
        width, height = MIN_SIZE
        self.query_one("#too-small", Static).update(
            f"The appliance console needs a terminal of at least {width}x{height}; this one is "
            f"{event.size.width}x{event.size.height}.\n\nEnlarge the window (or make its font smaller), "
            "or press q to quit.")


class ApplianceApp(App[None]):
    """The operator's console: every screen reads and changes the appliance through its daemon."""

    TITLE = "appliance"
    CSS_PATH = "app.tcss"
    NAVIGATION: ClassVar[tuple[type[ApplianceScreen], ...]] = (
        OverviewScreen, DatasetsScreen, JobsScreen, ModelsScreen, ServingScreen, AuditScreen,
    )
    MODES: ClassVar[dict[str, Any]] = {screen.NAME: screen for screen in NAVIGATION}
    DEFAULT_MODE = OverviewScreen.NAME
    BINDINGS: ClassVar = [
        *(Binding(str(key), f"switch_mode('{screen.NAME}')", screen.TITLE, show=False)
          for key, screen in enumerate(NAVIGATION, start=1)),
        Binding("question_mark,f1", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
    ]

    connection: reactive[Connection] = reactive(Connection.CONNECTING)
    problem: reactive[str] = reactive("")
    answered_at: reactive[datetime | None] = reactive(None)  # when the daemon last answered: what screens show is of then
    open_alerts: reactive[int] = reactive(0)

    def __init__(self, daemon: Daemon | None = None, settings: config.Settings | None = None) -> None:
        super().__init__()
        self.settings = settings or config.load()
        self.daemon: Daemon = daemon or client.AsyncClient(self.settings)
        self.job_progress: dict[str, dict[str, Any]] = {}  # job id -> its latest progress report
        self.event_listeners: list[Callable[[dict[str, Any]], None]] = []

    def on_mount(self) -> None:
        self.follow_events()

    # -- talking to the daemon ---------------------------------------------------------

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None, **params: Any) -> Any:
        """Ask the daemon; whether it answered, and whether it took the token, shows on the status line."""
        asking = {"GET": lambda: self.daemon.get(path, **params), "POST": lambda: self.daemon.post(path, body),
                  "DELETE": lambda: self.daemon.delete(path)}[method]
        return await self._asked(asking())

    async def upload(self, path: Path, options: dict[str, Any], *, to: str = client.DATASETS,
                     content: bytes | None = None) -> Any:
        """Send a local file or folder (or content read from it) for import, to the dataset or model upload route:
        the daemon reads only the bytes it is sent."""
        return await self._asked(self.daemon.upload(path, options, to=to, content=content))

    async def download(self, path: str) -> bytes:
        """Bytes the daemon hands over (an export archive), for this program to write where its user chose."""
        return await self._asked(self.daemon.download(path))

    async def _asked(self, asking: Awaitable[Any]) -> Any:
        try:
            answer = await asking
        except (DaemonUnreachable, Unauthenticated) as exc:
            self._lost(exc)
            raise
        self.connection, self.problem, self.answered_at = Connection.CONNECTED, "", datetime.now()
        return answer

    def report(self, exc: ApplianceError) -> None:
        """A daemon error as a notice; a lost connection or a refused token is on the status line already."""
        if isinstance(exc, (DaemonUnreachable, Unauthenticated)):
            return
        self.notify(exc.message + (f"\nhint: {exc.hint}" if exc.hint else ""), title="error", severity="error",
                    timeout=10)

    def _lost(self, exc: ApplianceError) -> None:
        self.connection = Connection.REFUSED if isinstance(exc, Unauthenticated) else Connection.UNREACHABLE
        self.problem = exc.message + (f"; {exc.hint}" if exc.hint else "")

    @work(exclusive=True, group="events", exit_on_error=False)
    async def follow_events(self) -> None:
        """The daemon's events, for as long as the TUI runs: reconnect after a loss, resume where it stopped."""
        seq: int | None = None
        while True:
            try:
                if seq is None:
                    status = await self.request("GET", "/v1/status")
                    seq, self.open_alerts = status["last_event"], status["open_alerts"]
                async for event in self.daemon.events(after=seq):
                    seq = event["seq"]
                    self._dispatch(event)
            except (DaemonUnreachable, Unauthenticated) as exc:
                self._lost(exc)
            except ApplianceError as exc:
                self.report(exc)
            await asyncio.sleep(RETRY_S)

    def _dispatch(self, event: dict[str, Any]) -> None:
        """Live progress, and notices of what happened; what went wrong comes as an alert, which also stays on the
        Overview until acknowledged."""
        topic, kind, data = event["topic"], event["kind"], event["data"]
        if topic == "job" and kind == "progress":
            self.job_progress[event["subject"]] = data
        elif topic == "job" and kind in ("finished", "failed", "cancelled"):
            self.job_progress.pop(event["subject"], None)
            if kind != "failed":
                self.notify(f"job {event['subject']} {kind}")
        elif topic == "alert":
            self._count_alerts()
            if kind == "raised":
                self.notify(data["message"] + "\n(1: the open alerts)", title=f"alert: {data['source']}",
                            severity="error" if data["severity"] == "error" else "warning", timeout=15)
        elif topic == "deploy" and kind in ("autopilot-promote", "autopilot-retrain"):
            what = (f"promoted {event['subject']}:{data.get('candidate')}" if kind == "autopilot-promote"
                    else f"retraining {event['subject']} (job {data.get('job')})")
            self.notify(f"{what}: {data.get('reason')}", title="autopilot", timeout=15)
        for listener in self.event_listeners:
            listener(event)

    @work(exclusive=True, group="alerts", exit_on_error=False)
    async def _count_alerts(self) -> None:
        try:
            self.open_alerts = (await self.request("GET", "/v1/status"))["open_alerts"]
        except ApplianceError as exc:
            self.report(exc)

    # -- the terminal's size -------------------------------------------------------------

    def on_resize(self, event: events.Resize) -> None:
        width, height = MIN_SIZE
        cramped = event.size.width < width or event.size.height < height
        if cramped and not isinstance(self.screen, TooSmall):
            self.push_screen(TooSmall())
        elif not cramped and isinstance(self.screen, TooSmall):
            self.pop_screen()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Nothing but quitting while the terminal is too small: a screen switched to would not fit."""
        return action == "quit" or not isinstance(self.screen, TooSmall)

    # -- actions and errors ------------------------------------------------------------

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """Ctrl+P finds every screen and every action of the screen in view by name, beside Textual's own."""
        yield from super().get_system_commands(screen)
        for key, shown in enumerate(self.NAVIGATION, start=1):
            yield SystemCommand(f"Show {shown.TITLE}", f"key {key}: {shown.HELP.split('. ')[0]}",
                                partial(self.switch_mode, shown.NAME))
        if isinstance(screen, ApplianceScreen):
            for binding in vars(type(screen)).get("BINDINGS", []):  # the screen's own, not those every screen has
                if binding.show:
                    yield SystemCommand(binding.description, f"key {binding.key} on {screen.TITLE}",
                                        partial(screen.run_action, binding.action))

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.NAVIGATION))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A bug in a background task: say so on screen, keep running (the log has the traceback)."""
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            error = event.worker.error
            self.log.error(f"internal error in {event.worker.name}", error)  # to Textual's devtools, not the screen
            self.notify(f"internal error: {type(error).__name__}: {error}\nhint: this is a bug; the TUI goes on",
                        title="internal error", severity="error", timeout=15)


def main() -> None:
    try:
        ApplianceApp().run()
    except ApplianceError as exc:  # the configuration could not be read: nothing on screen yet
        raise SystemExit(f"error: {exc.message}" + (f"\n  hint: {exc.hint}" if exc.hint else "")) from None
