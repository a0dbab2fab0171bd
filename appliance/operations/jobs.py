"""The job queue: submitted work, its state and its events, in SQLite.

A job is claimed by one attempt at a time: claim() moves it from queued to running
under a new owner id in one transaction, and every later write of that attempt
(heartbeat, stage, finish) names the owner, so an attempt that lost its claim (the
daemon restarted and requeued the job) can no longer change it. A job's `state`
holds what each finished step made (dataset version, run id, model version): a new
attempt reads it and skips those steps, and training resumes from its checkpoint,
so nothing is lost and nothing is done twice.

Each change of a job also goes out as an event (events.py) for user interfaces.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass
from typing import Any

from appliance.core import clock
from appliance.core.errors import ApplianceError, JobError, JobNotFound, Overloaded
from appliance.core.text import duration
from appliance.data import datasets
from appliance.operations import jobspec
from appliance.store import Store, alerts, audit, blobs, events
from appliance.store.db import transaction
from appliance.train import runs, studies

ACTIVE = ("queued", "running")
MAX_QUEUED = 1000  # jobs waiting at once: each is a row and a log to keep, and they run one at a time
ENDED = ("finished", "failed", "cancelled")
_COLUMNS = (
    "id, kind, params, priority, status, stage, state, result, error, attempts, owner, pid, heartbeat_at, "
    "cancel_requested, submitted_by, submitted_at, started_at, finished_at"
)


@dataclass(frozen=True)
class Job:
    id: str
    kind: str
    params: dict[str, Any]  # as given (jobspec's dump), for showing; `spec` reads them typed
    priority: int
    status: str  # queued | running | finished | failed | cancelled
    stage: str | None
    state: dict[str, Any]
    result: dict[str, Any] | None
    error: str | None
    attempts: int
    owner: str | None
    pid: int | None
    heartbeat_at: str | None
    cancel_requested: bool
    submitted_by: str
    submitted_at: str
    started_at: str | None
    finished_at: str | None

    def shown(self) -> dict[str, Any]:
        """The job as a viewer may read it: all of it but the burst's data key (wrapped under the master key), which
        only the job itself needs, to read what the cluster sends back."""
        shown = asdict(self)
        if isinstance(burst := self.state.get("burst"), dict) and "key" in burst:
            shown["state"] = {**self.state, "burst": {name: value for name, value in burst.items() if name != "key"}}
        return shown

    @property
    def role(self) -> str:
        """Who may submit it, and so cancel or delete it: an export, whose archive waits in the store for an admin
        to take, is an admin's (a kind this release does not know, too)."""
        kind = jobspec.SPECS.get(self.kind)
        return kind.role if kind is not None else "admin"

    @property
    def spec(self) -> jobspec.Spec:
        """The parameters, typed; JobError if a row written by an older appliance no longer passes."""
        return jobspec.parse(self.kind, self.params)


def submit(store: Store, spec: jobspec.Spec, priority: int = 0, actor: str | None = None) -> Job:
    """Queue a job; the daemon's worker picks it up by priority, then age.

    The spec was checked as it was parsed; what it names on disk is checked here, where the settings are.
    """
    jobspec.confine(spec, store)
    queued = store.db.execute("SELECT COUNT(*) FROM jobs WHERE status = 'queued'").fetchone()[0]
    if queued >= MAX_QUEUED:
        raise Overloaded(f"{queued} jobs are queued already, the most the queue holds",
                         hint="wait for some to run, or cancel those no longer needed ('appliance jobs list')")
    low, high = jobspec.PRIORITY
    if not low <= priority <= high:
        raise JobError(f"priority: {priority} is not a whole number from {low} to {high}",
                       hint="higher runs first and may preempt lower")
    job_id = secrets.token_hex(6)
    with audit.operation(store, "job.submit", job_id, actor=actor, kind=spec.kind, priority=priority):
        store.db.execute(
            "INSERT INTO jobs (id, kind, params, priority, status, submitted_by, submitted_at)"
            " VALUES (?, ?, ?, ?, 'queued', ?, ?)",
            (job_id, spec.kind, json.dumps(spec.dump()), priority, actor or audit.default_actor(), clock.stamp()),
        )
        events.emit(store, "job", job_id, "queued", {"kind": spec.kind, "priority": priority})
    return get(store, job_id)


