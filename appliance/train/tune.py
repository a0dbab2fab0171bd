"""Hyperparameter search within a wall-clock budget: Optuna samples, the engine trains, the store remembers.

Each trial is an ordinary training run (engine.py), planned like any other, so the hardware
plan's memory check refuses a trial that would not fit before it starts (the trial is
recorded as refused and the search goes on). After every epoch the trial reports its best
validation metric so far to a successive-halving pruner (rungs at epochs 1, 3, 9: a trial
goes on only while it is in the top third of the trials that reached the same rung), and a
pruned trial ends there, its epochs kept. Trial 0 is the base configuration moved into the
space, so the search's best is never below what plain `appliance train` would give.

Every trial trains with max_minutes set to at most half the budget (MIN_TRIALS) and never
more than is left of it, and the engine bounds a run with its last evaluation, so the search
ends within its budget and at least two configurations are compared. When the first trial's
first epoch says that one training of the base configuration takes more than half the
budget, the search's log says so and what budget would let two finish; a search that ends
with fewer than two complete trials says that too. No trial starts when less time is left
than the quickest first epoch seen so far. Only the best trial's model is kept; the others
keep their curves.

The Optuna study lives in memory only: its trials are rows in the store (studies.py, and
runs.py for their curves), and resume() rebuilds it from them, so no search state is ever
written outside the encrypted, audited store. A trial cut by a stop (preemption, daemon
restart) resumes from its checkpoint and reports the rest of its epochs.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from appliance.core import hardware
from appliance.core.errors import JobError, PlanError
from appliance.core.text import duration
from appliance.data import datasets
from appliance.store import Store
from appliance.train import engine, runs, space, studies
from appliance.train.params import TrainParams

REDUCTION_FACTOR = 3  # a third of the trials reaching a rung go on to the next
STARTUP_TRIALS = 5  # random trials before TPE models the results
MAX_REFUSED_IN_A_ROW = 10  # the plan refused this many in a row: the space does not fit the box
MIN_TRIALS = 2  # no trial may take more than this share of the budget, so a search compares at least two


@dataclass(frozen=True)
class Request:
    dataset: str
    base_dir: Path
    budget_s: float
    metric: str = "macro_f1"
    narrowing: dict[str, Any] = field(default_factory=dict)  # entries in place of the task's default space
    base_params: TrainParams = field(default_factory=TrainParams)
    sampler: str = "tpe"  # or "random"
    device: str | None = None


@dataclass(frozen=True)
class Progress:
    """What a progress bar shows: the budget used, the trial running, the best so far."""

    spent_s: float
    budget_s: float
    trial: int
    trials: int
    pruned: int
    best: float | None
    epoch: int
    epochs: int


@dataclass(frozen=True)
class Result:
    study_id: str
    status: str  # finished | interrupted
    best_run_id: str | None
    best_value: float | None
    trials: int
    pruned: int


ProgressFn = Callable[[Progress], None]


def create(store: Store, request: Request, study_id: str | None = None, actor: str | None = None) -> str:
    """Record a new search, its space checked against the task and the base model; nothing trains yet."""
    if request.sampler not in ("tpe", "random"):
        raise JobError(f"unknown sampler {request.sampler!r}", hint="use tpe or random")
    if request.metric not in ("macro_f1", "accuracy"):
        raise JobError(f"cannot tune for {request.metric!r}", hint="tune for macro_f1 or accuracy")
    if request.budget_s <= 0:
        raise JobError(f"a budget of {request.budget_s:g} s leaves no time to train", hint="give e.g. --budget 30m")
    version = datasets.get(store, request.dataset)
    searched = space.narrowed(version.task, request.narrowing)
    if version.task != datasets.IMAGE:
        searched = space.cap(searched, "max_length", hardware.max_positions(request.base_dir))
    if request.base_params.mode == "fast":
        raise JobError("a search tunes full fine-tuning: fast mode trains only a linear head, with little to tune",
                       hint="train in fast mode with 'appliance train --mode fast', or tune without it")
    base = request.base_params.full().changed(metric=request.metric)  # each trial is measured, not auto
    return studies.create(store, dataset_id=version.id, base_model=str(request.base_dir), task=version.task,
                          metric=request.metric, sampler=request.sampler, space=searched, base_params=base.model_dump(),
                          device=request.device, budget_s=request.budget_s, study_id=study_id, actor=actor).id


def start(store: Store, request: Request, *, progress: ProgressFn | None = None,
          should_stop: Callable[[], bool] = lambda: False, max_threads: int | None = None,
          log: engine.LogFn | None = None) -> Result:
    return resume(store, create(store, request), progress=progress, should_stop=should_stop, max_threads=max_threads,
                  log=log)


def resume(store: Store, study_id: str, *, progress: ProgressFn | None = None,
           should_stop: Callable[[], bool] = lambda: False, max_threads: int | None = None,
           log: engine.LogFn | None = None) -> Result:
    """Run a search, or continue one after a stop or a crash, until its budget is spent."""
    record = studies.get(store, study_id)
    if record.status != "finished":
        return _Search(store, record, progress, should_stop, max_threads, log).run()
    done = studies.trials(store, record.id)
    best = next(trial for trial in done if trial.run_id == record.best_run_id)
    return Result(record.id, "finished", record.best_run_id, best.value, len(done),
                  sum(trial.state == "pruned" for trial in done))


class _Search:
    def __init__(self, store: Store, record: studies.Study, progress: ProgressFn | None,
                 should_stop: Callable[[], bool], max_threads: int | None, log: engine.LogFn | None) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.store, self.record, self.progress = store, record, progress
        self.log = log or (lambda _line: None)
        self.should_stop, self.max_threads = should_stop, max_threads
        self.base = TrainParams.stored(record.base_params)
        self.done = studies.trials(store, record.id)
        self.study = _study(store, record, [trial for trial in self.done if trial.state != "running"])
        self.clock = time.monotonic()

    def spent(self) -> float:
        return self.record.spent_s + time.monotonic() - self.clock

    def run(self) -> Result:
        if self.record.status == "interrupted":
            studies.set_status(self.store, self.record.id, "running")
        running = next((trial for trial in self.done if trial.state == "running"), None)
        if running is not None:
            if not self._train(running.number, running.params, running.run_id):
                return self._interrupted()
        elif not self.done:
            self.study.enqueue_trial(space.nearest(self.record.space, self.base), skip_if_exists=True)
        refused = 0
        while self.record.budget_s - self.spent() > self._quickest_epoch():
            if self.should_stop():
                return self._interrupted()
            number = len(self.done)
            trial = self.study.ask()
            values = space.suggest(trial, self.record.space, self.base)
            share = min(self.record.budget_s - self.spent(), self.record.budget_s / MIN_TRIALS)
            params = self.base.changed(**values, max_minutes=share / 60)
            try:
                run_id = engine.create(self.store, dataset=self.record.dataset_id, base_dir=Path(self.record.base_model),
                                       params=params, device=self.record.device)
            except PlanError as exc:  # the memory pre-check: this trial would not fit here
                refused += 1
                self._add(studies.Trial(number, None, values, _distributions(trial), "refused", None, {}, exc.message))
                self.study.tell(trial, state=_optuna().trial.TrialState.FAIL)
                if refused >= MAX_REFUSED_IN_A_ROW:
                    raise PlanError(f"the hardware plan refused {refused} trials in a row: {exc.message}",
                                    hint="narrow the space to what fits: smaller batch_size, max_length, lora = true"
                                    ) from exc
                continue
            refused = 0
            self._add(studies.Trial(number, run_id, values, _distributions(trial), "running", None, {}, None))
            if not self._train(number, values, run_id, trial):
                return self._interrupted()
        return self._finish()

    def _add(self, trial: studies.Trial) -> None:
        studies.add_trial(self.store, self.record.id, trial)
        self.done.append(trial)

    def _train(self, number: int, values: dict[str, Any], run_id: str, trial: Any = None) -> bool:
        """Train (or resume) one trial to its end or its pruning; False if a stop came first."""
        optuna = _optuna()
        if trial is None:  # resumed: the same values, and the epochs it already reported
            self.study.enqueue_trial(values)
            trial = self.study.ask()
            space.suggest(trial, self.record.space, self.base)
        epochs = TrainParams.stored(runs.get(self.store, run_id).params).epochs
        best: float | None = None
        pruned = False
        for row in runs.epochs(self.store, run_id):
            best = max(best or row.metrics[self.record.metric], row.metrics[self.record.metric])
            trial.report(best, row.epoch)

        def on_epoch(row: runs.Epoch) -> bool:
            nonlocal best, pruned
            if number == 0 and row.epoch == 1:
                self._say_if_too_small(row.elapsed_s * epochs, epochs)
            best = max(best or row.metrics[self.record.metric], row.metrics[self.record.metric])
            trial.report(best, row.epoch)
            studies.spend(self.store, self.record.id, self.spent())
            pruned = row.epoch < epochs and trial.should_prune()
            return pruned

        def on_step(report: engine.Progress) -> None:
            if self.progress:
                self.progress(Progress(self.spent(), self.record.budget_s, number, len(self.done),
                                       self._count("pruned"), self._best(), report.epoch, report.epochs))

        result = engine.resume(self.store, run_id, progress=on_step, should_stop=self.should_stop,
                               max_threads=self.max_threads, on_epoch=on_epoch)
        if result.status == "interrupted":
            return False
        value = result.metrics.get(self.record.metric)
        if pruned:
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            self.study.tell(trial, value)
        attrs = self.study.trials[trial.number].system_attrs
        cut = "cut short by the budget" if self.spent() >= self.record.budget_s else None
        state = "pruned" if pruned else "complete"
        previous = self._best_trial()
        studies.end_trial(self.store, self.record.id, number, state, value, attrs, cut)
        ended = replace(self._trial(number), state=state, value=value, system_attrs=attrs, note=cut)
        self.done = [ended if trial.number == number else trial for trial in self.done]
        keep = self._best_trial()
        for loser in {previous and previous.run_id, run_id} - {keep and keep.run_id, None}:
            runs.drop_model(self.store, loser)  # only the best trial's model is kept
        studies.set_importances(self.store, self.record.id, _importances(self.store, self.record))
        studies.spend(self.store, self.record.id, self.spent())
        return True

    def _say_if_too_small(self, one_run_s: float, epochs: int) -> None:
        """After the base configuration's first epoch: say when the budget cannot hold two whole trainings."""
        if MIN_TRIALS * one_run_s > self.record.budget_s:
            self.log(f"one training of the base configuration ({epochs} epochs) takes about {duration(one_run_s)} here,"
                     f" so a {duration(self.record.budget_s)} budget cannot compare two whole trainings: each trial"
                     f" gets at most {duration(self.record.budget_s / MIN_TRIALS)} and is cut there; a budget of"
                     f" {duration(MIN_TRIALS * one_run_s * 1.1)} would let two finish")

    def _finish(self) -> Result:
        best = self._best_trial()
        if best is None:
            raise JobError(f"no trial finished within the budget of {self.record.budget_s:.0f} s",
                           hint="give a longer --budget, or narrow the space to fewer epochs")
        complete = self._count("complete")
        if complete < MIN_TRIALS:
            self.log(f"the search compared {complete} complete trial{'s' * (complete != 1)} in its budget: its best is"
                     " what one training gives; give a longer --budget to search")
        studies.set_status(self.store, self.record.id, "finished", best.run_id)
        return Result(self.record.id, "finished", best.run_id, best.value, len(self.done), self._count("pruned"))

    def _interrupted(self) -> Result:
        studies.spend(self.store, self.record.id, self.spent())
        studies.set_status(self.store, self.record.id, "interrupted")
        best = self._best_trial()
        return Result(self.record.id, "interrupted", best and best.run_id, best and best.value, len(self.done),
                      self._count("pruned"))

    def _trial(self, number: int) -> studies.Trial:
        return next(trial for trial in self.done if trial.number == number)

    def _best_trial(self) -> studies.Trial | None:
        complete = [trial for trial in self.done if trial.state == "complete" and trial.value is not None]
        return max(complete, key=lambda trial: (trial.value, -trial.number), default=None)

    def _best(self) -> float | None:
        best = self._best_trial()
        return best.value if best else None

    def _count(self, state: str) -> int:
        return sum(trial.state == state for trial in self.done)

    def _quickest_epoch(self) -> float:
        """The shortest first epoch of any trial so far: less time than that left trains nothing useful."""
        firsts = [history[0].elapsed_s for trial in self.done if trial.run_id
                  and (history := runs.epochs(self.store, trial.run_id))]
        return min(firsts, default=0.0)


