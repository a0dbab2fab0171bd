"""The operations: each verb of the appliance implemented once, wherever it is asked for.

    import -> train (here, or on the Ray cluster) -> register -> optimise -> deploy | rollback

The worker runs them for the daemon's jobs and the CLI runs the same ones in the
foreground when no daemon answers; the control API calls `rollback` as well. Each takes a
typed spec (jobspec) and a Context, returns what it made, and is audited once, by the
store function it ends in (datasets.import_data, runs, registry).

A Context is where an operation runs. In a job (worker.Job) its state is the job's row,
so a step an earlier attempt finished is skipped and a run resumes from its checkpoint;
progress goes to the events stream and SIGTERM asks for a stop. In the foreground
(cli.jobs.Foreground) the state lives in memory, progress draws a bar and Ctrl-C asks.
An operation asked to stop checkpoints and raises Stopped.

Beside the verbs, in this package: their specs (jobspec), the steps over the store they
share (pipeline), the job queue (jobs) and the child process that runs a job (worker),
training on the cluster (burst, burst_remote), and the operations nobody types: the
autopilot's retrain and canary judge, and erasure (privacy).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from appliance import registry
from appliance.core.errors import ApplianceError, DatasetError, JobError, JobInterrupted
from appliance.core.text import counted, duration
from appliance.data import datasets, sources
from appliance.operations import burst, challenge, jobs, pipeline
from appliance.operations.jobspec import (
    ExportJob,
    OptimizeJob,
    PipelineJob,
    Spec,
    TrainJob,
    TuneJob,
    base_dir,
    resumed,
)
from appliance.registry import feedback
from appliance.store import Store, audit, blobs
from appliance.train import runs, studies

if TYPE_CHECKING:
    from appliance.train.engine import RunResult
    from appliance.train.params import TrainParams

log = logging.getLogger("appliance.operations")
# An optimisation with a time limit records the time it has spent this often, so that one resumed after a crash (not
# only after a stop) goes on with about what was left of its limit.
SPENT_SAVED_EVERY_S = 30.0
# Of a training's time limit, the least that a fallback after a failed burst keeps, however long the burst took.
FALLBACK_LEAST_SHARE = 0.25


class Stopped(Exception):
    """The operation was asked to stop, or lost its claim on the job, and has checkpointed; `made` is what it had
    made by then (run_id, study, ...), which a resume names."""

    def __init__(self, made: dict[str, Any]) -> None:
        super().__init__("stopped and checkpointed")
        self.made = dict(made)


class Context(Protocol):
    """Where an operation runs: what earlier attempts made, and where its progress and logs go."""

    id: str  # the name a burst is known by on the cluster: the job's id, or the foreground command's
    store: Store
    actor: str | None
    state: dict[str, Any]  # what earlier attempts made: dataset, run_id, study, registered,
    # optimize_spent_s (by attempts stopped while optimising), optimized, deployed, burst
    max_threads: int | None  # set while a model is served: training leaves it cores
    confined: bool  # a daemon's job opens model folders only where root configured; the CLI's user, their own

    def stage(self, name: str) -> None: ...
    def save(self, **made: Any) -> None: ...
    def report(self, data: dict[str, Any], force: bool = False) -> None: ...
    def log(self, line: str) -> None: ...
    def should_stop(self) -> bool: ...
    def cancelled(self) -> bool: ...


def import_dataset(ctx: Context, spec: PipelineJob) -> str:
    """The dataset version to train on: imported from spec.source, the newest version of spec.dataset
    extended with the feedback on spec.retrain's predictions, or named by spec.dataset."""
    if "dataset" in ctx.state:
        return ctx.state["dataset"]
    ctx.stage("import")
    if spec.retrain:
        version = (feedback.extend_dataset(ctx.store, spec.retrain, actor=ctx.actor)
                   if feedback.unused(ctx.store, spec.retrain) else datasets.get(ctx.store, spec.dataset))
    elif spec.source:
        version = datasets.import_data(  # a name inside daemon.import_dir, never a path
            ctx.store, sources.ImportDir(ctx.store.settings, spec.source), name=spec.dataset,
            task=spec.task, residency=spec.residency, actor=ctx.actor,
        )
    else:
        version = datasets.get(ctx.store, spec.dataset)
    ctx.save(dataset=version.ref)
    return version.ref


