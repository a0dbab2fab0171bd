"""One job, run in its own process: the steps of its kind, with progress and a clean stop.

The daemon starts `python -m appliance.worker JOB_ID OWNER [MAX_THREADS]` for a job it has claimed
and writes the store's passphrase (or an empty line) to its stdin: secrets never go
into argv or the environment. The process dies with the daemon (PR_SET_PDEATHSIG), so
a `kill -9` of the daemon cannot leave a second copy of a job running beside the one
a restarted daemon resumes.

Steps record what they made in the job's state as they finish, so a later attempt
(after preemption, a shutdown or a crash) skips them, and training resumes from its
checkpoint. SIGTERM asks the running step to checkpoint and stop: exit code
EXIT_STOPPED, and the daemon requeues or cancels the job. A failure is recorded in
the job with its message (exit 1); a crash or an out-of-memory kill the daemon
records from the exit status.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from appliance import burst, config, datasets, feedback, jobs, pipeline, registry, sources, store
from appliance.errors import ApplianceError
from appliance.jobspec import OptimizeJob, PipelineJob, Spec, TrainJob, TuneJob, base_dir
from appliance.store import Store

log = logging.getLogger("appliance.worker")

EXIT_STOPPED = 75  # EX_TEMPFAIL: checkpointed and stopped on request; run it again later
PROGRESS_EVERY_S = 1.0
T = TypeVar("T")


class Stopped(Exception):
    """The job was asked to stop (SIGTERM) or lost its claim, and has checkpointed."""


class Job:
    """What a step may do: read the typed spec and the state, save state, report progress, check for a stop."""

    def __init__(self, store: Store, job: jobs.Job, owner: str, max_threads: int | None = None) -> None:
        self.store, self.id, self.owner, self.max_threads = store, job.id, owner, max_threads
        self.claimed, self.state = job, dict(job.state)
        self.actor = job.submitted_by
        self.stop_requested = False
        self._last_report = 0.0

    @property
    def spec(self) -> Spec:
        """The job's parameters, typed; JobError (the job fails) for a row that no longer passes."""
        return self.claimed.spec

    def should_stop(self) -> bool:
        return self.stop_requested

    def between(self, made: T) -> T:
        """Pass a step's result on, unless a stop was asked for while it ran: its state is saved, so stop here."""
        if self.stop_requested:
            raise Stopped
        return made

    def stage(self, name: str) -> None:
        jobs.set_stage(self.store, self.id, self.owner, name)
        log.info("stage: %s", name)

    def save(self, **made: Any) -> None:
        self.state = jobs.save_state(self.store, self.id, self.owner, **made)

    def report(self, data: dict[str, Any], force: bool = False) -> None:
        """Progress for the events stream, at most once a second; doubles as the heartbeat."""
        now = time.monotonic()
        if not force and now - self._last_report < PROGRESS_EVERY_S:
            return
        self._last_report = now
        if not jobs.heartbeat(self.store, self.id, self.owner):
            log.warning("another attempt owns this job now; stopping")
            self.stop_requested = True
            return
        jobs.progress(self.store, self.id, data)


# -- the steps -------------------------------------------------------------------


def import_step(job: Job, spec: PipelineJob) -> str:
    """The dataset version to train on: imported from spec.source, the newest version of spec.dataset
    extended with the feedback on spec.retrain's predictions, or named by spec.dataset."""
    if "dataset" in job.state:
        return job.state["dataset"]
    job.stage("import")
    if spec.retrain:
        version = (feedback.extend_dataset(job.store, spec.retrain, actor=job.actor)
                   if feedback.unused(job.store, spec.retrain) else datasets.get(job.store, spec.dataset))
    elif spec.source:
        version = datasets.import_data(  # a name inside daemon.import_dir, never a path
            job.store, sources.ImportDir(job.store.settings, spec.source), name=spec.dataset,
            task=spec.task, residency=spec.residency, actor=job.actor,
        )
    else:
        version = datasets.get(job.store, spec.dataset)
    job.save(dataset=version.ref)
    return version.ref


