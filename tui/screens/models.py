"""Models: every registered version with its variants side by side; optimise, deploy, canary, rollback, delete,
export to a file and import one trained elsewhere."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Collapsible, DataTable, DirectoryTree, Input, Label, Select, Static, Switch

from appliance.core.errors import ApplianceError
from appliance.daemon import client
from appliance.data import datasets
from appliance.operations import jobs
from tui.screens.base import ApplianceScreen
from tui.screens.dialogs import Confirm, FormDialog, fields
from tui.widgets import Files, Table, ago, number, percent

ARCHIVE_SUFFIXES = (".tar", ".age")  # an export archive, plain or encrypted; a model otherwise is a folder
# The variant metrics worth comparing, as (metric, column title, format).
VARIANT_COLUMNS = (("accuracy", "acc", "{:.1%}"), ("macro_f1", "F1", "{:.3f}"), ("latency_ms_p50", "p50 ms", "{:.2f}"),
                   ("throughput_b16", "texts/s", "{:.0f}"), ("speedup_b16", "x fp32", "{:.2f}"))


def _undistillable(version: dict[str, Any]) -> str:
    """Why no student can be distilled from this version ('' when one can)."""
    if version["task"] == datasets.IMAGE:
        return "is an image model"
    return "" if "torch" in version["variants"] else "has no torch weights to teach with (it was imported without them)"


class ModelsScreen(ApplianceScreen):
    NAME = "models"
    TITLE = "Models"
    HELP = ("Every model version, newest first, and what serves now. The highlighted version shows its variants "
            "side by side (fp32, int8, student: accuracy, latency, size) and why one was chosen. o optimises a "
            "version that cannot serve (OpenVINO, INT8 kept only if accuracy holds: a new version), s distils a smaller, "
            "faster student of a text model's version, sized for this CPU and served only if it keeps the accuracy (a "
            "new version; several times as long as the training took), d deploys a version to production, k sends "
            "a canary share of traffic to it, r rolls back (a running canary stops first, else production returns "
            "to the version before), x deletes a version that never served; each asks before it acts. e exports "
            "a version to a file in an open format (ONNX, OpenVINO, Hugging Face), signed, encrypted with age to a "
            "recipient or a passphrase unless plaintext is switched on; admin only. i imports a model trained "
            "elsewhere (a Hugging Face folder, an ONNX or OpenVINO folder, an export archive), measured on a "
            "dataset of its labels before it is stored.")
    BINDINGS: ClassVar = [Binding("o", "optimise", "Optimise"), Binding("d", "deploy", "Deploy"),
                          Binding("k", "canary", "Canary"), Binding("r", "rollback", "Rollback"),
                          Binding("x", "delete", "Delete"), Binding("e", "export", "Export"),
                          Binding("i", "import", "Import"),
                          Binding("s", "distil", "Student", show=False)]  # an 80-column footer is full: o and help tell

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
            student = not _undistillable(version) and not version["chosen"].startswith("student")
            self.notify(f"{ref} is optimised already: it serves {version['chosen']}"
                        + ("; s distils a smaller, faster student of it" if student else ""), severity="warning")
            return

        self.confirm_and_send(
            Confirm(f"Optimise {ref}?\nAn optimize job exports it to OpenVINO and quantises it to INT8, keeping INT8 "
                    "only if its accuracy holds, and registers the result as a new version that can serve, with the "
                    "variant chosen and why. Nothing is deployed.", yes="Optimise", command=f"appliance optimize {ref}"),
            "POST", "/v1/jobs", lambda job: f"{ref}: job {job['id']} optimises it (3 shows it)",
            {"kind": "optimize", "params": {"version": ref}})

    def action_distil(self) -> None:
        version = self._selected()
        if version is None:
            return
        ref = f"{version['model']}:{version['version']}"
        why_not = _undistillable(version)
        if why_not:
            self.notify(f"{ref} {why_not}: a student is distilled from a text model's trained weights",
                        severity="warning")
            return
        self.confirm_and_send(
            Confirm(f"Distil a student of {ref}?\nAn optimize job teaches a smaller copy of it, sized for this CPU, on "
                    "its training data (several times as long as the training took), optimises both and registers them as a "
                    "new version that serves the student only if it keeps the accuracy and is faster, with the figures "
                    "and why. Nothing is deployed.", yes="Distil", command=f"appliance optimize {ref} --distill"),
            "POST", "/v1/jobs", lambda job: f"{ref}: job {job['id']} distils a student of it (3 shows it)",
            {"kind": "optimize", "params": {"version": ref, "distill": True}})

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

    def action_export(self) -> None:
        version = self._selected()
        if version is not None:
            ref = f"{version['model']}:{version['version']}"
            self.app.push_screen(ExportDialog(ref, images=version["task"] == datasets.IMAGE),
                                 lambda chosen: chosen and self._export(ref, chosen))

    @work(exclusive=True, exit_on_error=False)
    async def _export(self, ref: str, chosen: Export) -> None:
        """An export job; once it has finished, its archive, encrypted as chosen, written where the user said."""
        from appliance.registry import exchange

        body = {"kind": "export", "params": {"version": ref, "format": chosen.format, "protection": chosen.protection}}
        try:
            job = await self.app.request("POST", "/v1/jobs", body)
            self.notify(f"{ref}: job {job['id']} exports it as {chosen.format}")
            while job["status"] in jobs.ACTIVE:
                await asyncio.sleep(0.5)
                job = await self.app.request("GET", f"/v1/jobs/{job['id']}")
            if job["status"] != "finished":
                self.notify(f"the export of {ref} {job['status']}: {job['error']}", severity="error", timeout=10)
                return
            packed = await self.app.download(f"/v1/exports/{job['id']}")
            await asyncio.to_thread(exchange.save, chosen.path, packed, recipient=chosen.recipient,
                                    passphrase=chosen.passphrase)
        except ApplianceError as exc:
            self.app.report(exc)
            return
        self.notify(f"{ref} written to {chosen.path} ({chosen.protection}); 'appliance models verify' checks it")

    def action_import(self) -> None:
        def imported(version: dict[str, Any] | None) -> None:
            if version is not None:
                self.notify(f"imported as {version['model']}:{version['version']}: {version['reason']}",
                            title="model", timeout=10)
                self.reload()

        self.app.push_screen(ModelImportDialog(), imported)

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


@dataclass(frozen=True)
class Export:
    """Where and how an export leaves: written by this program, as its user."""

    format: str
    path: Path
    recipient: str | None
    passphrase: str | None

    @property
    def protection(self) -> str:
        return "recipient" if self.recipient else "passphrase" if self.passphrase else "plaintext"


class ExportDialog(FormDialog[Export]):
    """A version to a file in an open format: the format, the file, and an age recipient or a passphrase (or,
    switched on on purpose, plaintext)."""

    def __init__(self, ref: str, *, images: bool = False) -> None:
        super().__init__(f"Export {ref}", "Export", wide=True)
        self.ref, self.images = ref, images

    def compose_fields(self) -> ComposeResult:
        formats = [("ONNX", "onnx"), ("OpenVINO IR (as it serves)", "openvino")]
        formats += [] if self.images else [("Hugging Face", "hf")]  # an image model has no Hugging Face form
        yield fields(("Format", Select(formats, value="onnx", allow_blank=False, id="format")))
        yield fields(("File", Input(placeholder=f"a new file, e.g. ~/{self.ref.replace(':', '-')}.tar.age",
                                    id="path")))
        yield fields(("Recipient", Input(placeholder="age1... (from age-keygen)", id="recipient")))
        yield fields(("Passphrase", Input(password=True, placeholder="or a passphrase of 12+ characters",
                                          id="passphrase")),
                     ("Plaintext", Switch(value=False, id="plaintext")))
        yield Label(f"From a shell: appliance models export {self.ref} --format FORMAT --out FILE --recipient KEY",
                    classes="command")

    def submit(self) -> None:
        from appliance.registry import exchange

        text = {name: self.query_one(f"#{name}", Input).value.strip() for name in ("path", "recipient")}
        passphrase = self.query_one("#passphrase", Input).value or None
        plaintext = self.query_one("#plaintext", Switch).value
        path = Path(text["path"]).expanduser()
        given = sum((bool(text["recipient"]), passphrase is not None, plaintext))
        try:
            if not text["path"] or path.exists() or not path.parent.is_dir():
                raise ValueError(f"give a new file in a folder that exists, not {text['path']!r}")
            if given != 1:
                raise ValueError("give a recipient or a passphrase, or switch plaintext on: one of the three")
            if text["recipient"]:
                exchange.age_recipient(text["recipient"])
            if passphrase is not None:
                exchange.checked_passphrase(passphrase)
        except ValueError as exc:
            self.show_problem(str(exc))
            return
        except ApplianceError as exc:
            self.show_problem(exc.message)
            return
        self.dismiss(Export(str(self.query_one("#format", Select).value), path, text["recipient"] or None,
                            passphrase))


class ModelImportDialog(FormDialog[dict[str, Any]]):
    """A model trained elsewhere: a folder (Hugging Face, ONNX, OpenVINO) or an export archive picked from the disk,
    its name, the dataset it is measured on; an encrypted archive is opened here with its passphrase."""

    def __init__(self) -> None:
        super().__init__("Import a model", "Import", wide=True)

    def compose_fields(self) -> ComposeResult:
        yield Files(Path.cwd(), ARCHIVE_SUFFIXES, id="files")
        yield fields(("Model", Input(placeholder="a model folder, or an export archive (.tar, .age)", id="path")))
        yield fields(("Name", Input(placeholder="e.g. vendor", id="name")),
                     ("Dataset", Select([], prompt="measured on", id="dataset")))
        with Collapsible(title="Advanced: labels, passphrase", collapsed=True):
            yield fields(("Labels", Input(placeholder="in logit order, where config.json names none: a,b,c",
                                          id="labels")))
            yield fields(("Passphrase", Input(password=True, placeholder="of an encrypted archive", id="passphrase")))
        yield Label("From a shell: appliance models import PATH --name NAME --dataset DATASET", classes="command")

    def on_mount(self) -> None:
        super().on_mount()
        self.run_worker(self.offer_datasets("text-classification"), exit_on_error=False)

    @on(DirectoryTree.FileSelected)
    @on(DirectoryTree.DirectorySelected)
    def _picked(self, event: DirectoryTree.FileSelected | DirectoryTree.DirectorySelected) -> None:
        self.query_one("#path", Input).value = str(event.path.resolve())
        name = self.query_one("#name", Input)
        if not name.value:
            name.value = event.path.name.split(".")[0]

    @work(exclusive=True, exit_on_error=False)
    async def submit(self) -> None:
        from appliance.registry import exchange

        path, name = self.query_one("#path", Input).value.strip(), self.query_one("#name", Input).value.strip()
        dataset = self.query_one("#dataset", Select).value
        if not path or not name or not isinstance(dataset, str):
            self.show_problem("pick a model folder or archive, give it a name, and choose the dataset to measure it on")
            return
        chosen = Path(path).expanduser()
        if not chosen.exists():
            self.show_problem(f"{chosen}: no such file or folder")
            return
        labels = [label.strip() for label in self.query_one("#labels", Input).value.split(",") if label.strip()]
        options = {"name": name, "dataset": dataset, "labels": labels}

        async def send() -> dict[str, Any]:
            content = None
            if await asyncio.to_thread(exchange.is_encrypted, chosen):
                data = await asyncio.to_thread(exchange.read_archive, chosen, self.app.settings.daemon.max_upload_mb)
                self.show_problem("opening the archive…")
                passphrase = self.query_one("#passphrase", Input).value or None
                content = await asyncio.to_thread(exchange.decrypt, data, None, passphrase)
            self.show_problem("sending, checking and measuring… the model runs on every validation text")
            return await self.app.upload(chosen, options, to=client.MODELS, content=content)

        await self.send_and_dismiss(send())