def train(ctx: Context, spec: TrainJob | PipelineJob, dataset: str, base: Path) -> RunResult:
    """A run trained on the dataset from the base model: on the Ray cluster when spec.burst (here again if that
    fails and may fall back, from the job's last checkpoint when it sent one home, else in what the burst left of the
    time limit), else here, resuming the run an earlier attempt started. Its status says whether it finished or was interrupted (checkpointed)."""
    from appliance.train import engine  # torch loads only where something trains

    if "run_id" not in ctx.state and isinstance(spec, TrainJob) and spec.resume:
        ctx.save(run_id=resumed(ctx.store, spec, confined=ctx.confined))
    if "run_id" in ctx.state and runs.get(ctx.store, ctx.state["run_id"]).status == "finished":
        return engine.RunResult.of(ctx.store, ctx.state["run_id"])
    params = None if "run_id" in ctx.state else _training_params(ctx, spec, dataset, base)
    if spec.burst and params is not None:
        if "burst_began" not in ctx.state:  # wall-clock: the cluster's job goes on while this one is restarted
            ctx.save(burst_began=time.time())
        run_id = _burst(ctx, spec, params, dataset, base)
        if run_id is not None:
            ctx.save(run_id=run_id)
            return engine.RunResult.of(ctx.store, run_id)
        if "run_id" not in ctx.state:  # else its last checkpoint came home: that run keeps the time it had left
            params = _left_after_burst(ctx, params)
    ctx.stage("train")
    suggest = not spec.burst  # a run that burst and fell back knows the cluster already

    def progress(report: engine.Progress) -> None:
        nonlocal suggest
        if suggest and report.step > 1 and (note := burst.suggestion(ctx.store.settings.burst, report.eta_s)):
            ctx.log(note)
            suggest = False
        ctx.report({"stage": "train", "phase": report.phase, "epoch": report.epoch, "epochs": report.epochs,
                    "step": report.step, "total_steps": report.total_steps, "loss": round(report.loss, 5),
                    "samples_per_s": round(report.samples_per_s, 2), "eta_s": report.eta_s})

    if params is not None and "run_id" not in ctx.state:
        ctx.save(run_id=engine.create(ctx.store, dataset=dataset, base_dir=base, params=params, device=spec.device,
                                      log=ctx.log))
    if ctx.max_threads:
        ctx.log(f"a model is being served: training uses at most {counted(ctx.max_threads, 'thread')}, at lower "
                "priority")
    result = engine.resume(ctx.store, ctx.state["run_id"], progress=progress, should_stop=ctx.should_stop,
                           max_threads=ctx.max_threads, log=ctx.log)
    if result.status == "finished":
        ctx.report({"stage": "train", "metrics": result.metrics}, force=True)
    return result


def _training_params(ctx: Context, spec: TrainJob | PipelineJob, dataset: str, base: Path) -> TrainParams:
    """A new run's hyperparameters. A pipeline's time limit bounds the whole job: the training's share of it is said
    in the job's log."""
    if not isinstance(spec, PipelineJob) or spec.params.max_minutes is None:
        return spec.training_params()
    limit_s = spec.params.max_minutes * 60
    if spec.student_share_s is not None:
        ctx.log(f"the training has {duration(spec.student_share_s)} of the {duration(limit_s)} limit; the student "
                f"distilled from it learns in the other half{_student_said(ctx, spec, dataset, base, limit_s / 2)}")
        return spec.training_params()
    optimising_s = _optimising_s(ctx, "training", limit_s, spec, dataset, base)
    return spec.training_params(optimising_s)


