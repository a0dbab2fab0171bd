"""Small widgets and formatters every screen shares.

Everything here reads without colour: states are words, meters are `[####------]`,
so the TUI works on a serial console or with NO_COLOR set.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import DataTable, DirectoryTree, Input, Label, Log, Sparkline, Static

from appliance.core import clock
from appliance.core.text import counted, printable


class Connection(enum.Enum):
    """How the TUI stands with the daemon (the status line shows the value)."""

    CONNECTING = "connecting to the daemon"
    """Nothing asked yet."""
    CONNECTED = "connected"
    """The last request was answered."""
    UNREACHABLE = "DAEMON NOT REACHABLE, retrying"
    """Nothing answers on the control socket: the daemon is stopped, starting or restarting."""
    REFUSED = "TOKEN REFUSED"
    """The daemon answers but does not accept the token."""

    @property
    def trouble(self) -> bool:
        """The daemon cannot be asked: what the screens show is as old as its last answer."""
        return self in (Connection.UNREACHABLE, Connection.REFUSED)


class NavBar(Static):
    """The screens and their keys, the current one marked: the map an operator needs first."""

    def __init__(self, current: str) -> None:
        super().__init__(id="nav")
        self.current = current

    def on_mount(self) -> None:
        screens = self.app.NAVIGATION  # type: ignore[attr-defined]
        cells = [f"[reverse] {key} {screen.TITLE} [/reverse]" if screen.NAME == self.current else f" {key} {screen.TITLE} "
                 for key, screen in enumerate(screens, start=1)]
        self.update("│".join(cells) + "│ ? Help")


class StatusLine(Static):
    """The bottom line: how the TUI stands with the daemon; in trouble, since when the data shown is old and why."""

    def on_mount(self) -> None:
        for name in ("connection", "problem", "open_alerts"):
            self.watch(self.app, name, self._show)

    def _show(self, _value: object = None) -> None:
        connection, problem = self.app.connection, self.app.problem  # type: ignore[attr-defined]
        answered, alerts = self.app.answered_at, self.app.open_alerts  # type: ignore[attr-defined]
        since = f" · showing data as of {answered:%H:%M:%S}" if connection.trouble and answered else ""
        waiting = f" · {counted(alerts, 'open alert')} (1 shows them)" if alerts else ""
        self.update(connection.value + since + waiting + (f"\n{problem}" if problem else ""))
        self.set_class(connection.trouble, "trouble")


class Chart(Horizontal):
    """A titled sparkline with its last value written out (the line alone says nothing without colour)."""

    def __init__(self, title: str, id: str) -> None:
        super().__init__(id=id, classes="chart")
        self.title = title

    def compose(self) -> ComposeResult:
        yield Label(self.title, classes="chart-title")
        yield Sparkline([])
        yield Label("-", classes="chart-value")

    def show(self, values: Sequence[float], fmt: str = "{:.3f}") -> None:
        """The values as a line (from two on: one value alone would draw as a full bar), the last written out."""
        self.query_one(Sparkline).data = list(values) if len(values) > 1 else []
        self.query_one(".chart-value", Label).update(fmt.format(values[-1]) if values else "-")


class Table(DataTable):
    """A table refilled from fresh rows on every reload: the cursor stays on its row, and unchanged rows cost nothing.

    What it shows can be narrowed to the rows holding some text (narrow()) and ordered by a column (sort_next());
    both hold across reloads. Numbers sort as numbers ("9" before "10", "5%" before "40%").
    """

    def __init__(self, *columns: str, id: str, cursor: bool = True) -> None:
        super().__init__(id=id, cursor_type="row" if cursor else "none", zebra_stripes=cursor)
        self._column_titles = columns
        self._given: list[tuple[str, tuple[str, ...]]] = []  # every row of the last fill, in its order
        self._filled: list[tuple[str, tuple[str, ...]]] = []  # the rows shown
        self.needle = ""
        self.sort_column: int | None = None  # None: the order the rows came in

    def on_mount(self) -> None:
        self.add_columns(*self._column_titles)

    def fill(self, rows: Iterable[tuple[str, Sequence[Any]]]) -> None:
        """Show these rows, each (key, cells), in order (narrowed and sorted as asked)."""
        self._given = [(key, tuple(str(cell) for cell in cells)) for key, cells in rows]
        self._show()

    def narrow(self, needle: str) -> None:
        """Show only the rows with this text in a cell (any case); empty: every row."""
        self.needle = needle.strip().lower()
        self._show()

    def sort_next(self) -> str:
        """Order by the next column, and after the last one as the rows came; the order now, in words."""
        following = 0 if self.sort_column is None else self.sort_column + 1
        self.sort_column = following if following < len(self._column_titles) else None
        self._show()
        return "as listed" if self.sort_column is None else f"by {self._column_titles[self.sort_column]}"

    def _show(self) -> None:
        shown = [row for row in self._given if not self.needle or any(self.needle in cell.lower() for cell in row[1])]
        if (column := self.sort_column) is not None:
            shown.sort(key=lambda row: _ordinal(row[1][column]))
        if shown == self._filled:
            return
        selected = self.selected
        self.clear()
        for key, cells in shown:
            self.add_row(*(Text(printable(cell)) for cell in cells), key=key)  # what a row holds, never markup
        self._filled = shown
        if selected is not None:
            self.select(selected)

    def select(self, key: str) -> bool:
        """Put the cursor on a row; False when the table has no such row (yet)."""
        if key not in self.rows:
            return False
        self.move_cursor(row=self.get_row_index(key), animate=False)
        return True

    @property
    def selected(self) -> str | None:
        """The key of the row under the cursor; None in an empty table."""
        if not self.row_count:
            return None
        return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value


def _ordinal(cell: str) -> tuple[int, float, str]:
    """A cell's place in an ascending order: numbers (a unit after them ignored) first, by value; then text."""
    number = cell.split(" ")[0].rstrip("%sx")
    try:
        return (0, float(number), "")
    except ValueError:
        return (1, 0.0, cell.lower())


