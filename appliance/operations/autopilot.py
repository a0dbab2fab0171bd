"""The feedback loop: retrain a served model when the evidence says so, then judge its canary.

The daemon's supervisor calls `Autopilot.tick()` every `autopilot.check_s`. For each
model in production, by its policy (config.Policy, per model):

- If a canary runs (one a job's safe deploy started, or a person), it is judged (`judge`)
  unless the policy's `judge_canaries` and `enabled` are both off: the candidate's and
  production's accuracy on feedback for predictions made since the canary started,
  compared with a one-sided two-proportion z-test, behind two guards read from the
  server's metrics (the candidate's error rate, and its p95 latency against
  production's). Significantly better: promoted. Significantly worse, a guard broken,
  or still undecided after `canary_max_feedback` labels each: rolled back, production
  stays. Fewer than `canary_min_feedback` labels on either side: no decision at all.
- Otherwise, if the policy is enabled and no retrain of the model is queued or running
  or began within `cooldown_hours`, the triggers are read in order: a drift alert on
  the production version, live accuracy on feedback (for predictions made since production
  moved or the last retrain began) `accuracy_drop` points under its validation accuracy,
  `new_examples` labels not trained on yet, the schedule. The first that fires submits an
  ordinary pipeline job (params.retrain) at the policy's priority: the feedback becomes a
  new dataset version, and the new model challenges
  production (operations.challenge) before it goes out as a canary taking
  `canary_percent` of traffic.

Every retrain, promotion and rollback is audited with its evidence (actor
`service:autopilot`) and sent as an event. A person overrides at any time: `appliance
deploy` and `rollback` (or the TUI) end a canary before it is judged.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from appliance import registry
from appliance.core import clock
from appliance.core.config import Policy, Settings
from appliance.core.errors import ApplianceError
from appliance.data import datasets
from appliance.operations import jobs, jobspec
from appliance.registry import feedback
from appliance.serve.metrics import Counts, estimate_quantile_s
from appliance.store import Store, alerts, audit, events
from appliance.train import runs
from appliance.train.params import TrainParams

log = logging.getLogger("appliance.operations.autopilot")

ACTOR = "service:autopilot"
LIVE_WINDOW = "24h"  # the live accuracy a drop is judged on
GUARD_MIN_REQUESTS = 50  # requests to the candidate before its error rate and latency count
LATENCY_SLACK_S = 0.010  # latency differences under this are within the histogram's resolution


@dataclass(frozen=True)
class Verdict:
    decision: str  # promote | rollback | wait
    reason: str
    evidence: dict[str, Any]


def judge(production: feedback.Evidence, candidate: feedback.Evidence, policy: Policy,
          production_counts: Counts, candidate_counts: Counts) -> Verdict:
    """What to do with a canary, from feedback on both versions since it started and their request counts."""
    evidence: dict[str, Any] = {
        "production": {"feedback": production.feedback, "correct": production.correct,
                       "accuracy": production.accuracy},
        "candidate": {"feedback": candidate.feedback, "correct": candidate.correct, "accuracy": candidate.accuracy}}
    errors = candidate_counts.failed  # 5xx only: a key holder's bad requests must not roll a canary back
    requests = candidate_counts.latency[-1] + errors  # the latency histogram counts the answered ones
    if requests >= GUARD_MIN_REQUESTS:
        zero = Counts.zero().latency
        p95 = {"production": estimate_quantile_s(zero, production_counts.latency, 0.95),
               "candidate": estimate_quantile_s(zero, candidate_counts.latency, 0.95)}
        evidence["guards"] = {"requests": int(requests), "error_rate": errors / requests,
                              "p95_ms": {name: round(value * 1000, 2) if value is not None else None
                                         for name, value in p95.items()}}
        if errors / requests > policy.canary_max_error_rate:
            return Verdict("rollback", f"the candidate failed {errors / requests:.1%} of {int(requests)} requests,"
                                       f" over the limit of {policy.canary_max_error_rate:.1%}", evidence)
        if (p95["production"] is not None and p95["candidate"] is not None
                and p95["candidate"] > policy.canary_max_latency_ratio * p95["production"]
                and p95["candidate"] - p95["production"] > LATENCY_SLACK_S):
            return Verdict("rollback", f"the candidate's p95 latency {p95['candidate'] * 1000:.1f} ms is over"
                                       f" {policy.canary_max_latency_ratio:g}x production's"
                                       f" {p95['production'] * 1000:.1f} ms", evidence)
    fewest = min(production.feedback, candidate.feedback)
    if fewest < policy.canary_min_feedback:
        return Verdict("wait", f"{fewest} of the {policy.canary_min_feedback} labels per version a decision needs",
                       evidence)
    p_better, p_worse = one_sided_p_values(candidate, production)
    evidence["test"] = {"kind": "two-proportion z-test, one-sided", "p_better": p_better, "p_worse": p_worse,
                        "significance": policy.significance}
    accuracies = f"{candidate.accuracy:.1%} against {production.accuracy:.1%}"
    if p_better < policy.significance:
        return Verdict("promote", f"the candidate is more accurate on feedback: {accuracies} (p = {p_better:.3g})",
                       evidence)
    if p_worse < policy.significance:
        return Verdict("rollback", f"the candidate is less accurate on feedback: {accuracies} (p = {p_worse:.3g})",
                       evidence)
    if fewest >= policy.canary_max_feedback:
        return Verdict("rollback", f"no significant difference after {fewest} labels per version ({accuracies}):"
                                   " production stays", evidence)
    return Verdict("wait", f"no significant difference yet ({accuracies})", evidence)


def one_sided_p_values(candidate: feedback.Evidence, production: feedback.Evidence) -> tuple[float, float]:
    """(p that the candidate is not better, p that it is not worse) under the pooled two-proportion z-test."""
    n1, n2 = candidate.feedback, production.feedback
    pooled = (candidate.correct + production.correct) / (n1 + n2)
    spread = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    if spread == 0:  # both all right or all wrong: no difference to see
        return 1.0, 1.0
    z = (candidate.correct / n1 - production.correct / n2) / spread
    below = 0.5 * (1 + math.erf(z / math.sqrt(2)))  # the normal CDF at z
    return 1 - below, below


class Autopilot:
    """Runs on the supervisor's thread with its store; `counts` reads the inference server's metrics."""

    def __init__(self, counts: Callable[[], dict[tuple[str, str], Counts]]) -> None:
        self._counts = counts
        self._last = 0.0
        self._noted: set[tuple[str, str]] = set()  # (model, note) already logged, so each is said once

    def tick(self, store: Store, settings: Settings) -> None:
        now = time.monotonic()
        if now - self._last < settings.autopilot.check_s:
            return
        self._last = now
        for model, deployed in registry.deployments(store).items():
            policy = settings.autopilot.policy(model)
            if deployed.canary_percent > 0:
                if policy.enabled or policy.judge_canaries:
                    self._judge(store, model, deployed, policy)
            elif policy.enabled:
                self._maybe_retrain(store, model, deployed, policy)

    # -- canaries ---------------------------------------------------------------------

    def _judge(self, store: Store, model: str, deployed: registry.Deployment, policy: Policy) -> None:
        production, candidate, since = deployed.production, deployed.candidate, deployed.canary_since
        assert candidate is not None  # a canary share is only ever set with a candidate
        counts = self._counts()
        verdict = judge(feedback.evidence(store, model, production, since),
                        feedback.evidence(store, model, candidate, since), policy,
                        counts.get((model, str(production)), Counts.zero()),
                        counts.get((model, str(candidate)), Counts.zero()))
        if verdict.decision == "wait":
            log.debug("%s: canary of version %d goes on: %s", model, candidate, verdict.reason)
            return
        ref = f"{model}:{candidate}"
        details = {"reason": verdict.reason, "production": production, "candidate": candidate, **verdict.evidence}
        with audit.operation(store, f"autopilot.{verdict.decision}", ref, actor=ACTOR, **details):
            if verdict.decision == "promote":
                registry.deploy(store, ref, actor=ACTOR)
            else:
                registry.stop_canary(store, model, actor=ACTOR)
            events.emit(store, "deploy", model, f"autopilot-{verdict.decision}", details)
            if verdict.decision == "rollback":
                alerts.raise_alert(store, "autopilot", model, "warning",
                                   f"the canary {ref} was rolled back: {verdict.reason}; {model}:{production} "
                                   "serves on")
        log.info("%s: %s (%s)", ref, "promoted" if verdict.decision == "promote" else "rolled back", verdict.reason)

    # -- retraining -------------------------------------------------------------------

    def _maybe_retrain(self, store: Store, model: str, deployed: registry.Deployment, policy: Policy) -> None:
        last = jobs.newest(store, "pipeline", "retrain", model)
        if last is not None and (last.status in jobs.ACTIVE
                                 or _age(last.submitted_at) < timedelta(hours=policy.cooldown_hours)):
            return
        production = registry.get(store, f"{model}:{deployed.production}")
        since = max(deployed.production_since, last.submitted_at if last else "")
        trigger = _trigger(store, model, production, policy, since)
        if trigger is None:
            return
        unused = feedback.unused(store, model)
        run = runs.get(store, production.run_id)
        trained_on = datasets.get(store, run.dataset_id)
        if not unused and datasets.get(store, trained_on.name).id == trained_on.id:
            self._note(model, f"{trigger['trigger']} calls for a retrain, but there are no new labels to learn"
                              " from: send feedback")
            return
        try:  # a lasting refusal is said once, not audited at every check
            spec = jobspec.PipelineJob(retrain=model, dataset=trained_on.name, name=model,
                                       base=_base_name(store.settings, run), params=TrainParams.stored(run.params),
                                       canary_percent=policy.canary_percent)
            jobspec.confine(spec, store)
        except ApplianceError as exc:
            self._note(model, f"{trigger['trigger']} calls for a retrain, but it cannot be submitted: {exc.message}")
            return
        with audit.operation(store, "autopilot.retrain", model, actor=ACTOR, **trigger, unused_labels=unused) as done:
            job = jobs.submit(store, spec, policy.priority, actor=ACTOR)
            done["job"] = job.id
            events.emit(store, "deploy", model, "autopilot-retrain", {**trigger, "job": job.id})
        log.info("%s: retraining as job %s (%s)", model, job.id, trigger["reason"])

    def _note(self, model: str, note: str) -> None:
        if (model, note) not in self._noted:
            self._noted.add((model, note))
            log.info("%s: %s", model, note)


def _trigger(store: Store, model: str, production: registry.ModelVersion, policy: Policy,
             since: str) -> dict[str, Any] | None:
    """The first reason to retrain since production moved or the last retrain, with its evidence; None when none."""
    if policy.retrain_on_drift:
        alert = events.latest(store, "drift", "alert", model, since)
        if alert and alert.data.get("version") == production.ref:
            found = alert.data
            return {"trigger": "drift", "reason": f"drift alert at {alert.ts}: {found.get('feature')} PSI"
                                                  f" {found.get('psi')}", "alert": found}
    if policy.accuracy_drop:
        # Only predictions made since the last retrain: the labels that called for it (and that it learnt from, right
        # or wrong) must not call for the next one, or a rolled-back retrain would be retried on them without end.
        live = feedback.evidence(store, model, production.version,
                                 max(since, clock.stamp(clock.now() - feedback.WINDOWS[LIVE_WINDOW])))
        validation = production.variants[production.chosen].metrics.get("accuracy")
        if live.feedback >= policy.min_feedback and validation is not None:
            drop = (validation - live.accuracy) * 100
            if drop >= policy.accuracy_drop:
                return {"trigger": "accuracy", "reason": f"live accuracy {live.accuracy:.1%} on {live.feedback} labels"
                                                         f" is {drop:.1f} points under validation's {validation:.1%}",
                        "live_accuracy": live.accuracy, "labels": live.feedback, "validation_accuracy": validation}
    unused = feedback.unused(store, model)
    if policy.new_examples and unused >= policy.new_examples:
        return {"trigger": "new-examples", "reason": f"{unused} new labelled examples"}
    if policy.every_hours and _age(since) >= timedelta(hours=policy.every_hours):
        return {"trigger": "schedule", "reason": f"every {policy.every_hours:g} hours"}
    return None


def _base_name(settings: Settings, run: runs.Run) -> str | None:
    """The base model a retrain names: the run's own."""
    return jobspec.base_name(Path(run.base_model), settings)


def _age(stamp: str) -> timedelta:
    return clock.age(stamp) if stamp else timedelta.max