def _optimising_s(ctx: Context, before: str, limit_s: float, spec: PipelineJob | TuneJob, dataset: str, base: Path
                  ) -> float:
    """How long the optimisation after the training (or search) will take at most, at this box's pace, with the
    challenge of production where the new version will face one; the job's log says how that splits its limit
    (pipeline.share_before)."""
    data = datasets.get(ctx.store, dataset)
    challenges = spec.deploy == "auto" and (spec.name or data.name) in registry.deployments(ctx.store)
    optimising_s = _optimisation_s(ctx.store, spec, data, base, challenges)
    share_s = pipeline.share_before(limit_s, optimising_s)
    after = "the optimisation" + (" and the challenge of production" if challenges else "")
    said = (f"{after} after the {before} take{'' if challenges else 's'} up to about {duration(optimising_s)} "
            f"({pipeline.pace(ctx.store).said()})")
    if share_s + optimising_s <= limit_s * 1.1:  # as near as a limit is kept
        ctx.log(f"{said}: the {before} has {duration(share_s)} of the {duration(limit_s)} limit")
    else:
        ctx.log(f"{said}, more than half of the {duration(limit_s)} limit: the {before} keeps half, so the job will "
                f"end about {duration(share_s + optimising_s - limit_s)} past it (a limit of "
                f"{duration(2 * optimising_s)} holds both)")
    return optimising_s


def _optimisation_s(store: Store, spec: PipelineJob | TuneJob, data: datasets.DatasetVersion, base: Path,
                    challenges: bool = False) -> float:
    """How long optimising a model trained from base on data takes here at most (pipeline.Pace), with the challenge
    of production where it will face one."""
    return pipeline.pace(store).seconds(pipeline.weight_bytes(base), len(data.split["validation"]), spec.int8,
                                        challenges)


def _student_said(ctx: Context, spec: PipelineJob | TuneJob, dataset: str, base: Path, share_s: float) -> str:
    """Where the student's half of a limit holds no more than optimising the teacher and the student takes (the
    student learns in what is left after the teacher's variants and as long again for its own:
    pipeline.optimize_version), what then, in words; '' where it holds more."""
    teacher_s = _optimisation_s(ctx.store, spec, datasets.get(ctx.store, dataset), base)
    if share_s > 2 * teacher_s:
        return ""
    return (f"; that holds no more than optimising the teacher and the student takes here (about "
            f"{duration(2 * teacher_s)}), so the student learns its least (one epoch, after its learning-rate "
            "search) and the job will end past the limit")


def _left_after_burst(ctx: Context, params: TrainParams) -> TrainParams:
    """A fallback's hyperparameters: its time limit less what the failed burst took, but at least
    FALLBACK_LEAST_SHARE of it, so that training here learns something (the job's log then says it ends late)."""
    if params.max_minutes is None:
        return params
    share_s, spent_s = params.max_minutes * 60, time.time() - ctx.state["burst_began"]
    least_s = FALLBACK_LEAST_SHARE * share_s
    if share_s - spent_s >= least_s:
        ctx.log(f"the burst took {duration(spent_s)}: training here has the {duration(share_s - spent_s)} left of "
                f"its {duration(share_s)}")
        return params.changed(max_minutes=(share_s - spent_s) / 60)
    ctx.log(f"the burst took {duration(spent_s)} of the training's {duration(share_s)}: training here has its least, "
            f"{duration(least_s)}, so the job will end about {duration(least_s + spent_s - share_s)} past its limit")
    return params.changed(max_minutes=least_s / 60)


def _burst(ctx: Context, spec: TrainJob | PipelineJob, params: TrainParams, dataset: str, base: Path) -> str | None:
    """Train on the Ray cluster: the finished local run's id, or None when it failed and may fall back to here."""
    ctx.stage("burst")
    request = burst.Request(dataset, base, params, spec.device, ctx.id, ctx.actor)
    try:
        return burst.attempt(ctx.store, ctx.store.settings, request, _BurstWatcher(ctx), ctx.state.get("burst"),
                             spec.fallback)
    except burst.Interrupted:
        raise Stopped(ctx.state) from None



@dataclass
class _BurstWatcher:
    """The burst's view of its context: the submission saved, progress, log lines, stop and cancel."""

    ctx: Context

    def submitted(self, submission: dict[str, str]) -> None:
        self.ctx.save(burst=submission)

    def progress(self, data: dict[str, Any]) -> None:
        self.ctx.report(data)

    def log(self, line: str) -> None:
        self.ctx.log(line)

    def should_stop(self) -> bool:
        return self.ctx.should_stop()

    def cancelled(self) -> bool:
        return self.ctx.cancelled()

    def resumable(self, run_id: str) -> None:
        self.ctx.save(run_id=run_id)  # training here goes on from it


