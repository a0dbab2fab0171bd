"""Usage accounting, the chargeback an owner asks for: who and which model used what, by day.

Two sources fill the `usage` table (schema 10), one row per UTC day, actor and model:

- jobs: when an attempt's child process ends, the supervisor adds its CPU time (user +
  system, from the kernel's rusage of the reaped child, its own waited-for children
  included) and, when it trained on CUDA, its wall time x the GPUs it used; charged to
  the job's submitter and the model the job is for;
- inference: the server counts requests and their compute time in memory (Meter, no
  database on the request path) per model and caller (key:NAME for an API key, the
  user for the control API's predictions), and its store thread flushes them at each poll.

Counts are metering, like metrics: they are not audited one by one.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from datetime import date
from typing import TYPE_CHECKING, Any

from appliance.core import clock
from appliance.store import Store
from appliance.store.db import transaction
from appliance.train import runs

if TYPE_CHECKING:
    from appliance.operations.jobs import Job

BY = ("user", "model")
COLUMNS = ("cpu_s", "gpu_s", "job_attempts", "requests", "compute_s")
NO_MODEL = "-"


def add(store: Store, actor: str, model: str, day: date | None = None, **amounts: float) -> None:
    """Add amounts (COLUMNS) to the day's row of actor and model."""
    values = [amounts.get(column, 0) for column in COLUMNS]
    with transaction(store.db):
        store.db.execute(
            f"INSERT INTO usage (day, actor, model, {', '.join(COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            f" ON CONFLICT (day, actor, model) DO UPDATE SET "
            + ", ".join(f"{column} = {column} + excluded.{column}" for column in COLUMNS),
            [(day or clock.now().date()).isoformat(), actor, model, *values],
        )


def record_job(store: Store, job: Job, cpu_s: float, wall_s: float) -> None:
    """Charge one ended attempt of a job to its submitter and model."""
    add(store, job.submitted_by, job_model(job), cpu_s=cpu_s, gpu_s=wall_s * gpus_used(store, job), job_attempts=1)


def job_model(job: Job) -> str:
    """The model a job is for: the version it made, else the one it optimises, its name, or its dataset's name."""
    for ref in (job.state.get("registered"), job.params.get("version"), job.params.get("name"),
                job.params.get("dataset")):
        if isinstance(ref, str) and ref:
            return ref.split(":")[0].split("@")[0]
    return NO_MODEL


def gpus_used(store: Store, job: Job) -> int:
    """1 when the job's training ran here on CUDA (its run's plan says so, or it asked for it), else 0."""
    if job.params.get("burst"):
        return 0  # the cluster's GPUs, not this box's
    run_id = job.state.get("run_id")
    device = runs.get(store, run_id).plan.get("device") if run_id else job.params.get("device")
    return 1 if str(device or "").startswith("cuda") else 0


class Meter:
    """Inference requests and compute time per (model, caller), counted in memory; flush() writes them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])

    def count(self, model: str, caller: str, seconds: float, requests: int = 1) -> None:
        with self._lock:
            counts = self._counts[(model, caller)]
            counts[0] += requests
            counts[1] += seconds

    def flush(self, store: Store) -> None:
        """Add what was counted since the last flush to the table (on the store's thread)."""
        with self._lock:
            counts, self._counts = self._counts, defaultdict(lambda: [0, 0.0])
        try:
            with transaction(store.db):
                for (model, caller), (requests, seconds) in counts.items():
                    add(store, caller, model, requests=requests, compute_s=seconds)
        except Exception:  # a busy or full database: the counts wait for the next poll
            for (model, caller), (requests, seconds) in counts.items():
                self.count(model, caller, seconds, int(requests))
            raise


def report(store: Store, since: date | None = None, by: str | None = None) -> list[dict[str, Any]]:
    """Rows by day, then by user and model (by=None), by user or by model; hours, not seconds."""
    keys = {"user": ["actor"], "model": ["model"], None: ["actor", "model"]}[by]
    rows = store.db.execute(
        f"SELECT day, {', '.join(keys)}, SUM(cpu_s), SUM(gpu_s), SUM(job_attempts), SUM(requests), SUM(compute_s)"
        f" FROM usage WHERE day >= ? GROUP BY day, {', '.join(keys)} ORDER BY day, {', '.join(keys)}",
        ((since or date.min).isoformat(),),
    ).fetchall()
    names = ["day", *("user" if key == "actor" else key for key in keys)]
    return [{**dict(zip(names, row)), "cpu_hours": round(row[-5] / 3600, 6), "gpu_hours": round(row[-4] / 3600, 6),
             "job_attempts": row[-3], "requests": row[-2], "inference_hours": round(row[-1] / 3600, 6)}
            for row in rows]
