"""Jobs: the queue, a running job's live progress, its loss and accuracy by epoch and its log; new fine-tunes
and hyperparameter searches, and a search's ranked trials."""

from __future__ import annotations

from typing import Any, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import (
    Collapsible,
    DataTable,
    Input,
    Label,
    ProgressBar,
    Select,
    Static,
    Switch,
)
from textual.worker import Worker

from appliance.core import schema
from appliance.core.errors import ApplianceError
from appliance.operations import jobs, jobspec
from appliance.train.params import TrainParams
from tui.screens.base import ApplianceScreen
from tui.screens.dialogs import Confirm, FormDialog, fields
from tui.screens.logs import LogViewer, log_events
from tui.screens.search import SearchDialog
from tui.widgets import Chart, Table, TailLog, ago

LOG_TAIL = 200


class JobsScreen(ApplianceScreen):
    NAME = "jobs"
    TITLE = "Jobs"
    HELP = ("The job queue, newest first. n starts a new fine-tune (dataset, base model, sensible defaults; "
            "advanced options are folded away), optionally optimised and deployed when it ends; with a search "
            "budget it searches hyperparameters for that many minutes instead, and its best trial becomes the "
            "model. The highlighted job shows its live progress, loss and validation accuracy by epoch, and its "
            "log; l opens the whole log full screen, with times, wrapped or not, followed live. s shows a search's "
            "trials ranked, their learning curves and what mattered most; c cancels a job (a running job "
            "checkpoints first); x deletes an ended job's record and log.")
    REFRESH_S: ClassVar[float] = 1.0
    BINDINGS: ClassVar = [Binding("n", "new", "New fine-tune"), Binding("l", "log", "Log"),
                          Binding("s", "search", "Search"), Binding("c", "cancel_job", "Cancel"),
                          Binding("x", "delete_job", "Delete")]

    def compose_body(self) -> ComposeResult:
        yield Table("job", "kind", "status", "stage", "submitted", "by", id="jobs")
        with Vertical(id="job-detail", classes="detail"):
            yield Static("", id="job-summary", markup=False)
            with Horizontal(id="job-progress"):
                yield ProgressBar(total=1, show_eta=False, id="job-bar")
                yield Label("", id="job-step")
            with Horizontal(id="job-charts"):
                yield Chart("loss", id="loss-chart")
                yield Chart("val acc", id="accuracy-chart")
            yield TailLog(id="job-log", max_lines=LOG_TAIL, auto_scroll=True)

    def on_mount(self) -> None:
        super().on_mount()
        self._jobs: dict[str, dict[str, Any]] = {}
        self._log_job: str | None = None  # whose log the pane shows, whether it is all there, who follows it
        self._log_complete = False
        self._log_follower: Worker[None] | None = None
        self._to_select: str | None = None  # a job just submitted, to show as soon as it is listed
        self.app.event_listeners.append(self._on_event)

    async def load(self) -> None:
        found = await self.app.request("GET", "/v1/jobs")
        self._jobs = {job["id"]: job for job in found}
        table = self.query_one(Table)
        table.fill((job["id"], _row(job)) for job in found)
        if self._to_select and table.select(self._to_select):
            self._to_select = None
        await self._show_selected()

    def _on_event(self, event: dict[str, Any]) -> None:
        """Progress straight from the event stream, so the bar moves without waiting for a reload."""
        if event["topic"] == "job" and event["subject"] == self._selected_id() and self.is_current:
            self._show_progress(self._jobs.get(event["subject"]))

    @on(DataTable.RowHighlighted)
    @work(exclusive=True, group="detail", exit_on_error=False)
    async def _highlighted(self) -> None:
        await self.reported(self._show_selected())

    def _selected_id(self) -> str | None:
        return self.query_one(Table).selected

    async def _show_selected(self) -> None:
        job = self._jobs.get(self._selected_id() or "")
        summary = self.query_one("#job-summary", Static)
        if job is None:
            summary.update("no jobs yet: press n to fine-tune a model on a dataset")
            return
        summary.update(_summary(job))
        self._show_progress(job)
        run_id = job["state"].get("run_id") or (job["result"] or {}).get("run_id")
        run = await self.app.request("GET", f"/v1/runs/{run_id}") if run_id else None
        self._show_charts(job, run)
        self._show_log(job["id"])

    def _show_progress(self, job: dict[str, Any] | None) -> None:
        bar, step = self.query_one("#job-bar", ProgressBar), self.query_one("#job-step", Label)
        if job is None:
            return
        report = self.app.job_progress.get(job["id"]) if job["status"] == "running" else None
        bar.display = job["status"] not in ("failed", "cancelled")  # where it stopped is in the log, not a 0%
        if job["status"] == "finished":
            bar.update(total=1, progress=1)
            step.update("finished")
        elif report and report.get("total_steps"):
            bar.update(total=report["total_steps"], progress=report["step"])
            step.update(jobs.progress_words(report))
        else:
            bar.update(total=None if job["status"] == "running" else 1, progress=0)
            step.update(job["status"] + (f" ({job['stage']})" if job["stage"] else ""))

    def _show_charts(self, job: dict[str, Any], run: dict[str, Any] | None) -> None:
        epochs = run["epochs"] if run else []
        losses = [epoch["train_loss"] for epoch in epochs]
        report = self.app.job_progress.get(job["id"])
        if report and report.get("stage") == "train" and job["status"] == "running" and report.get("loss") is not None:
            losses.append(report["loss"])  # the epoch under way, so far
        self.query_one("#loss-chart", Chart).show(losses, "{:.4f}")
        self.query_one("#accuracy-chart", Chart).show([epoch["metrics"].get("accuracy", 0.0) for epoch in epochs],
                                                      "{:.1%}")

    def _show_log(self, job_id: str) -> None:
        """Follow the job's log unless the pane already does, or holds all of it."""
        following = self._log_follower is not None and self._log_follower.is_running
        if job_id != self._log_job or not (following or self._log_complete):
            self._log_job, self._log_complete = job_id, False
            self._log_follower = self._follow_log(job_id)

    @work(exclusive=True, group="job-log", exit_on_error=False)
    async def _follow_log(self, job_id: str) -> None:
        """The job's log lines, each written once, in order, live while it runs (logs.log_events); a lost daemon
        ends the stream, and the next refresh starts over."""
        log = self.query_one(TailLog)
        log.clear()

        async def read() -> None:
            async for event in log_events(self.app.daemon, job_id):
                log.write_line(event["data"]["line"])
            self._log_complete = True

        await self.reported(read())  # a stream refused (too many open) or cut is a notice, not "a bug"

    def action_log(self) -> None:
        if (job_id := self._selected_id()) is not None:
            self.app.push_screen(LogViewer(job_id))

    def action_new(self) -> None:
        def submitted(job: dict[str, Any] | None) -> None:
            if job is not None:
                self.notify(f"job {job['id']} queued ({job['kind']})", title="fine-tune")
                self._to_select = job["id"]
                self.reload()

        self.app.push_screen(NewJobDialog(), submitted)

    def action_search(self) -> None:
        job = self._jobs.get(self._selected_id() or "")
        if job is None or job["kind"] != "tune":
            self.notify("select a tune job to see its search", severity="warning")
            return
        self.app.push_screen(SearchDialog(job["id"]))

    def action_cancel_job(self) -> None:
        job = self._jobs.get(self._selected_id() or "")
        if job is None or job["status"] in jobs.ENDED:
            self.notify("select a queued or running job to cancel", severity="warning")
            return
        question = (f"Cancel job {job['id']} ({job['kind']}, {job['status']})?"
                    + ("\nIt checkpoints first and ends as cancelled." if job["status"] == "running" else ""))
        self.confirm_and_send(
            Confirm(question, yes="Cancel the job", command=f"appliance jobs cancel {job['id']}"),
            "POST", f"/v1/jobs/{job['id']}/cancel",
            lambda done: f"job {done['id']} " + ("cancelled" if done["status"] == "cancelled" else "is stopping"))

    def action_delete_job(self) -> None:
        job = self._jobs.get(self._selected_id() or "")
        if job is None or job["status"] not in jobs.ENDED:
            self.notify("select an ended job to delete (c cancels one that is queued or running)", severity="warning")
            return
        self.confirm_and_send(
            Confirm(f"Delete job {job['id']} ({job['kind']}, {job['status']})?\nIts record and its log go; what it "
                    "made (runs, models) and the audit records stay.", yes="Delete",
                    command=f"appliance jobs delete {job['id']}"),
            "DELETE", f"/v1/jobs/{job['id']}", lambda done: f"job {done['id']} deleted")