def tune(ctx: Context, spec: TuneJob, dataset: str, base: Path, study_id: str | None) -> str:
    """The best trial's run of the hyperparameter search: spec.resume's, else study_id's (a new id when None),
    created or continued and run to its budget."""
    from appliance.train import tune as search  # torch and Optuna load only where something trains

    if "run_id" in ctx.state:
        return ctx.state["run_id"]
    ctx.stage("tune")
    if "study" not in ctx.state:
        if spec.resume:
            study_id = resumed(ctx.store, spec, confined=ctx.confined)
        elif study_id is None or not studies.exists(ctx.store, study_id):  # else an earlier attempt created it
            request = search.Request(dataset=dataset, base_dir=base, budget_s=_search_s(ctx, spec, dataset, base),
                                     metric=spec.metric, narrowing=spec.space, base_params=spec.params,
                                     sampler=spec.sampler, device=spec.device)
            if spec.optimize_options().distills:
                ctx.log(f"the search has {duration(request.budget_s)} of the {duration(spec.budget_s or 0.0)} budget; "
                        "the student distilled from its best trial learns in the other half"
                        + _student_said(ctx, spec, dataset, base, request.budget_s))
            study_id = search.create(ctx.store, request, study_id=study_id, actor=ctx.actor)
        ctx.save(study=study_id)
    study_id = ctx.state["study"]

    result = search.resume(ctx.store, study_id, progress=lambda report: ctx.report(_tune_progress(report)),
                           should_stop=ctx.should_stop, max_threads=ctx.max_threads, log=ctx.log)
    if result.status == "interrupted":
        raise Stopped(ctx.state)
    ctx.report({"stage": "tune", "trials": result.trials, "pruned": result.pruned, "best": result.best_value},
               force=True)
    ctx.save(run_id=result.best_run_id)
    return result.best_run_id


def _search_s(ctx: Context, spec: TuneJob, dataset: str, base: Path) -> float:
    """A new search's share of the job's budget: half where a student learns in the other half, else what the
    optimisation after it leaves."""
    budget_s = spec.budget_s or 0.0
    if spec.optimize_options().distills:
        return budget_s / 2
    optimising_s = _optimising_s(ctx, "search", budget_s, spec, dataset, base)
    if budget_s < 2 * optimising_s:  # a search shorter than the optimisation after it compares nothing
        raise JobError(f"a budget of {duration(budget_s)} holds no search: the optimisation after it takes up to"
                       f" about {duration(optimising_s)} here, and the search needs at least as long",
                       hint=f"give --budget {math.ceil(2 * optimising_s / 60)}m or more; nothing was trained")
    return pipeline.share_before(budget_s, optimising_s)


def _tune_progress(report: Any) -> dict[str, Any]:
    """A search's progress (train.tune.Progress) as the events stream and the progress bars read it."""
    return {"stage": "tune", "step": round(report.spent_s), "total_steps": round(report.budget_s),
            "trial": report.trial, "trials": report.trials, "pruned": report.pruned, "best": report.best,
            "epoch": report.epoch, "epochs": report.epochs}


def register(ctx: Context, name: str | None, dataset: str, run_id: str) -> registry.ModelVersion:
    """The finished run as the next version of `name` (default: the dataset's name)."""
    if "registered" in ctx.state:
        return registry.get(ctx.store, ctx.state["registered"])
    version = pipeline.register_run(ctx.store, run_id, name or datasets.get(ctx.store, dataset).name,
                                    actor=ctx.actor)
    ctx.save(registered=version.ref)
    return version


