"""Experiment tracking: one row per training run, one per epoch, in the store.

Two runs can be compared because both their hyperparameters and their hardware
plans are kept next to their metrics.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Literal

from appliance.core import clock
from appliance.core.errors import JobError, RunNotFound
from appliance.core.text import duration
from appliance.store import Store, audit, blobs
from appliance.store.db import transaction


@dataclass(frozen=True)
class Run:
    id: str
    dataset_id: str
    base_model: str
    task: str
    params: dict[str, Any]
    plan: dict[str, Any]
    status: str
    model_blob: str | None
    metrics: dict[str, Any] | None
    created_at: str
    finished_at: str | None
    trained_on: str | None = None  # None: on this appliance; else the remote job, e.g. ray://host:8265/raysubmit_...
    outcome: Outcome | None = None  # once finished here; None for runs finished elsewhere or before outcomes were kept


def create(store: Store, *, dataset_id: str, base_model: str, task: str, params: dict, plan: dict,
           trained_on: str | None = None) -> str:
    run_id = uuid.uuid4().hex[:12]
    where = {"trained_on": trained_on} if trained_on else {}
    with audit.operation(store, "train.start", run_id, dataset=dataset_id, base_model=base_model, **where):
        store.db.execute(
            "INSERT INTO runs (id, dataset_id, base_model, task, params, plan, status, created_at, trained_on)"
            " VALUES (?, ?, ?, ?, ?, ?, 'running', ?, ?)",
            (run_id, dataset_id, base_model, task, json.dumps(params), json.dumps(plan), clock.stamp(), trained_on),
        )
    return run_id


def imported(store: Store, *, dataset_id: str, base_model: str, task: str, params: dict, trained_on: str,
             model_blob: str | None, metrics: dict) -> str:
    """A run for a model that trained elsewhere (operations/imports.py): finished as it arrives, its metrics
    measured here on dataset_id, trained_on saying where it came from; audited by the import around it."""
    run_id, now = uuid.uuid4().hex[:12], clock.stamp()
    store.db.execute(
        "INSERT INTO runs (id, dataset_id, base_model, task, params, plan, status, model_blob, metrics, created_at,"
        " finished_at, trained_on) VALUES (?, ?, ?, ?, ?, '{}', 'finished', ?, ?, ?, ?, ?)",
        (run_id, dataset_id, base_model, task, json.dumps(params), model_blob, json.dumps(metrics), now, now,
         trained_on),
    )
    return run_id


@dataclass(frozen=True)
class Epoch:
    """One epoch's record: validation metrics, throughput and when it was reached."""

    epoch: int
    step: int
    train_loss: float
    metrics: dict[str, float]
    samples_per_s: float
    elapsed_s: float
    evaluated_on: int | None = None  # validation examples the metrics are on (None: recorded before this was kept)


Stop = Literal["converged", "budget", "epochs", "asked"]


@dataclass(frozen=True)
class Outcome:
    """How a run ended: which epoch's model it kept, why it stopped, what its final figures are on."""

    best_epoch: int
    epochs_run: int
    stopped: Stop  # converged: no better for `patience` epochs; budget: max_minutes; epochs: all run; asked: a search
    evaluated_on: int  # validation examples behind the final metrics
    validation_examples: int  # in the whole validation split

    def sentence(self, params: dict[str, Any]) -> str:
        """The run's end as an operator reads it."""
        if self.stopped == "converged":
            patience = params.get("patience")
            why = f"validation {params.get('metric')} was no better for {patience} epoch{'s' * (patience != 1)}"
        elif self.stopped == "budget":
            why = f"the {duration(params['max_minutes'] * 60)} budget"
        else:
            why = "all epochs run" if self.stopped == "epochs" else "ended by the search (pruned)"
        whole = ("all" if self.evaluated_on == self.validation_examples
                 else f"a stratified sample of {self.evaluated_on:,} of") + f" {self.validation_examples:,}"
        kept = f"epoch {self.best_epoch}" + (" (the head fitted on frozen features)" if self.best_epoch == 0 else "")
        return f"kept {kept} of {self.epochs_run}; stopped: {why}; final figures on {whole} validation examples"


def record_epoch(store: Store, run_id: str, row: Epoch) -> None:
    with audit.operation(store, "train.epoch", run_id, epoch=row.epoch, evaluated_on=row.evaluated_on, **row.metrics):
        store.db.execute(
            "INSERT OR REPLACE INTO run_epochs (run_id, epoch, step, train_loss, metrics, samples_per_s, elapsed_s,"
            " evaluated_on, ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, row.epoch, row.step, row.train_loss, json.dumps(row.metrics), row.samples_per_s, row.elapsed_s,
             row.evaluated_on, clock.stamp()),
        )


def set_status(store: Store, run_id: str, status: str, actor: str | None = None, **details: Any) -> None:
    with audit.operation(store, f"train.{status}", run_id, actor=actor, **details):
        store.db.execute(
            "UPDATE runs SET status = ?, finished_at = ? WHERE id = ?",
            (status, clock.stamp() if status != "running" else None, run_id),
        )


