"""A tune job's hyperparameter search: its trials ranked, a trial's learning curve, what mattered most.

Opened from the Jobs screen (s on a tune job); it asks the daemon again every REFRESH_S
seconds while open, so a running search fills in trial by trial.
"""

from __future__ import annotations

from typing import Any, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, DataTable, Label, Static

from appliance.core.errors import ApplianceError
from appliance.core.text import counted, duration
from tui.screens.dialogs import Dialog
from tui.widgets import Chart, Table, meter

REFRESH_S = 2.0
# The parameters every text search varies, in the table's order (the rest are in the trial's summary line).
COLUMNS = {"learning_rate": "lr", "batch_size": "batch", "max_length": "len", "lora": "lora"}


class SearchDialog(Dialog[None]):
    """The search behind one tune job (the study shares the job's id)."""

    BINDINGS: ClassVar = [*Dialog.BINDINGS, Binding("s", "cancel", "Close")]

    def __init__(self, study_id: str) -> None:
        super().__init__()
        self.study_id = study_id
        self._trials: dict[str, dict[str, Any]] = {}  # trial number -> the trial, as the daemon gave it
        self._metric = "metric"

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="search"):
            yield Label(f"Search {self.study_id}", classes="title")
            yield Static("loading…", id="search-summary", markup=False)
            yield Table("rank", "trial", "state", "metric", "epochs", *COLUMNS.values(), id="trials")
            yield Static("", id="trial-params", markup=False)
            yield Chart("curve", id="trial-curve")
            yield Static("", id="importances", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Close (Esc)", id="close")

    def on_mount(self) -> None:
        self.load()
        self.set_interval(REFRESH_S, self.load)

    @work(exclusive=True, group="search", exit_on_error=False)
    async def load(self) -> None:
        try:
            study = await self.app.request("GET", f"/v1/studies/{self.study_id}")
        except ApplianceError as exc:  # a queued job has no search yet
            self.query_one("#search-summary", Static).update(exc.message)
            return
        self._metric = study["metric"]
        self._trials = {str(trial["number"]): trial for trial in study["trials"]}
        self.query_one("#search-summary", Static).update(_summary(study))
        self.query_one(Table).fill((str(trial["number"]), _row(rank, trial))
                                   for rank, trial in enumerate(study["trials"], 1))
        self.query_one("#importances", Static).update(_importances(study["importances"]))
        self._show_trial()

    @on(DataTable.RowHighlighted)
    def _show_trial(self) -> None:
        """The highlighted trial (the best, at first): every value it tried, and its metric by epoch."""
        trial = self._trials.get(self.query_one(Table).selected or "")
        if trial is None:
            return
        values = ", ".join(f"{name} {_cell(value)}" for name, value in trial["params"].items())
        self.query_one("#trial-params", Static).update(
            f"trial {trial['number']}: {values}" + (f" ({trial['note']})" if trial["note"] else ""))
        curve = self.query_one(Chart)
        curve.query_one(".chart-title", Label).update(f"trial {trial['number']}")
        curve.show([epoch["metrics"][self._metric] for epoch in trial["epochs"]], "{:.4f}")

    @on(Button.Pressed, "#close")
    def _close(self) -> None:
        self.dismiss(None)


def _summary(study: dict[str, Any]) -> str:
    states = [trial["state"] for trial in study["trials"]]
    return (f"{study['status']}, {study['metric']}, {duration(study['spent_s'])} of "
            f"{duration(study['budget_s'])}: {counted(len(states), 'trial')}, {states.count('pruned')} pruned, "
            f"{states.count('refused')} refused")


def _row(rank: int, trial: dict[str, Any]) -> tuple[Any, ...]:
    value = f"{trial['value']:.4f}" if trial["value"] is not None else "-"
    planned = trial["params"].get("epochs")
    ran = f"{len(trial['epochs'])}/{planned}" if planned else str(len(trial["epochs"]))
    return (rank, trial["number"], trial["state"], value, ran,
            *(_cell(trial["params"].get(name)) for name in COLUMNS))


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _importances(shares: dict[str, float]) -> str:
    if not shares:
        return "importance: shown once two trials have finished with different results"
    top = sorted(shares.items(), key=lambda item: -item[1])[:3]
    return "importance: " + "  ".join(f"{name} {meter(share, 5)} {share:.2f}" for name, share in top)