def optimise(ctx: Context, spec: OptimizeJob | PipelineJob | TuneJob, ref: str) -> registry.ModelVersion:
    """A new version of ref's model holding its fastest variant within the accuracy guard."""
    if "optimized" in ctx.state:
        return registry.get(ctx.store, ctx.state["optimized"])
    ctx.stage("optimize")
    options = spec.optimize_options()
    if isinstance(spec, TuneJob) and options.distills:  # the other half of the budget (_search_s)
        options = replace(options, within_s=studies.get(ctx.store, ctx.state["study"]).budget_s)
    spent_before = ctx.state.get("optimize_spent_s", 0.0)
    if options.within_s is not None:  # a stopped or crashed job goes on with what was left of its time limit
        options = replace(options, within_s=max(0.0, options.within_s - spent_before))
    started = saved = time.monotonic()

    def spent() -> float:
        return round(spent_before + time.monotonic() - started, 1)

    def progress(done: int, total: int, what: str) -> None:
        nonlocal saved
        ctx.report({"stage": "optimize", "step": done, "total_steps": total, "what": what})
        if options.within_s is not None and time.monotonic() - saved >= SPENT_SAVED_EVERY_S:
            ctx.save(optimize_spent_s=spent())
            saved = time.monotonic()

    try:
        version = pipeline.optimize_version(ctx.store, ref, options, progress=progress,
                                            should_stop=ctx.should_stop, actor=ctx.actor)
    except JobInterrupted:  # stopped while a student learnt: nothing was kept, and a resume starts the stage again
        ctx.save(optimize_spent_s=spent())
        raise Stopped(ctx.state) from None
    ctx.save(optimized=version.ref)
    return version


def export(ctx: Context, spec: ExportJob) -> dict[str, Any]:
    """The version as a signed archive in an open format, kept encrypted in the store for its one download."""
    from appliance.registry import exchange  # torch loads where the format needs a conversion

    ctx.stage("export")
    exported = exchange.export(ctx.store, spec.version, spec.format, spec.protection, actor=ctx.actor)
    return {"version": exported.ref, "format": exported.format, "protection": spec.protection,
            "sha256": exported.sha256, "bytes": len(exported.archive),
            "archive_blob": blobs.put(ctx.store, exported.archive)}


def deploy(ctx: Context, spec: PipelineJob | TuneJob, ref: str) -> dict[str, Any]:
    """Serve ref as spec.deploy says; what became of it (how: production, canary or waits) and why.

    Unless `never`, a model that serves nothing yet gets ref in production. Else `auto` first challenges production
    with ref (operations.challenge, audited as model.challenge): a canary if ref holds up, else it waits; a canary
    too when production cannot be challenged (its data erased, say), since the canary is judged on live feedback.
    """
    if "deployed" in ctx.state:
        return ctx.state["deployed"]
    ctx.stage("deploy")
    version = registry.get(ctx.store, ref)
    policy = ctx.store.settings.autopilot.policy(version.model)
    serving = registry.deployments(ctx.store).get(version.model)
    how, reason, evidence = "canary", f"deploy: {spec.deploy}", None
    if spec.deploy == "never":
        how = "waits"
    elif serving is None:
        how, reason = "production", f"nothing served {version.model} yet"
    elif spec.deploy == "now":
        how = "production"
    elif spec.deploy == "auto":
        production = registry.get(ctx.store, f"{version.model}:{serving.production}")
        try:
            with audit.operation(ctx.store, "model.challenge", version.ref, actor=ctx.actor) as details:
                verdict = challenge.challenge(ctx.store, version, production, policy.challenge_max_drop,
                                              policy.significance)
                evidence = verdict.evidence()
                details.update(evidence)
        except ApplianceError as exc:  # audited as failed on its way out
            reason = f"{production.ref} could not be challenged ({exc.message}): the canary is the test"
        else:
            how, reason = ("canary" if verdict.holds else "waits"), verdict.reason
    if how != "waits":
        registry.deploy(ctx.store, ref, (spec.canary_percent or policy.canary_percent) if how == "canary" else None,
                        actor=ctx.actor)
    ctx.log(f"{version.ref}: {'waits for a person' if how == 'waits' else how} ({reason})")
    outcome = {"how": how, "reason": reason} | ({"challenge": evidence} if evidence else {})
    ctx.save(deployed=outcome)
    return outcome


@dataclass(frozen=True)
class Rollback:
    """What a rollback did: stopped the model's canary, or moved production back to `production`."""

    model: str
    canary_stopped: bool
    production: int | None


def rollback(store: Store, model: str, actor: str | None = None) -> Rollback:
    """Stop a running canary; with none, production goes back to the version it had before."""
    if registry.canary_percent(store, model) > 0:
        registry.stop_canary(store, model, actor=actor)
        return Rollback(model, True, None)
    return Rollback(model, False, registry.rollback(store, model, actor=actor))