def finish(store: Store, run_id: str, model_blob: str, metrics: dict, outcome: Outcome | None = None) -> None:
    ended = {"outcome": asdict(outcome)} if outcome else {}
    with audit.operation(store, "train.finished", run_id, model=model_blob, **metrics, **ended):
        store.db.execute(
            "UPDATE runs SET status = 'finished', model_blob = ?, metrics = ?, outcome = ?, finished_at = ?"
            " WHERE id = ?",
            (model_blob, json.dumps(metrics), json.dumps(asdict(outcome)) if outcome else None, clock.stamp(), run_id),
        )


def drop_model(store: Store, run_id: str) -> None:
    """Forget a finished run's model, keeping the run and its curve: a search keeps only its best trial's."""
    model = get(store, run_id).model_blob
    if model is None:
        return
    with audit.operation(store, "train.model_dropped", run_id, model=model):
        store.db.execute("UPDATE runs SET model_blob = NULL WHERE id = ?", (run_id,))
        blobs.release(store, model)


def drop_checkpoint(store: Store, run_id: str, actor: str | None = None) -> int:
    """Delete a run's checkpoint, its hash kept on the record: a finished run's (the model it produced is what
    stays), or a discarded one's. Its size in bytes; 0 where it kept none."""
    row = store.db.execute("SELECT c.blob_id, b.size FROM checkpoints c JOIN blobs b ON b.id = c.blob_id"
                           " WHERE c.run_id = ?", (run_id,)).fetchone()
    if row is None:
        return 0
    with audit.operation(store, "checkpoint.discard", run_id, actor=actor, blob=row[0], bytes=row[1]):
        store.db.execute("DELETE FROM checkpoints WHERE run_id = ?", (run_id,))
        blobs.delete(store, row[0])
    return row[1]


def discard(store: Store, run_id: str, actor: str | None = None) -> tuple[Run, int]:
    """Give up a run that did not finish: its checkpoint (a model's weights and its optimiser's state, hundreds of
    MB) is deleted and it can no longer be resumed; the run and its curve stay. The run, and the bytes freed."""
    run = get(store, run_id)
    if run.status in ("finished", "discarded"):
        raise JobError(f"run {run.id} has {'finished' if run.status == 'finished' else 'been discarded already'}:"
                       " it keeps no checkpoint", hint="'appliance models delete' removes a model it made")
    with transaction(store.db):
        freed = drop_checkpoint(store, run.id, actor)
        set_status(store, run.id, "discarded", actor, freed_bytes=freed)
    return get(store, run.id), freed


def get(store: Store, run_id: str) -> Run:
    row = store.db.execute("SELECT * FROM runs WHERE id = ? OR id LIKE ?", (run_id, f"{run_id}%")).fetchall()
    if not row:
        raise RunNotFound(f"no training run {run_id!r}", hint="'appliance runs list' shows the runs")
    if len(row) > 1:
        raise JobError(f"{run_id!r} matches {len(row)} runs", hint="give more of the id ('appliance runs list')")
    return _run(dict(zip(_columns(store), row[0])))


def describe(store: Store, run_id: str) -> dict[str, Any]:
    """A run and its epochs so far, as JSON (`runs show --json`, the control API, the console's charts)."""
    run = get(store, run_id)
    return {**asdict(run), "epochs": [asdict(epoch) for epoch in epochs(store, run.id)]}


def trained_at(store: Store, where: str) -> str | None:
    """The run that trained at this remote place (a burst job), if one was stored."""
    row = store.db.execute("SELECT id FROM runs WHERE trained_on = ?", (where,)).fetchone()
    return row[0] if row else None


def list_runs(store: Store) -> list[Run]:
    return [_run(dict(zip(_columns(store), row))) for row in store.db.execute("SELECT * FROM runs ORDER BY created_at")]


def epochs(store: Store, run_id: str) -> list[Epoch]:
    rows = store.db.execute(
        "SELECT epoch, step, train_loss, metrics, samples_per_s, elapsed_s, evaluated_on FROM run_epochs"
        " WHERE run_id = ? ORDER BY epoch",
        (run_id,),
    )
    return [Epoch(e, s, loss, json.loads(m), sps, elapsed, on) for e, s, loss, m, sps, elapsed, on in rows]


def _columns(store: Store) -> list[str]:
    return [column.name for column in store.db["runs"].columns]


def _run(row: dict[str, Any]) -> Run:
    return Run(
        id=row["id"],
        dataset_id=row["dataset_id"],
        base_model=row["base_model"],
        task=row["task"],
        params=json.loads(row["params"]),
        plan=json.loads(row["plan"]),
        status=row["status"],
        model_blob=row["model_blob"],
        metrics=json.loads(row["metrics"]) if row["metrics"] else None,
        created_at=row["created_at"],
        finished_at=row["finished_at"],
        trained_on=row["trained_on"],
        outcome=Outcome(**json.loads(row["outcome"])) if row["outcome"] else None,
    )
