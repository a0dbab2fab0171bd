"""Datasets: the imported versions, importing a file picked from the disk, and deleting a version."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Collapsible, DataTable, DirectoryTree, Input, Label, Select, Static

from appliance.core.text import counted
from appliance.data import datasets
from tui.screens.base import ApplianceScreen
from tui.screens.dialogs import Confirm, FormDialog, fields
from tui.widgets import Files, Table, ago


class DatasetsScreen(ApplianceScreen):
    NAME = "datasets"
    TITLE = "Datasets"
    HELP = ("Every imported dataset version. i imports a CSV or JSONL file (a header row; text and label columns) "
            "or a folder of class subfolders of images; problems are listed with their line numbers and nothing is "
            "stored until the file is clean. x deletes a version's content: the models trained on it keep saying on "
            "what, nothing can train on it again.")
    BINDINGS: ClassVar = [Binding("i", "import", "Import"), Binding("x", "delete", "Delete")]

    def compose_body(self) -> ComposeResult:
        yield Table("dataset", "task", "examples", "classes", "residency", "imported", id="datasets")
        yield Static("", id="dataset-detail", classes="detail", markup=False)

    def on_mount(self) -> None:
        super().on_mount()
        self._versions: dict[str, dict[str, Any]] = {}
        self._shown: str | None = None  # the version whose detail is shown

    async def load(self) -> None:
        versions = [v for v in await self.app.request("GET", "/v1/datasets") if v["erased_at"] is None]
        self._versions = {version["ref"]: version for version in versions}
        self.query_one(Table).fill((v["ref"], (v["ref"], v["task"].removesuffix("-classification"), v["examples"],
                                        len(v["labels"]), v["residency"], ago(v["created_at"])))
                           for v in sorted(versions, key=lambda v: v["created_at"], reverse=True))
        if not versions:
            self.query_one("#dataset-detail", Static).update("no datasets yet: press i to import a file")
        elif self.query_one(Table).selected != self._shown:  # a version's detail is asked for once, not each reload
            await self._show_detail()

    @on(DataTable.RowHighlighted)
    @work(exclusive=True, group="detail", exit_on_error=False)
    async def _highlighted(self) -> None:
        await self.reported(self._show_detail())

    async def _show_detail(self) -> None:
        ref = self.query_one(Table).selected
        if ref in self._versions:
            detail = await self.app.request("GET", f"/v1/datasets/{ref}/detail")
            self.query_one("#dataset-detail", Static).update(_detail(detail))
            self._shown = ref

    def action_import(self) -> None:
        def imported(answer: dict[str, Any] | None) -> None:
            if answer is not None:
                verb = "unchanged, already stored as" if answer["unchanged"] else "imported as"
                self.notify(f"{verb} {answer['ref']}: {answer['examples']} examples", title="dataset")
                self.reload()

        self.app.push_screen(ImportDialog(), imported)

    def action_delete(self) -> None:
        ref = self.query_one(Table).selected
        if ref is None:
            return
        self.confirm_and_send(
            Confirm(f"Delete the content of {ref}?\nIt cannot be undone: nothing can train on it again. Models trained "
                    "on it keep serving and keep naming it; a job training on it makes this refused.", yes="Delete",
                    command=f"appliance data delete {ref}"),
            "DELETE", f"/v1/datasets/{ref}/content", lambda done: f"{', '.join(v['ref'] for v in done)} deleted")


def _detail(version: dict[str, Any]) -> str:
    split = version["split"]
    lines = [
        f"{version['ref']}  id {version['id'][:16]}…  from {version['source']}",
        f"examples per label ({len(version['labels'])}): "
        + ", ".join(f"{label} {count}" for label, count in version["counts"].items()),
        f"split: {split['train']} train / {split['validation']} validation (seed {split['seed']})",
        f"trained: {', '.join(version['models']) or 'no model yet'}"
        + (f"; holds true labels of {counted(len(version['from_predictions']), 'served prediction')}"
           if version["from_predictions"] else ""),
    ]
    lines += [f"warning: {warning}" for warning in version["warnings"][:3]]
    return "\n".join(lines)


class ImportDialog(FormDialog[dict[str, Any]]):
    """Pick a file (or an image folder), name it, send it; the daemon checks every line and says where."""

    def __init__(self) -> None:
        super().__init__("Import a dataset", "Import", wide=True)

    def compose_fields(self) -> ComposeResult:
        yield Files(Path.cwd(), datasets.TEXT_SUFFIXES, id="files")
        yield fields(("File", Input(placeholder="a .csv or .jsonl file, or a folder of images", id="path")))
        with Horizontal(classes="row"):
            yield Label("Name", classes="field")
            yield Input(placeholder="e.g. tickets", id="name")
            yield Select([("text", datasets.TEXT), ("images", datasets.IMAGE)], value=datasets.TEXT,
                         allow_blank=False, id="task")
        with Collapsible(title="Advanced: columns, validation share", collapsed=True):
            yield fields(("Text column", Input("text", id="text_column")),
                         ("Label column", Input("label", id="label_column")))
            yield fields(("Validation", Input("0.2", type="number", id="validation_fraction")))

    @on(DirectoryTree.FileSelected)
    def _file_picked(self, event: DirectoryTree.FileSelected) -> None:
        self._pick(event.path)

    @on(DirectoryTree.DirectorySelected)
    def _folder_picked(self, event: DirectoryTree.DirectorySelected) -> None:
        if self.query_one("#task", Select).value == datasets.IMAGE:
            self._pick(event.path)

    def _pick(self, path: Path) -> None:
        self.query_one("#path", Input).value = str(path.resolve())
        name = self.query_one("#name", Input)
        if not name.value:
            name.value = path.stem
        name.focus()

    @work(exclusive=True, exit_on_error=False)
    async def submit(self) -> None:
        path, name = self.query_one("#path", Input).value.strip(), self.query_one("#name", Input).value.strip()
        if not path or not name:
            self.show_problem("pick a file (or type its path) and give the dataset a name")
            return
        try:
            fraction = float(self.query_one("#validation_fraction", Input).value)
        except ValueError:
            self.show_problem("the validation share is a number between 0 and 1, such as 0.2")
            return
        options = {"name": name, "task": self.query_one("#task", Select).value, "validation_fraction": fraction,
                   "text_column": self.query_one("#text_column", Input).value.strip() or "text",
                   "label_column": self.query_one("#label_column", Input).value.strip() or "label"}
        chosen = Path(path).expanduser()
        if not chosen.exists():
            self.show_problem(f"{chosen}: no such file or folder")
            return
        self.show_problem("sending and importing… the daemon checks every line")
        await self.send_and_dismiss(self.app.upload(chosen, options))