def _row(job: dict[str, Any]) -> tuple[str, ...]:
    return (job["id"], job["kind"], job["status"], job["stage"] or "-", ago(job["submitted_at"]),
            job["submitted_by"].removeprefix("user:"))


def _summary(job: dict[str, Any]) -> str:
    made = ", ".join(f"{key} {value}" for key, value in job["state"].items()) or "nothing yet"
    source = job["params"].get("dataset") or job["params"].get("version")
    lines = [f"{job['id']}: {job['kind']} of {source}, {job['status']}, attempt {job['attempts']}, priority "
             + str(job["priority"]), f"made: {made}"]
    if job["error"]:
        lines.append(f"error: {job['error']}")
    return "\n".join(lines)


TRAINING_MODES = [  # TrainParams.mode; fast mode's own epochs and learning rate apply where those are left as shown
    ("auto: fast if full won't fit the budget", "auto"), ("full: fine-tune every weight", "full"),
    ("fast: tuned on pairs, a head on embeddings", "fast")]
LONG_TEXTS = [  # TrainParams.truncation: how a text longer than max length is read
    ("head and tail", "head+tail"), ("head only", "head")]
AFTER_TRAINING = [  # the wizard's choices: a pipeline job's deploy policy (jobspec.Deploy), or a train job
    ("optimise, deploy safely", "auto"), ("optimise, deploy to production", "now"),
    ("optimise, deploy as a canary", "canary"), ("optimise only", "never"), ("train only", "")]


