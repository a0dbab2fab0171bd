"""Dialogs over a screen: a yes/no confirmation, and the bases every dialog and form shares."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, ClassVar, TypeVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Button, Input, Label, Select, Static
from textual.worker import Worker

from appliance.core.errors import ApplianceError

if TYPE_CHECKING:
    from tui.app import ApplianceApp

T = TypeVar("T")


class Dialog(ModalScreen[T]):
    """A modal form: Escape closes it with no answer; errors are shown inside it, where the operator looks."""

    BINDINGS: ClassVar = [Binding("escape", "cancel", "Cancel")]

    app: ApplianceApp  # type: ignore[assignment]

    def action_cancel(self) -> None:
        self.dismiss(None)

    def show_problem(self, text: str) -> None:
        """Say what went wrong in the dialog's problem box (the dialog stays open, so nothing typed is lost)."""
        problem = self.query_one("#problem", Static)
        problem.update(text)
        problem.display = bool(text)

    def show_error(self, exc: ApplianceError) -> None:
        """An error's message and hint in the problem box."""
        self.show_problem(exc.message + (f"\n{exc.hint}" if exc.hint else ""))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self.app.on_worker_state_changed(event)


def fields(*labelled: tuple[str, Widget]) -> Horizontal:
    """One row of a form: each field after its label."""
    return Horizontal(*(part for label, field in labelled for part in (Label(label, classes="field"), field)),
                      classes="row")


class FormDialog(Dialog[T]):
    """A title, fields, a problem box, and two buttons: the action (or Enter in a field) and Cancel.

    The fields scroll within the dialog and the problem box has its own share of the
    height, so in a short terminal (80x24 with the advanced options open) the buttons
    and the problem stay in view, and Tab scrolls to the field it reaches.
    """

    def __init__(self, heading: str, action: str, *, variant: str = "primary", wide: bool = False) -> None:
        super().__init__()
        self.heading, self.action, self.variant, self.wide = heading, action, variant, wide

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide" if self.wide else "dialog"):
            yield Label(self.heading, classes="title")
            with VerticalScroll(classes="form", can_focus=False):  # Tab goes to its fields, not to it
                yield from self.compose_fields()
            with VerticalScroll(id="problem-box"):
                yield Static("", id="problem", markup=False)
            with Horizontal(classes="buttons"):
                yield Button(self.action, id="submit", variant=self.variant)  # type: ignore[arg-type]
                yield Button("Cancel (Esc)", id="cancel")

    def compose_fields(self) -> ComposeResult:
        raise NotImplementedError

    def on_mount(self) -> None:
        self.show_problem("")

    @on(Button.Pressed, "#cancel")
    def _cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#submit")
    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.submit()

    def submit(self) -> None:
        """Check the fields and act on them; a problem goes to show_problem and the form stays open."""
        raise NotImplementedError

    async def send_and_dismiss(self, sending: Awaitable[T]) -> None:
        """Await what the form sends with its button off: dismissed with the answer, or the error shown and the form
        left open with what was typed."""
        button = self.query_one("#submit", Button)
        button.disabled = True
        try:
            answer = await sending
        except ApplianceError as exc:
            self.show_error(exc)
            return
        finally:
            button.disabled = False
        self.dismiss(answer)

    async def offer_datasets(self, task: str | None = None) -> None:
        """The dataset versions (of one task) in the form's #dataset select, newest first and chosen; where there
        are none, the form says how to get one."""
        try:
            found = await self.app.request("GET", "/v1/datasets")
        except ApplianceError as exc:
            self.show_problem(exc.message)
            return
        select = self.query_one("#dataset", Select)
        newest = sorted((version for version in found if version["erased_at"] is None and task in (None, version["task"])),
                        key=lambda version: version["created_at"], reverse=True)
        select.set_options((f"{v['ref']} ({v['examples']} examples)", v["ref"]) for v in newest)
        if newest:
            select.value = newest[0]["ref"]
        else:
            self.show_problem("no datasets yet: import one on the Datasets screen (2, then i)")


class Confirm(Dialog[bool]):
    """A question with a yes and a no: for what cannot simply be undone, or changes what users get; with the
    command that does the same from a shell, for scripts and runbooks."""

    BINDINGS: ClassVar = [*Dialog.BINDINGS, Binding("y", "answer(True)", "Yes"), Binding("n", "answer(False)", "No")]

    def __init__(self, question: str, yes: str = "Yes", command: str | None = None) -> None:
        super().__init__()
        self.question, self.yes, self.command = question, yes, command

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question, classes="question")
            if self.command:
                yield Label(f"From a shell: {self.command}", classes="command")
            with Horizontal(classes="buttons"):
                yield Button(f"{self.yes} (y)", id="yes", variant="warning")
                yield Button("No (n)", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