class Files(DirectoryTree):
    """Folders, and the files with one of `suffixes` (what an import takes); plain-text icons, for any terminal."""

    ICON_NODE_EXPANDED = "- "
    ICON_NODE = "+ "
    ICON_FILE = "  "

    def __init__(self, path: Path, suffixes: Iterable[str], **options: Any) -> None:
        self.suffixes = tuple(suffixes)  # before the tree first lists a folder
        super().__init__(path, **options)

    def filter_paths(self, paths: Iterable[Path]) -> Iterable[Path]:
        return [path for path in paths if not path.name.startswith(".")
                and (path.is_dir() or path.suffix.lower() in self.suffixes)]


class TailLog(Log):
    """A log pane that keeps following its last line when the layout shrinks it: Log follows new lines only while
    its view is at the end, and a pane made shorter (a job's details grow as it ends) leaves the view above it."""

    def on_resize(self, _event: events.Resize) -> None:
        if self.auto_scroll:
            self.scroll_end(animate=False, immediate=True, x_axis=False)


class FindBar(Input):
    """The `/` line under a screen's list: what is typed narrows the list at once; Enter keeps it, Esc clears it."""

    BINDINGS: ClassVar = [Binding("escape", "clear", "Clear", show=False)]

    def __init__(self) -> None:
        super().__init__(placeholder="find: type to narrow the list; Enter keeps it, Esc clears it", id="find")
        self.display = False

    def action_clear(self) -> None:
        self.value = ""
        self.display = False
        self.screen.focus_next()


def meter(share: float | None, width: int = 10) -> str:
    """A bar for a share from 0 to 1: [####------]."""
    if share is None:
        return "[" + "?" * width + "]"
    filled = round(max(0.0, min(1.0, share)) * width)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def percent(share: float | None, digits: int = 0) -> str:
    return "-" if share is None else f"{share * 100:.{digits}f}%"


def number(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def ago(stamp: str | None, now: datetime | None = None) -> str:
    """An ISO time as a person reads it in a table: '12:03:45' today, else the date."""
    if not stamp:
        return "-"
    moment = datetime.fromisoformat(stamp).astimezone()
    today = (now or clock.now()).astimezone().date()
    return moment.strftime("%H:%M:%S") if moment.date() == today else moment.strftime("%Y-%m-%d %H:%M")