def train_step(job: Job, spec: TrainJob | PipelineJob, dataset: str) -> str:
    """A finished run's id: the run this job started earlier, resumed, or a new one."""
    from appliance.train import engine, runs  # torch loads in the worker, never in the daemon

    if "run_id" in job.state and runs.get(job.store, job.state["run_id"]).status == "finished":
        return job.state["run_id"]
    if spec.burst and "run_id" not in job.state:
        run_id = burst_step(job, spec, dataset)
        if run_id is not None:
            job.save(run_id=run_id)
            return run_id
    job.stage("train")
    suggest = not spec.burst  # a job that burst and fell back knows the cluster already

    def progress(report: engine.Progress) -> None:
        nonlocal suggest
        if suggest and report.step > 1 and (note := burst.suggestion(job.store.settings.burst, report.eta_s)):
            log.info("%s", note)
            suggest = False
        job.report({"stage": "train", "phase": report.phase, "epoch": report.epoch, "epochs": report.epochs,
                    "step": report.step, "total_steps": report.total_steps, "loss": round(report.loss, 5),
                    "samples_per_s": round(report.samples_per_s, 2), "eta_s": report.eta_s})

    if "run_id" not in job.state:
        run_id = engine.create(job.store, dataset=dataset, base_dir=base_dir(spec.base, job.store.settings),
                               params=spec.params, device=spec.device)
        job.save(run_id=run_id)
    if job.max_threads:
        log.info("a model is being served: training uses at most %d threads, at lower priority", job.max_threads)
    result = engine.resume(job.store, job.state["run_id"], progress=progress, should_stop=job.should_stop,
                           max_threads=job.max_threads)
    if result.status == "interrupted":
        raise Stopped
    job.report({"stage": "train", "metrics": result.metrics}, force=True)
    return result.run_id


def tune_step(job: Job, spec: TuneJob, dataset: str) -> str:
    """The best trial's run of a hyperparameter search named after this job, run or resumed to its budget."""
    from appliance.train import studies, tune  # torch and Optuna load in the worker, never in the daemon

    if "run_id" in job.state:
        return job.state["run_id"]
    job.stage("tune")
    if not studies.exists(job.store, job.id):
        request = tune.Request(
            dataset=dataset, base_dir=base_dir(spec.base, job.store.settings), budget_s=spec.budget_s,
            metric=spec.metric, narrowing=spec.space, base_params=spec.params, sampler=spec.sampler,
            device=spec.device)
        tune.create(job.store, request, study_id=job.id, actor=job.actor)

    def progress(report: tune.Progress) -> None:
        job.report({"stage": "tune", "step": round(report.spent_s), "total_steps": round(report.budget_s),
                    "trial": report.trial, "trials": report.trials, "pruned": report.pruned, "best": report.best,
                    "epoch": report.epoch, "epochs": report.epochs})

    result = tune.resume(job.store, job.id, progress=progress, should_stop=job.should_stop,
                         max_threads=job.max_threads)
    if result.status == "interrupted":
        raise Stopped
    job.report({"stage": "tune", "trials": result.trials, "pruned": result.pruned, "best": result.best_value},
               force=True)
    job.save(run_id=result.best_run_id)
    return result.best_run_id


def burst_step(job: Job, spec: TrainJob | PipelineJob, dataset: str) -> str | None:
    """Train on the Ray cluster: the finished local run's id, or None when it failed and may fall back to here."""
    settings = job.store.settings
    job.stage("burst")
    request = burst.Request(dataset, base_dir(spec.base, settings), spec.params, spec.device, job.id, job.actor)
    try:
        return burst.attempt(job.store, settings, request, _BurstWatcher(job), job.state.get("burst"), spec.fallback)
    except burst.Interrupted:
        raise Stopped from None


class _BurstWatcher:
    """The burst's view of this job: state, progress (the heartbeat), log lines, stop and cancel."""

    def __init__(self, job: Job) -> None:
        self.job = job

    def submitted(self, submission: dict[str, str]) -> None:
        self.job.save(burst=submission)

    def progress(self, data: dict[str, Any]) -> None:
        self.job.report(data)

    def log(self, line: str) -> None:
        log.info("%s", line)

    def should_stop(self) -> bool:
        return self.job.should_stop()

    def cancelled(self) -> bool:
        return jobs.get(self.job.store, self.job.id).cancel_requested