def describe_dataset(store: Store, ref: str) -> dict[str, Any]:
    """One dataset version as people read it (`data show`, the console's detail): its summary, examples per
    label, the model versions trained on it, the predictions whose true labels went into it, what replaced it."""
    version = datasets.get(store, ref)
    return {**version.summary(), "counts": datasets.label_counts(store, version),
            "models": registry.trained_on(store, {version.id}),
            "from_predictions": feedback.used_by(store, version.id),
            "replacement": datasets.get(store, version.replaced_by).ref if version.replaced_by else None}


def delete_dataset(store: Store, ref: str, actor: str | None = None) -> list[datasets.DatasetVersion]:
    """Delete a dataset's content (datasets.delete), refused while a queued or running job trains on it."""
    name = datasets.get(store, ref).name
    busy = jobs.using_datasets(store, {name})
    if busy:
        raise DatasetError(f"jobs {', '.join(busy)} train on {name}, so nothing was deleted",
                           hint="wait for them to finish or cancel them ('appliance jobs cancel ID'), then delete it")
    return datasets.delete(store, ref, actor=actor)


def discard_run(store: Store, run_id: str, actor: str | None = None) -> tuple[runs.Run, int]:
    """Give up a run that will not be resumed (runs.discard), refused while a queued or running job trains it or
    will resume it; the run, and the bytes its checkpoint took."""
    run = runs.get(store, run_id)
    if busy := jobs.using_run(store, run.id):
        raise JobError(f"job {', '.join(busy)} trains run {run.id} or will resume it, so nothing was discarded",
                       hint="cancel the job first ('appliance jobs cancel ID'), or let it finish")
    return runs.discard(store, run.id, actor)


def run(ctx: Context, spec: Spec, study_id: str | None = None, base: Path | None = None) -> dict[str, Any]:
    """A job's operations in order, stopping between them when asked; returns what the job made.

    study_id names a new search's study (a job names it after itself; None gives a new id). base is a model
    folder the CLI's user named for a run in the foreground, where a job names one in train.base_models_dir.
    """
    if isinstance(spec, OptimizeJob):
        return {"version": optimise(ctx, spec, spec.version).ref}
    if isinstance(spec, ExportJob):
        return export(ctx, spec)
    dataset = _between(ctx, import_dataset(ctx, spec) if isinstance(spec, PipelineJob) else _dataset(ctx, spec))
    base = base or base_dir(spec.base, ctx.store.settings, datasets.get(ctx.store, dataset).task)
    if isinstance(spec, TuneJob):
        run_id, summary = tune(ctx, spec, dataset, base, study_id), {}
    else:
        trained = train(ctx, spec, dataset, base)
        if trained.status != "finished":
            raise Stopped(ctx.state)
        run_id, summary = trained.run_id, {"metrics": trained.metrics, "steps": trained.steps,
                                           "stopped_early": trained.stopped_early,
                                           "outcome": asdict(trained.outcome) if trained.outcome else None}
    run_id = _between(ctx, run_id)
    registered = _between(ctx, register(ctx, spec.name, dataset, run_id)).ref
    if isinstance(spec, TrainJob):
        return {"run_id": run_id, "version": registered, **summary, "trained_on": runs.get(ctx.store, run_id).trained_on}
    optimized = _between(ctx, optimise(ctx, spec, registered)).ref
    deployed = deploy(ctx, spec, optimized)
    searched = {"study": ctx.state.get("study", study_id)} if isinstance(spec, TuneJob) else {}
    return {"dataset": dataset, "run_id": run_id, "version": optimized, "deployed": deployed, **searched}


def _dataset(ctx: Context, spec: TrainJob | TuneJob) -> str:
    """The dataset a run or search trains on: the spec's, or the one the run or search it resumes started on."""
    if spec.dataset is not None:
        return spec.dataset
    resumed = runs.get(ctx.store, spec.resume) if isinstance(spec, TrainJob) else studies.get(ctx.store, spec.resume)
    return datasets.get(ctx.store, resumed.dataset_id).ref


def _between(ctx: Context, made: Any) -> Any:
    """Pass an operation's result on, unless a stop was asked for while it ran: its state is saved, so stop here."""
    if ctx.should_stop():
        raise Stopped(ctx.state)
    return made
