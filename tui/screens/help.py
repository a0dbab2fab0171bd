"""The help screen: the keys of every screen and what an operator does there, drawn from the screens themselves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from tui.screens.dialogs import Dialog

if TYPE_CHECKING:
    from tui.screens.base import ApplianceScreen

START = """\
The whole job, start to finish:
  2 Datasets  i imports a CSV of texts and labels
  3 Jobs      n fine-tunes a model on it, optimises and deploys it
  4 Models    compare the variants; d deploy, k canary, r rollback
  5 Serving   requests, latency, errors, drift; t tries a prediction
  6 Audit     v verifies that nobody changed the record
"""


class HelpScreen(Dialog[None]):
    """Every screen's keys and purpose; Escape, q or ? closes it."""

    BINDINGS: ClassVar = [*Dialog.BINDINGS, Binding("q,question_mark,f1", "cancel", "Close")]

    def __init__(self, screens: Sequence[type[ApplianceScreen]]) -> None:
        super().__init__()
        self.screens = screens

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog wide help"):
            yield Static(self._text(), markup=False)

    def _text(self) -> str:
        parts = [START, ("Everywhere: 1-6 switch screens, ? this help, q quit; / narrows the list to the rows "
                         "holding what you type, > sorts it by the next column. Tab moves between fields, Esc "
                         "closes a dialog or leaves a text box, Ctrl+P finds a screen or an action by name.\n")]
        for number, screen in enumerate(self.screens, start=1):
            own = vars(screen).get("BINDINGS", [])  # the screen's own keys, not those every screen inherits
            keys = ", ".join(f"{b.key} {b.description.lower()}" for b in own if b.show)
            parts.append(f"{number} {screen.TITLE}" + (f"  ({keys})" if keys else "") + f"\n  {screen.HELP}\n")
        parts.append("Press Esc to close this help.")
        return "\n".join(parts)