def register_step(job: Job, spec: TrainJob | PipelineJob | TuneJob, dataset: str, run_id: str) -> str:
    if "registered" in job.state:
        return job.state["registered"]
    name = spec.name or datasets.get(job.store, dataset).name
    version = pipeline.register_run(job.store, run_id, name, actor=job.actor)
    job.save(registered=version.ref)
    return version.ref


def optimize_step(job: Job, spec: OptimizeJob | PipelineJob | TuneJob, ref: str) -> str:
    if "optimized" in job.state:
        return job.state["optimized"]
    job.stage("optimize")
    options = spec.optimize_options()

    def progress(done: int, total: int, what: str) -> None:
        job.report({"stage": "optimize", "step": done, "total_steps": total, "what": what})

    version = pipeline.optimize_version(job.store, ref, options, progress=progress, actor=job.actor)
    job.save(optimized=version.ref)
    return version.ref


def deploy_step(job: Job, spec: PipelineJob | TuneJob, ref: str) -> None:
    if job.state.get("deployed") == ref:
        return
    job.stage("deploy")
    registry.deploy(job.store, ref, spec.canary_percent, actor=job.actor)
    job.save(deployed=ref)


def run(job: Job) -> dict[str, Any]:
    """The steps of the job's kind, in order, stopping between them when asked; returns the job's result."""
    spec = job.spec
    if isinstance(spec, OptimizeJob):
        return {"version": optimize_step(job, spec, spec.version)}
    dataset = job.between(import_step(job, spec) if isinstance(spec, PipelineJob) else spec.dataset)
    run_id = job.between(tune_step(job, spec, dataset) if isinstance(spec, TuneJob) else train_step(job, spec, dataset))
    registered = job.between(register_step(job, spec, dataset, run_id))
    if isinstance(spec, TrainJob):
        return {"run_id": run_id, "version": registered}
    optimized = job.between(optimize_step(job, spec, registered))
    if spec.deploy:
        deploy_step(job, spec, optimized)
    searched = {"study": job.id} if isinstance(spec, TuneJob) else {}
    return {"dataset": dataset, "run_id": run_id, "version": optimized, "deployed": spec.deploy, **searched}


# -- the process -------------------------------------------------------------------


def main(argv: list[str]) -> int:
    job_id, owner, *rest = argv
    max_threads = int(rest[0]) if rest else None  # given while a model is served: leave it cores
    passphrase = sys.stdin.readline().rstrip("\n") or None
    _die_with_parent()
    logging.basicConfig(format="%(message)s", level=logging.INFO, stream=sys.stderr)
    try:
        with store.open(config.load(), passphrase) as opened:
            return _run_claimed(opened, job_id, owner, max_threads)
    except ApplianceError as exc:  # the store itself could not be opened: the daemon records the exit
        log.error("%s", exc.message)
        return 1


def _run_claimed(opened: Store, job_id: str, owner: str, max_threads: int | None) -> int:
    job = Job(opened, jobs.get(opened, job_id), owner, max_threads)
    _on_sigterm(lambda: setattr(job, "stop_requested", True))
    try:
        result = run(job)
    except Stopped:
        log.info("checkpointed and stopped")
        return EXIT_STOPPED
    except ApplianceError as exc:
        message = exc.message + (f" ({exc.hint})" if exc.hint else "")
        log.error("failed: %s", message)
        jobs.fail(opened, job_id, owner, message)
        return 1
    except Exception as exc:  # a bug: the traceback goes to the job's log, one line reaches the job's error
        log.exception("failed with an internal error")
        jobs.fail(opened, job_id, owner, f"internal error: {type(exc).__name__}: {exc}")
        return 1
    jobs.finish(opened, job_id, owner, result)
    log.info("finished")
    return 0


def _on_sigterm(stop: Callable[[], None]) -> None:
    def handler(_signum: int, _frame: object) -> None:
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C at the daemon's terminal reaches the daemon, which decides


def _die_with_parent() -> None:
    """Ask Linux to kill this process when the daemon dies, however it dies."""
    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the heartbeat check still catches orphans
        return
    if os.getppid() == 1:  # the daemon died before the call above took effect
        os._exit(EXIT_STOPPED)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