class NewJobDialog(FormDialog[dict[str, Any]]):
    """The fine-tune wizard: a dataset and a name are all it needs; the rest has defaults that suit small data.

    Its new model is deployed safely by default: to production when the model serves nothing yet, else as a canary
    once it holds up against production (operations.deploy).

    A search budget turns it into a hyperparameter search (a tune job) of that many minutes; the advanced
    options are then its first trial.
    """

    def __init__(self) -> None:
        super().__init__("New fine-tune", "Start", wide=True)

    def compose_fields(self) -> ComposeResult:
        defaults = TrainParams()
        yield fields(("Dataset", Select([], prompt="loading datasets…", id="dataset")))
        yield fields(("Base model", Input(placeholder="default; or a folder name in train.base_models_dir",
                                          id="base")))
        yield fields(("Model name", Input(placeholder="as the dataset", id="name")),
                     ("Search (min)", Input(placeholder="none: train once", type="number", id="budget")))
        yield fields(("Then", Select(AFTER_TRAINING, value="auto", allow_blank=False, id="deploy")))
        with Collapsible(title="Advanced options", collapsed=True):
            yield fields(("Epochs", Input(str(defaults.epochs), type="integer", id="epochs")),
                         ("Learning rate", Input(str(defaults.learning_rate), type="number", id="learning_rate")))
            yield fields(("Batch size", Input(str(defaults.batch_size), type="integer", id="batch_size")),
                         ("Max length", Input(placeholder=f"planned ({defaults.max_length})", type="integer",
                                               tooltip="left empty: a run on a budget may read long texts whole",
                                               id="max_length")))
            yield fields(("Max minutes", Input(placeholder="no limit", type="number", id="max_minutes")),
                         ("LoRA", Switch(value=defaults.lora, id="lora")))
            yield fields(("Mode", Select(TRAINING_MODES, value=defaults.mode, allow_blank=False, id="mode")),
                         ("Long texts", Select(LONG_TEXTS, value=defaults.truncation, allow_blank=False,
                                               id="truncation")))
            yield fields(("Workers", Input(placeholder="as planned", type="integer", id="workers")),
                         ("Checkpoint (min)", Input(str(defaults.checkpoint_minutes), type="number",
                                                    id="checkpoint_minutes")))
            yield fields(("Device", Select([("as planned", ""), ("cpu", "cpu"), ("cuda", "cuda")], value="",
                                           allow_blank=False, id="device")),
                         ("Priority", Input("0", type="integer", id="priority")))
            yield fields(("Distil a student", Switch(value=False, id="distill",
                                                     tooltip="a smaller, faster model taught by the new one, served "
                                                             "if it keeps the accuracy; with a search or max "
                                                             "minutes, it learns in half of them")))

    def on_mount(self) -> None:
        super().on_mount()
        self.run_worker(self.offer_datasets(), exit_on_error=False)

    @work(exclusive=True, exit_on_error=False)
    async def submit(self) -> None:
        try:
            request = self._request()
        except ValueError as exc:
            self.show_problem(str(exc))
            return
        try:
            job = await self.app.request("POST", "/v1/jobs", request)
        except ApplianceError as exc:
            self.show_error(exc)
            return
        self.dismiss(job)

    def _request(self) -> dict[str, Any]:
        """The job to submit, from the form; ValueError names the field that is wrong."""
        dataset = self.query_one("#dataset", Select).value
        if dataset is Select.NULL:
            raise ValueError("choose a dataset (import one on the Datasets screen first)")
        defaults = TrainParams().model_dump()
        training: dict[str, Any] = {"lora": self.query_one("#lora", Switch).value,
                                    "mode": self.query_one("#mode", Select).value,
                                    "truncation": self.query_one("#truncation", Select).value}
        for name in ("epochs", "learning_rate", "batch_size", "max_length", "max_minutes", "workers",
                     "checkpoint_minutes"):
            text = self.query_one(f"#{name}", Input).value.strip()
            if text:
                kind = schema.bare(TrainParams.model_fields[name])
                try:
                    training[name] = kind(text)
                except ValueError:
                    raise ValueError(f"{name.replace('_', ' ')} must be a number, not {text!r}") from None
        # A max length typed in is kept even where it is the default: left empty, the plan may choose a longer one.
        params: dict[str, Any] = {"dataset": dataset, "params": {k: v for k, v in training.items()
                                                                 if v != defaults.get(k) or k == "max_length"}}
        for name in ("base", "name"):
            if value := self.query_one(f"#{name}", Input).value.strip():
                params[name] = value
        if device := self.query_one("#device", Select).value:
            params["device"] = device
        priority = self.query_one("#priority", Input).value.strip() or "0"
        low, high = jobspec.PRIORITY
        if not priority.lstrip("-").isdigit() or not low <= int(priority) <= high:
            raise ValueError(f"priority must be a whole number from {low} to {high}, not {priority!r}")
        deploy = self.query_one("#deploy", Select).value
        kind = "pipeline" if deploy else "train"
        if deploy:
            params["deploy"] = deploy
        if budget := self.query_one("#budget", Input).value.strip():
            try:
                minutes = float(budget)
            except ValueError:
                minutes = 0
            if minutes <= 0:
                raise ValueError(f"the search budget is a number of minutes above 0, not {budget!r}")
            kind, params["budget_s"], params["deploy"] = "tune", minutes * 60, deploy or "never"  # it always optimises
        if self.query_one("#distill", Switch).value:
            if kind == "train":
                raise ValueError("a student is distilled when the new model is optimised: choose a 'Then' that "
                                 "optimises, or a search budget")
            params["distill"] = True
        try:
            return jobspec.parse(kind, params).body(int(priority))  # refused here, with what each field takes
        except ApplianceError as exc:
            raise ValueError(exc.message) from None