def _optuna() -> Any:
    import optuna

    return optuna


def _study(store: Store, record: studies.Study, done: list[studies.Trial]) -> Any:
    """An in-memory Optuna study holding the trials the store recorded."""
    optuna = _optuna()
    seed = TrainParams.stored(record.base_params).seed + len(done)  # a resumed search samples anew, not the same again
    sampler = (optuna.samplers.RandomSampler(seed=seed) if record.sampler == "random"
               else optuna.samplers.TPESampler(seed=seed, n_startup_trials=STARTUP_TRIALS))
    pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=REDUCTION_FACTOR)
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    states = {"complete": optuna.trial.TrialState.COMPLETE, "pruned": optuna.trial.TrialState.PRUNED,
              "refused": optuna.trial.TrialState.FAIL}
    for trial in done:
        distributions = {name: optuna.distributions.json_to_distribution(text)
                         for name, text in trial.distributions.items()}
        curve: dict[int, float] = {}
        for row in runs.epochs(store, trial.run_id) if trial.run_id else []:
            curve[row.epoch] = max(curve.get(row.epoch - 1, 0.0), row.metrics[record.metric])
        study.add_trial(optuna.trial.create_trial(
            state=states[trial.state], value=trial.value if trial.state == "complete" else None,
            params={name: trial.params[name] for name in distributions}, distributions=distributions,
            intermediate_values=curve, system_attrs=trial.system_attrs))
    return study


def _distributions(trial: Any) -> dict[str, str]:
    optuna = _optuna()
    return {name: optuna.distributions.distribution_to_json(value) for name, value in trial.distributions.items()}


def _importances(store: Store, record: studies.Study) -> dict[str, float]:
    """Each searched parameter's share of the metric's variance over finished trials (Optuna's PED-ANOVA)."""
    optuna = _optuna()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    done = [trial for trial in studies.trials(store, record.id) if trial.state in ("complete", "pruned", "refused")]
    if sum(trial.state == "complete" for trial in done) < 2:
        return {}
    try:
        with warnings.catch_warnings():  # few trials: "importances will be equal", which the figures show anyway
            warnings.simplefilter("ignore", UserWarning)
            return dict(optuna.importance.get_param_importances(_study(store, record, done)))
    except (ValueError, RuntimeError):  # too few distinct values to tell anything apart
        return {}
