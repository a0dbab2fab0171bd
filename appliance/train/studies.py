"""Experiment tracking for hyperparameter searches: one row per study, one per trial, in the store.

A trial that trained is an ordinary run (runs.py): its parameters, plan and per-epoch curve
live there, so `appliance runs show` works on it. This module keeps what the search adds:
the space, the budget and time spent, each trial's sampled values, its state (pruned or
not) and the pruner's records, enough to rebuild the Optuna study after a restart.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass
from typing import Any

from appliance.core import clock
from appliance.core.errors import JobError, StudyNotFound
from appliance.store import Store, audit
from appliance.store.db import transaction
from appliance.train import runs

TRIAL_STATES = ("running", "complete", "pruned", "refused")


@dataclass(frozen=True)
class Study:
    id: str
    dataset_id: str
    base_model: str
    task: str
    metric: str
    sampler: str
    space: dict[str, Any]
    base_params: dict[str, Any]
    device: str | None
    budget_s: float
    spent_s: float
    status: str  # running | interrupted | finished
    best_run_id: str | None
    importances: dict[str, float]  # each searched parameter's share of the metric's variance
    created_at: str
    finished_at: str | None


@dataclass(frozen=True)
class Trial:
    number: int
    run_id: str | None
    params: dict[str, Any]
    distributions: dict[str, str]  # Optuna's JSON of each distribution
    state: str  # running | complete | pruned | refused
    value: float | None
    system_attrs: dict[str, Any]
    note: str | None


def create(store: Store, *, dataset_id: str, base_model: str, task: str, metric: str, sampler: str,
           space: dict[str, Any], base_params: dict[str, Any], device: str | None, budget_s: float,
           study_id: str | None = None, actor: str | None = None) -> Study:
    study_id = study_id or secrets.token_hex(6)
    with audit.operation(store, "tune.start", study_id, actor=actor, dataset=dataset_id, metric=metric,
                         budget_s=budget_s, sampler=sampler):
        store.db.execute(
            "INSERT INTO studies (id, dataset_id, base_model, task, metric, sampler, space, base_params, device,"
            " budget_s, status, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'running', ?)",
            (study_id, dataset_id, base_model, task, metric, sampler, json.dumps(space), json.dumps(base_params),
             device, budget_s, clock.stamp()),
        )
    return get(store, study_id)


def exists(store: Store, study_id: str) -> bool:
    return store.db.execute("SELECT 1 FROM studies WHERE id = ?", (study_id,)).fetchone() is not None


def get(store: Store, study_id: str) -> Study:
    rows = store.db.execute("SELECT * FROM studies WHERE id = ? OR id LIKE ?", (study_id, f"{study_id}%")).fetchall()
    if not rows:
        raise StudyNotFound(f"no hyperparameter search {study_id!r}", hint="'appliance tune list' shows the searches")
    if len(rows) > 1:
        raise JobError(f"{study_id!r} matches {len(rows)} searches", hint="give more of the id")
    columns = [column.name for column in store.db["studies"].columns]
    row = dict(zip(columns, rows[0]))
    for key in ("space", "base_params", "importances"):
        row[key] = json.loads(row[key])
    return Study(**row)


def list_studies(store: Store) -> list[Study]:
    return [get(store, row[0]) for row in store.db.execute("SELECT id FROM studies ORDER BY created_at, rowid")]


def trials(store: Store, study_id: str) -> list[Trial]:
    rows = store.db.execute(
        "SELECT number, run_id, params, distributions, state, value, system_attrs, note FROM trials"
        " WHERE study_id = ? ORDER BY number", (study_id,))
    return [Trial(number, run_id, json.loads(params), json.loads(dists), state, value, json.loads(attrs), note)
            for number, run_id, params, dists, state, value, attrs, note in rows]


def add_trial(store: Store, study_id: str, trial: Trial) -> None:
    """A trial as it starts (running, with its run) or as the plan refused it, recorded with its values."""
    with audit.operation(store, f"tune.trial.{'refused' if trial.state == 'refused' else 'start'}", study_id,
                         trial=trial.number, run=trial.run_id, **({"reason": trial.note} if trial.note else {})):
        store.db.execute(
            "INSERT INTO trials (study_id, number, run_id, params, distributions, state, value, system_attrs, note)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (study_id, trial.number, trial.run_id, json.dumps(trial.params), json.dumps(trial.distributions),
             trial.state, trial.value, json.dumps(trial.system_attrs), trial.note),
        )


def end_trial(store: Store, study_id: str, number: int, state: str, value: float | None,
              system_attrs: dict[str, Any], note: str | None = None) -> None:
    """A trial's outcome: complete or pruned, the best value it reached, the pruner's records."""
    with audit.operation(store, f"tune.trial.{state}", study_id, trial=number, value=value):
        store.db.execute(
            "UPDATE trials SET state = ?, value = ?, system_attrs = ?, note = ? WHERE study_id = ? AND number = ?",
            (state, value, json.dumps(system_attrs), note, study_id, number),
        )


def spend(store: Store, study_id: str, spent_s: float) -> None:
    """How much of the budget is used; written after every epoch, so a crash loses at most one epoch's time."""
    with transaction(store.db):
        store.db.execute("UPDATE studies SET spent_s = ? WHERE id = ?", (spent_s, study_id))


def set_importances(store: Store, study_id: str, importances: dict[str, float]) -> None:
    """Kept with the study, so whoever shows it (the daemon, `tune show`) needs no Optuna."""
    with transaction(store.db):
        store.db.execute("UPDATE studies SET importances = ? WHERE id = ?", (json.dumps(importances), study_id))


def set_status(store: Store, study_id: str, status: str, best_run_id: str | None = None) -> None:
    with audit.operation(store, f"tune.{status}", study_id, best_run=best_run_id):
        store.db.execute(
            "UPDATE studies SET status = ?, best_run_id = COALESCE(?, best_run_id), finished_at = ? WHERE id = ?",
            (status, best_run_id, clock.stamp() if status == "finished" else None, study_id),
        )


@dataclass(frozen=True)
class Ranked:
    trial: Trial
    epochs: list[runs.Epoch]


def ranked(store: Store, study_id: str) -> tuple[Study, list[Ranked]]:
    """The study and its trials best first: finished, then running, pruned, refused; each with its curve."""
    record = get(store, study_id)
    found = trials(store, record.id)
    order = {"complete": 0, "running": 1, "pruned": 2, "refused": 3}
    found.sort(key=lambda trial: (order[trial.state], -(trial.value or 0.0), trial.number))
    return record, [Ranked(trial, runs.epochs(store, trial.run_id) if trial.run_id else []) for trial in found]


def summaries(store: Store) -> list[dict[str, Any]]:
    """Every search, oldest first, with how many trials it ran and its best value (`tune list`, the control API)."""
    found = []
    for record in list_studies(store):
        ran = trials(store, record.id)
        best = next((trial.value for trial in ran if trial.run_id == record.best_run_id and trial.state == "complete"),
                    None)
        found.append({**asdict(record), "trials": len(ran), "pruned": sum(trial.state == "pruned" for trial in ran),
                      "best_value": best})
    return found


def describe(store: Store, study_id: str) -> dict[str, Any]:
    """A search as JSON (`tune show --json`, the control API): the study, then its ranked trials with their curves."""
    record, rows = ranked(store, study_id)
    return {**asdict(record), "trials": [{**asdict(row.trial), "epochs": [asdict(epoch) for epoch in row.epochs]}
                                         for row in rows]}
