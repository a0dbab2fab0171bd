"""Models: every registered version with its variants side by side; optimise, deploy, canary and rollback."""

from __future__ import annotations

from typing import Any, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Input, Label, Static

from tui.screens.base import ApplianceScreen
from tui.screens.dialogs import Confirm, FormDialog
from tui.widgets import Table, ago, number, percent

# The variant metrics worth comparing, as (metric, column title, format).
VARIANT_COLUMNS = (("accuracy", "acc", "{:.1%}"), ("macro_f1", "F1", "{:.3f}"), ("latency_ms_p50", "p50 ms", "{:.2f}"),
                   ("throughput_b16", "texts/s", "{:.0f}"), ("speedup_b16", "x fp32", "{:.2f}"))


class ModelsScreen(ApplianceScreen):
    NAME = "models"
    TITLE = "Models"
    HELP = ("Every model version, newest first, and what serves now. The highlighted version shows its variants "
            "side by side (fp32, int8, student: accuracy, latency, size) and why one was chosen. o optimises a "
            "version that cannot serve (OpenVINO, INT8 kept only if accuracy holds: a new version), d deploys it to production, k sends "
            "a canary share of traffic to it, r rolls back (a running canary stops first, else production returns "
            "to the version before), x deletes a version that never served; each asks before it acts.")
    BINDINGS: ClassVar = [Binding("o", "optimise", "Optimise"), Binding("d", "deploy", "Deploy"),
                          Binding("k", "canary", "Canary"), Binding("r", "rollback", "Rollback"),
                          Binding("x", "delete", "Delete")]

    def compose_body(self) -> ComposeResult:
        yield Table("version", "aliases", "traffic", "serves", "accuracy", "registered", id="models")
        with Vertical(id="model-detail", classes="detail"):
            yield Static("", id="model-summary", markup=False)
            yield Table("variant", "format", "MiB", *(title for _, title, _ in VARIANT_COLUMNS), id="variants",
                        cursor=False)

    def on_mount(self) -> None:
        super().on_mount()
        self._versions: dict[str, dict[str, Any]] = {}
        self._traffic: dict[str, float] = {}  # "model:version" -> share of the model's traffic it gets now
        self._canary: dict[str, float] = {}  # model -> its canary percent now
        self._runs: dict[str, dict[str, Any]] = {}

    async def load(self) -> None:
        found = await self.app.request("GET", "/v1/models")
        serving = await self.app.request("GET", "/v1/serving")
        self._traffic = {f"{m['model']}:{v['version']}": v["traffic_share"] for m in serving["models"]
                         for v in m["versions"]}
        self._canary = {m["model"]: m["canary_percent"] for m in serving["models"]}
        newest_first = sorted(found, key=lambda v: (v["created_at"], v["version"]), reverse=True)
        self._versions = {f"{v['model']}:{v['version']}": v for v in newest_first}
        self.query_one("#models", Table).fill((ref, self._row(ref, v)) for ref, v in self._versions.items())
        if not found:
            self.query_one("#model-summary", Static).update(
                "no models yet: a fine-tune (3, then n) registers one, optimises it and deploys it")
        await self._show_selected()

    def _row(self, ref: str, version: dict[str, Any]) -> tuple[str, ...]:
        accuracy = version["variants"][version["chosen"]]["metrics"].get("accuracy")
        share = self._traffic.get(ref)
        return (ref, " ".join(version["aliases"]) or "-", percent(share) if share is not None else "-",
                version["chosen"] if version["servable"] else "not optimised", number(accuracy, "{:.1%}"),
                ago(version["created_at"]))

    @on(DataTable.RowHighlighted, "#models")
    @work(exclusive=True, group="detail", exit_on_error=False)
    async def _highlighted(self) -> None:
        await self.reported(self._show_selected())

    def _selected(self) -> dict[str, Any] | None:
        return self._versions.get(self.query_one("#models", Table).selected or "")

    async def _show_selected(self) -> None:
        version = self._selected()
        if version is None:
            return
        run_id = version["run_id"]
        if run_id not in self._runs:
            self._runs[run_id] = await self.app.request("GET", f"/v1/runs/{run_id}")
        run = self._runs[run_id]
        self.query_one("#model-summary", Static).update(
            f"{version['model']}:{version['version']} serves {version['chosen']}: {version['reason']}\n"
            f"lineage: run {run_id} on dataset {run['dataset_id'][:12]}, base {run['base_model']}")
        order = sorted(version["variants"].values(), key=lambda v: (v["name"] != "torch", "student" in v["name"],
                                                                    v["name"]))
        self.query_one("#variants", Table).fill(
            (variant["name"], (variant["name"] + (" *" if variant["name"] == version["chosen"] else ""),
                               variant["format"], f"{variant['bytes'] / 2**20:.1f}",
                               *(number(variant["metrics"].get(metric), fmt) for metric, _, fmt in VARIANT_COLUMNS)))
            for variant in order)

    # -- actions -------------------------------------------------------------------------

    def action_optimise(self) -> None:
        version = self._selected()
        if version is None:
            return
        ref = f"{version['model']}:{version['version']}"
        if version["servable"]:
            self.notify(f"{ref} is optimised already: it serves {version['chosen']}", severity="warning")
            return

        self.confirm_and_send(
            Confirm(f"Optimise {ref}?\nAn optimize job exports it to OpenVINO and quantises it to INT8, keeping INT8 "
                    "only if its accuracy holds, and registers the result as a new version that can serve, with the "
                    "variant chosen and why. Nothing is deployed.", yes="Optimise", command=f"appliance optimize {ref}"),
            "POST", "/v1/jobs", lambda job: f"{ref}: job {job['id']} optimises it (3 shows it)",
            {"kind": "optimize", "params": {"version": ref}})

    def action_deploy(self) -> None:
        version = self._deployable()
        if version is None:
            return
        ref = f"{version['model']}:{version['version']}"
        serving = next((other for other in self._versions.values() if other["model"] == version["model"]
                        and "production" in other["aliases"]), None)
        replaces = (f"It replaces {version['model']}:{serving['version']}, in production now. " if serving
                    else f"Nothing of {version['model']} serves yet. ")
        self.confirm_and_send(
            Confirm(f"Deploy {ref} to production?\n{replaces}Traffic moves to it once it is loaded, warm and has "
                    "passed a smoke test; a running canary ends.", yes="Deploy", command=f"appliance deploy {ref}"),
            "POST", f"/v1/models/{version['model']}/deploy", lambda done: f"{done['model']}:{done['version']} deployed",
            {"version": version["version"]})

    def action_canary(self) -> None:
        version = self._deployable()
        if version is None:
            return

        def chosen(share: float | None) -> None:
            if share is not None:
                self.send("POST", f"/v1/models/{version['model']}/deploy",
                          lambda done: f"{done['model']}:{done['version']} takes {share:g}% as a canary",
                          {"version": version["version"], "canary_percent": share})

        self.app.push_screen(CanaryDialog(f"{version['model']}:{version['version']}"), chosen)

    def action_rollback(self) -> None:
        version = self._selected()
        if version is None:
            return
        model = version["model"]
        if self._canary.get(model):
            question = (f"Stop the canary of {model}?\nIts candidate gets {self._canary[model]:g}% of the traffic now; "
                        "all of it goes back to production.")
        else:
            question = (f"Roll {model} back?\nProduction returns to the version that served before the last deploy.")
        self.confirm_and_send(Confirm(question, yes="Roll back", command=f"appliance rollback {model}"),
                              "POST", f"/v1/models/{model}/rollback",
                              lambda done: f"{model}: " + ("canary stopped" if done.get("canary")
                                                           else f"production is version {done['production']} again"))

    def action_delete(self) -> None:
        version = self._selected()
        if version is None:
            return
        ref = f"{version['model']}:{version['version']}"
        if version["aliases"]:
            self.notify(f"{ref} is the {' and '.join(version['aliases'])} version: deploy another or roll back first",
                        severity="warning")
            return
        self.confirm_and_send(
            Confirm(f"Delete {ref} and its weights?\nIt cannot be undone. The run it came from and the audit records "
                    "stay; a version a rollback could return to is refused.", yes="Delete",
                    command=f"appliance models delete {ref}"),
            "DELETE", f"/v1/models/{version['model']}/versions/{version['version']}",
            lambda done: f"{done['model']}:{done['version']} deleted")

    def _deployable(self) -> dict[str, Any] | None:
        """The selected version, if the server can run it; else None, and the operator is told why and what to do."""
        version = self._selected()
        if version is not None and not version["servable"]:
            self.notify(f"{version['model']}:{version['version']} is not optimised, so it cannot serve: o optimises it",
                        severity="warning")
            return None
        return version

class CanaryDialog(FormDialog[float]):
    """How much of a model's traffic its candidate gets, in percent."""

    def __init__(self, ref: str) -> None:
        super().__init__(f"Canary for {ref}", "Start the canary", variant="warning")
        self.ref = ref

    def compose_fields(self) -> ComposeResult:
        yield Label("Share of the traffic it gets (the rest stays on production):")
        with Horizontal(classes="row"):
            yield Input("10", type="number", id="percent")
            yield Label("%", classes="unit")
        yield Label(f"From a shell: appliance deploy {self.ref} --canary PERCENT", classes="command")

    def submit(self) -> None:
        text = self.query_one("#percent", Input).value.strip()
        try:
            share = float(text)
        except ValueError:
            share = -1.0
        if not 0 < share <= 100:
            self.show_problem(f"give a share above 0 and at most 100, not {text!r}")
            return
        self.dismiss(share)