def get(store: Store, job_id: str) -> Job:
    row = store.db.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None:
        raise JobNotFound(f"no job with id {job_id!r}", hint="'appliance jobs list' shows every job")
    return _job(row)


def list_jobs(store: Store, status: str | None = None, limit: int | None = None) -> list[Job]:
    """Every job (or those with this status), newest first; the newest `limit` of them where one is given."""
    where, params = ("WHERE status = ?", (status,)) if status else ("", ())
    return [_job(row) for row in store.db.execute(f"SELECT {_COLUMNS} FROM jobs {where} ORDER BY rowid DESC LIMIT ?",
                                                  (*params, -1 if limit is None else limit))]


def newest(store: Store, kind: str, param: str, value: str) -> Job | None:
    """The job of this kind submitted last whose parameter `param` is `value` (the autopilot's last retrain)."""
    if not param.isidentifier():
        raise ValueError(f"not a parameter name: {param!r}")
    row = store.db.execute(
        f"SELECT {_COLUMNS} FROM jobs WHERE kind = ? AND json_extract(params, '$.{param}') = ?"
        " ORDER BY submitted_at DESC, rowid DESC LIMIT 1", (kind, value)).fetchone()
    return _job(row) if row else None


def counts(store: Store) -> dict[str, int]:
    """How many jobs are in each status."""
    return dict(store.db.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status").fetchall())


def next_queued(store: Store) -> Job | None:
    """The job that should run next: highest priority, then oldest."""
    row = store.db.execute(
        f"SELECT {_COLUMNS} FROM jobs WHERE status = 'queued' AND cancel_requested = 0"
        " ORDER BY priority DESC, submitted_at, rowid LIMIT 1"
    ).fetchone()
    return _job(row) if row else None


def claim(store: Store, job_id: str) -> str | None:
    """Move a queued job to running under a new owner id; None if another attempt got it first."""
    owner = secrets.token_hex(8)
    now = clock.stamp()
    with transaction(store.db):
        changed = store.db.execute(
            "UPDATE jobs SET status = 'running', owner = ?, attempts = attempts + 1, heartbeat_at = ?,"
            " started_at = COALESCE(started_at, ?) WHERE id = ? AND status = 'queued'",
            (owner, now, now, job_id),
        ).rowcount
        if changed:
            events.emit(store, "job", job_id, "started", {"attempt": get(store, job_id).attempts})
    return owner if changed else None


def set_pid(store: Store, job_id: str, owner: str, pid: int) -> None:
    _owned_update(store, job_id, owner, "pid = ?", (pid,))


def heartbeat(store: Store, job_id: str, owner: str) -> bool:
    """Mark the attempt alive; False once it no longer owns the job (it should stop)."""
    return _owned_update(store, job_id, owner, "heartbeat_at = ?", (clock.stamp(),))


def set_stage(store: Store, job_id: str, owner: str, stage: str) -> None:
    if _owned_update(store, job_id, owner, "stage = ?, heartbeat_at = ?", (stage, clock.stamp())):
        events.emit(store, "job", job_id, "stage", {"stage": stage})


def save_state(store: Store, job_id: str, owner: str, **made: Any) -> dict[str, Any]:
    """Record what a finished step made, so a later attempt skips that step."""
    with transaction(store.db):
        state = {**get(store, job_id).state, **made}
        _owned_update(store, job_id, owner, "state = ?", (json.dumps(state),))
    return state


def progress(store: Store, job_id: str, data: dict[str, Any]) -> None:
    """A progress report (stage, step, loss, metric, ETA) for the events stream; not audited."""
    events.emit(store, "job", job_id, "progress", data)


_PHASES = {"contrast": "tuning the encoder on pairs (fast mode)", "embed": "embedding texts (fast mode)",
           "fit-head": "fitting the head on frozen features"}  # a training's phases other than its epochs


def progress_words(report: dict[str, Any]) -> str:
    """A progress report in a few words, as the CLI's progress bar and the TUI's job pane label it."""
    if report.get("stage") == "train":
        unit = "pairs" if report.get("phase") == "contrast" else "samples"
        speed = f", {report['samples_per_s']:.1f} {unit}/s" if report.get("samples_per_s") is not None else ""
        eta = f", eta {duration(report['eta_s'])}" if report.get("eta_s") is not None else ""
        doing = _PHASES.get(report.get("phase", "")) or (f"train epoch {report['epoch']}/{report['epochs']}, "
                                                         f"loss {report['loss']:.4f}")
        return doing + eta + speed  # where a narrow pane cuts the line, the speed goes first
    if report.get("stage") == "tune" and "trial" in report:
        best = f", best {report['best']:.4f}" if report.get("best") is not None else ""
        return (f"tune trial {report['trial']} epoch {report['epoch']}/{report['epochs']}, {report['pruned']} pruned"
                + best)
    return f"{report.get('stage', '')}: {report.get('what', '')}"


def log_lines(store: Store, job_id: str) -> list[str]:
    """What the job's processes wrote, oldest first."""
    get(store, job_id)
    return [event.data["line"] for event in events.after(store, 0, job_id, limit=1_000_000) if event.kind == "log"]


def log(store: Store, job_id: str, line: str) -> None:
    events.emit(store, "job", job_id, "log", {"line": line})


def exited(store: Store, job_id: str, code: int) -> None:
    """The job's process is gone and every line it wrote is logged: after the event that ended the job (which the
    process records itself, before its last lines reach the log), this one ends its log."""
    events.emit(store, "job", job_id, "exited", {"code": code})


class LogEnd:
    """Fed a job's events in order from its first, tells when its log is whole: at `exited` after the event that
    ended the job (its process's last lines come after that one), or at that event if no process ran."""

    def __init__(self) -> None:
        self.process_runs = self.ended = False

    def whole_after(self, kind: str) -> bool:
        if kind == "started":
            self.process_runs, self.ended = True, False
        elif kind in ENDED:
            self.ended = True
        elif kind == "exited":
            self.process_runs = False
        return self.ended and not self.process_runs


def finish(store: Store, job_id: str, owner: str, result: dict[str, Any]) -> None:
    _end(store, job_id, owner, "finished", result=result)


def fail(store: Store, job_id: str, owner: str, error: str) -> None:
    _end(store, job_id, owner, "failed", error=error)


def requeue(store: Store, job_id: str, owner: str | None, reason: str) -> None:
    """Put a running job back in the queue (preempted, the daemon stopping or restarting)."""
    with transaction(store.db):
        changed = store.db.execute(
            "UPDATE jobs SET status = 'queued', owner = NULL, pid = NULL WHERE id = ? AND status = 'running'"
            " AND owner IS ?",
            (job_id, owner),
        ).rowcount
        if changed:
            events.emit(store, "job", job_id, "requeued", {"reason": reason})


def recover(store: Store) -> list[str]:
    """After a daemon start: every job left running by an earlier daemon goes back to the queue."""
    orphans = [row[0] for row in store.db.execute("SELECT id, owner FROM jobs WHERE status = 'running'")]
    for job_id in orphans:
        job = get(store, job_id)
        with audit.operation(store, "job.recover", job_id, actor="daemon", attempts=job.attempts):
            requeue(store, job_id, job.owner, "the daemon restarted")
    return orphans


def cancel(store: Store, job_id: str, actor: str | None = None) -> Job:
    """Cancel a queued job now; a running one is asked to stop and ends as cancelled."""
    with audit.operation(store, "job.cancel", job_id, actor=actor) as details:
        job = get(store, job_id)
        details["was"] = job.status
        if job.status not in ACTIVE:
            raise JobError(f"job {job_id} is already {job.status}", hint="only queued or running jobs can be cancelled")
        if job.status == "queued":
            store.db.execute(
                "UPDATE jobs SET status = 'cancelled', finished_at = ? WHERE id = ?", (clock.stamp(), job_id)
            )
            events.emit(store, "job", job_id, "cancelled", {})
        else:
            store.db.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?", (job_id,))
            events.emit(store, "job", job_id, "cancel-requested", {})
    return get(store, job_id)


def delete(store: Store, job_id: str, actor: str | None = None) -> Job:
    """Forget an ended job: its record and its log. What it made (runs, models) and the audit records stay."""
    with audit.operation(store, "job.delete", job_id, actor=actor) as details:
        job = get(store, job_id)
        if job.status in ACTIVE:
            raise JobError(f"job {job.id} is {job.status}, so it cannot be deleted",
                           hint=f"cancel it first ('appliance jobs cancel {job.id}'), then delete it")
        events.forget(store, "job", job.id)
        store.db.execute("DELETE FROM jobs WHERE id = ?", (job.id,))
        details.update(kind=job.kind, status=job.status)
        if (archive := (job.result or {}).get("archive_blob")) and blobs.exists(store, archive):
            blobs.delete(store, archive)
            details["archive"] = "deleted, never downloaded"
    return job


def take_export(store: Store, job_id: str, actor: str | None = None) -> bytes:
    """The archive a finished export job made, once: it leaves the store as it is handed over (audited as
    `model.export.download`)."""
    job = get(store, job_id)
    archive = (job.result or {}).get("archive_blob") if job.kind == "export" else None
    if job.status != "finished" or archive is None:
        raise JobError(f"job {job.id} is a {job.kind} job that is {job.status}: it has no export archive",
                       hint="name the job that 'appliance models export' started, once it has finished")
    if not blobs.exists(store, archive):
        raise JobError(f"the archive of export job {job.id} was downloaded already",
                       hint="export the model again: an archive is handed over once")
    with audit.operation(store, "model.export.download", job.params["version"], actor=actor, job=job.id,
                         sha256=job.result["sha256"]):
        data = blobs.read(store, archive)
        blobs.delete(store, archive)
    return data


def using_datasets(store: Store, names: set[str]) -> list[str]:
    """The queued or running jobs that train on a dataset of one of these names: changing it under them would
    train on what is being removed, or fail them."""
    return [job.id for status in ACTIVE for job in list_jobs(store, status) if _dataset_name(store, job) in names]


def using_run(store: Store, run_id: str) -> list[str]:
    """The queued or running jobs that train a run or will resume it."""
    return [job.id for status in ACTIVE for job in list_jobs(store, status)
            if run_id in (job.state.get("run_id"), job.params.get("resume"))]


def _dataset_name(store: Store, job: Job) -> str:
    """The name of the dataset a job trains on: as its parameters give it (raw: rows of any age), or the one
    the run or search it resumes started on."""
    resumed = job.params.get("resume")
    if resumed is None:
        return str(job.params.get("dataset") or "").partition(":")[0]
    try:
        started = runs.get(store, resumed) if job.kind == "train" else studies.get(store, resumed)
        return datasets.get(store, started.dataset_id).name
    except ApplianceError:  # nothing to resume, or its dataset is gone: the job will fail, not train on the rows
        return ""


def cancelled_while_running(store: Store, job_id: str, owner: str) -> None:
    """The attempt stopped because it was asked to: end the job as cancelled."""
    _end(store, job_id, owner, "cancelled")


# -- helpers -------------------------------------------------------------------


def _end(store: Store, job_id: str, owner: str, status: str, **fields: Any) -> None:
    details = {key: value for key, value in fields.items() if key == "error"}
    with audit.operation(store, f"job.{status}", job_id, actor="daemon", **details):
        if not _owned_update(
            store, job_id, owner, "status = ?, result = ?, error = ?, finished_at = ?, owner = NULL, pid = NULL",
            (status, json.dumps(fields.get("result")), fields.get("error"), clock.stamp()),
        ):
            raise JobError(f"job {job_id} is no longer run by this attempt", hint="a newer attempt owns it")
        events.emit(store, "job", job_id, status, {key: value for key, value in fields.items() if value is not None})
        if status == "failed":
            alerts.raise_alert(store, "job", job_id, "error", f"job {job_id} ({get(store, job_id).kind}) failed: "
                               f"{fields.get('error')}; 'appliance jobs logs {job_id}' shows its log")


def _owned_update(store: Store, job_id: str, owner: str, assignments: str, values: tuple[Any, ...]) -> bool:
    with transaction(store.db):
        return bool(
            store.db.execute(
                f"UPDATE jobs SET {assignments} WHERE id = ? AND owner = ? AND status = 'running'",
                (*values, job_id, owner),
            ).rowcount
        )


def _job(row: tuple) -> Job:
    values = dict(zip([name.strip() for name in _COLUMNS.split(",")], row))
    values["params"] = json.loads(values["params"])
    values["state"] = json.loads(values["state"])
    values["result"] = json.loads(values["result"]) if values["result"] else None
    values["cancel_requested"] = bool(values["cancel_requested"])
    return Job(**values)
