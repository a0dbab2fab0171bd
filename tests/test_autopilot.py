"""The feedback loop's decisions: the canary judge as a function, and the triggers on a real store."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from appliance import registry
from appliance.core import config
from appliance.operations import autopilot, jobs, jobspec
from appliance.registry import feedback
from appliance.serve.metrics import LATENCY_BUCKETS, Counts
from appliance.store import Store, alerts, audit, blobs, events
from tests.test_feedback import answer, served_version

POLICY = config.Policy(enabled=True, canary_min_feedback=30, canary_max_feedback=200, new_examples=10,
                       accuracy_drop=10.0, min_feedback=10, cooldown_hours=1.0)


def evidence(correct: int, of: int) -> feedback.Evidence:
    return feedback.Evidence(of, correct)


def served(requests: int, under_s: float = 0.004, errors: int = 0) -> Counts:
    """Request counts as the server's metrics hold them: every answer under one latency bound."""
    latency = [float(requests) if bound >= under_s else 0.0 for bound in LATENCY_BUCKETS] + [float(requests)]
    return Counts({"200": float(requests), **({"503": float(errors)} if errors else {})}, latency)


def test_no_decision_without_enough_labels_on_both_versions() -> None:
    verdict = autopilot.judge(evidence(10, 29), evidence(29, 29), POLICY, served(100), served(100))
    assert verdict.decision == "wait" and "29 of the 30 labels" in verdict.reason


def test_a_clearly_better_candidate_is_promoted_with_its_evidence() -> None:
    verdict = autopilot.judge(evidence(15, 40), evidence(36, 40), POLICY, served(100), served(100))
    assert verdict.decision == "promote"
    assert verdict.evidence["candidate"]["accuracy"] == 0.9 and verdict.evidence["test"]["p_better"] < 0.001


def test_a_clearly_worse_candidate_is_rolled_back() -> None:
    verdict = autopilot.judge(evidence(36, 40), evidence(15, 40), POLICY, served(100), served(100))
    assert verdict.decision == "rollback" and "less accurate" in verdict.reason


def test_a_small_difference_waits_then_production_stays() -> None:
    assert autopilot.judge(evidence(30, 40), evidence(32, 40), POLICY, served(100), served(100)).decision == "wait"
    verdict = autopilot.judge(evidence(150, 200), evidence(155, 200), POLICY, served(400), served(400))
    assert verdict.decision == "rollback" and "no significant difference after 200 labels" in verdict.reason


def test_guards_roll_back_a_candidate_that_fails_or_is_slow_whatever_its_accuracy() -> None:
    better = (evidence(15, 40), evidence(36, 40))
    failing = autopilot.judge(*better, POLICY, served(100), served(95, errors=5))
    assert failing.decision == "rollback" and "failed 5.0% of 100 requests" in failing.reason
    slow = autopilot.judge(*better, POLICY, served(100, 0.004), served(100, 0.1))
    assert slow.decision == "rollback" and "p95 latency" in slow.reason
    within_resolution = autopilot.judge(*better, POLICY, served(100, 0.001), served(100, 0.005))
    assert within_resolution.decision == "promote"  # 5 ms against 1 ms: under the 10 ms slack


def test_the_test_statistic_matches_the_textbook() -> None:
    p_better, p_worse = autopilot.one_sided_p_values(evidence(45, 50), evidence(30, 50))  # z = 3.46
    assert p_better == pytest.approx(0.00027, abs=0.00005) and p_worse == pytest.approx(1, abs=0.001)
    assert autopilot.one_sided_p_values(evidence(50, 50), evidence(50, 50)) == (1.0, 1.0)


# -- on a real store ---------------------------------------------------------------------


def pilot_settings(opened: Store, policy: config.Policy = POLICY) -> config.Settings:
    return dataclasses.replace(opened.settings, autopilot=config.AutopilotSettings(check_s=0.2, default=policy))


def test_new_labels_start_one_retrain_then_the_cooldown_holds(opened: Store, tmp_path: Path) -> None:
    version = served_version(opened, tmp_path)
    pilot, settings = autopilot.Autopilot(dict), pilot_settings(opened)
    ids = answer(opened, feedback.PredictionLog(), version, [f"new words {n}" for n in range(10)])
    feedback.record(opened, [(i, "billing") for i in ids[:9]], actor="user:ann")
    pilot.tick(opened, settings)
    assert jobs.list_jobs(opened) == []  # 9 of 10
    feedback.record(opened, [(ids[9], "billing")], actor="user:ann")
    pilot._last = 0
    pilot.tick(opened, settings)
    [job] = jobs.list_jobs(opened)
    assert job.kind == "pipeline" and job.priority == POLICY.priority and job.submitted_by == autopilot.ACTOR
    # The default base model, named by no one; the run's parameters as stored, and those it stored none of as such a
    # run read them (truncation: head, from before the choice existed).
    assert job.params == {"retrain": "tickets", "dataset": "tickets", "name": "tickets",
                          "params": {"epochs": 3, "truncation": "head"}, "canary_percent": POLICY.canary_percent}
    assert job.spec.deploy == "auto" and job.spec.params.epochs == 3  # it challenges production first
    [record] = [row for row in audit.rows(opened) if row["action"] == "autopilot.retrain"]
    assert json.loads(record["details"])["trigger"] == "new-examples"
    jobs.cancel(opened, job.id)
    pilot._last = 0
    pilot.tick(opened, settings)
    assert len(jobs.list_jobs(opened)) == 1  # within the cooldown


def test_a_retrain_names_its_base_model_folder_or_says_once_why_it_cannot(
    opened: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    models = tmp_path / "models"
    (models / "small").mkdir(parents=True)
    version = served_version(opened, tmp_path, base_model=models / "small")
    ids = answer(opened, feedback.PredictionLog(), version, [f"new words {n}" for n in range(10)])
    feedback.record(opened, [(i, "billing") for i in ids], actor="user:ann")
    pilot, settings = autopilot.Autopilot(dict), pilot_settings(opened)
    with caplog.at_level(logging.INFO, logger="appliance.operations.autopilot"):
        for _ in range(2):  # no train.base_models_dir yet: the daemon could not load that base
            pilot._last = 0
            pilot.tick(opened, settings)
    assert jobs.list_jobs(opened) == [] and not audit.rows(opened, action="autopilot.retrain")
    said = [record.message for record in caplog.records if record.message.startswith("tickets:")]
    assert len(said) == 1 and "the daemon loads base models only from train.base_models_dir" in said[0]

    opened.settings = dataclasses.replace(opened.settings, base_models_dir=models)
    pilot._last = 0
    pilot.tick(opened, settings)
    [job] = jobs.list_jobs(opened)
    assert job.params["retrain"] == "tickets" and job.params["base"] == "small"
    assert jobspec.base_dir(job.spec.base, opened.settings) == models / "small"


def test_an_accuracy_drop_or_a_drift_alert_triggers_only_with_something_to_learn(opened: Store, tmp_path: Path) -> None:
    version = served_version(opened, tmp_path, accuracy=0.95)
    policy = dataclasses.replace(POLICY, new_examples=0)
    pilot, settings = autopilot.Autopilot(dict), pilot_settings(opened, policy)
    events.emit(opened, "drift", "tickets", "alert", {"version": "tickets:1", "feature": "tokens", "psi": 0.4})
    pilot.tick(opened, settings)
    assert jobs.list_jobs(opened) == []  # drift, but no labels: nothing to learn from
    ids = answer(opened, feedback.PredictionLog(), version, [f"text {n}" for n in range(10)])
    feedback.record(opened, [(i, "shipping" if n < 3 else "billing") for n, i in enumerate(ids)], actor="user:ann")
    pilot._last = 0
    pilot.tick(opened, settings)
    [job] = jobs.list_jobs(opened)
    [record] = [json.loads(row["details"]) for row in audit.rows(opened) if row["action"] == "autopilot.retrain"]
    assert record["trigger"] == "drift" and record["alert"]["psi"] == 0.4
    jobs.cancel(opened, job.id)
    opened.db.execute("UPDATE jobs SET submitted_at = '2000-01-01T00:00:00+00:00'")  # past the cooldown
    settings = pilot_settings(opened, dataclasses.replace(policy, retrain_on_drift=False))
    pilot._last = 0
    pilot.tick(opened, settings)
    details = json.loads([row for row in audit.rows(opened) if row["action"] == "autopilot.retrain"][-1]["details"])
    assert details["trigger"] == "accuracy" and details["live_accuracy"] == 0.7  # 25 points under 95%


def test_the_labels_that_called_for_a_retrain_do_not_call_for_the_next(opened: Store, tmp_path: Path) -> None:
    """A retrain whose canary lost must not be retried on the same evidence: only later predictions count."""
    version = served_version(opened, tmp_path, accuracy=0.95)
    policy = dataclasses.replace(POLICY, new_examples=0, cooldown_hours=0)
    pilot, settings = autopilot.Autopilot(dict), pilot_settings(opened, policy)
    ids = answer(opened, feedback.PredictionLog(), version, [f"text {n}" for n in range(10)])
    feedback.record(opened, [(i, "shipping" if n < 3 else "billing") for n, i in enumerate(ids)], actor="user:ann")
    pilot.tick(opened, settings)
    [first] = jobs.list_jobs(opened)
    opened.db.execute("UPDATE jobs SET status = 'finished'")  # it ran, and its canary was rolled back
    ids = answer(opened, feedback.PredictionLog(), version, [f"later text {n}" for n in range(10)])
    feedback.record(opened, [(i, "billing") for i in ids], actor="user:ann")  # production is right again
    pilot._last = 0
    pilot.tick(opened, settings)
    assert [job.id for job in jobs.list_jobs(opened)] == [first.id]
    ids = answer(opened, feedback.PredictionLog(), version, [f"new text {n}" for n in range(10)])
    feedback.record(opened, [(i, "shipping") for i in ids], actor="user:ann")  # and now wrong on new texts
    pilot._last = 0
    pilot.tick(opened, settings)
    assert len(jobs.list_jobs(opened)) == 2
    details = json.loads(audit.rows(opened, action="autopilot.retrain")[-1]["details"])
    assert details["trigger"] == "accuracy" and details["labels"] == 20 and details["live_accuracy"] == 0.5


def test_a_judged_canary_is_promoted_or_rolled_back_and_audited(opened: Store, tmp_path: Path) -> None:
    first = served_version(opened, tmp_path)
    log = feedback.PredictionLog()

    def canary() -> registry.ModelVersion:
        artifact = blobs.put(opened, np.random.bytes(16))
        made = registry.register(opened, "tickets", run_id=first.run_id, task=first.task, chosen="fp32", reason="t",
                                 variants=[registry.Variant("fp32", "openvino-ir", artifact, 10, {"accuracy": 0.9})])
        return registry.deploy(opened, made.ref, canary_percent=50)

    def labelled(version: registry.ModelVersion, right: int, of: int) -> None:
        ids = answer(opened, log, version, [f"{version.ref} {n}" for n in range(of)])  # all answered "billing"
        feedback.record(opened, [(i, "billing" if n < right else "shipping") for n, i in enumerate(ids)],
                        actor="user:ann")

    # Canaries are judged though the autopilot does not retrain this model (enabled is off): judge_canaries.
    settings = pilot_settings(opened, dataclasses.replace(POLICY, new_examples=0, enabled=False))
    pilot = autopilot.Autopilot(dict)
    good = canary()
    labelled(first, 12, 40)
    labelled(good, 20, 25)
    pilot.tick(opened, settings)
    assert registry.canary_percent(opened, "tickets") == 50  # 25 labels on the candidate: not enough
    labelled(good, 14, 15)
    pilot._last = 0
    pilot.tick(opened, settings)
    assert registry.get(opened, "tickets@production").version == good.version
    assert registry.canary_percent(opened, "tickets") == 0
    bad = canary()
    labelled(good, 36, 40)
    labelled(bad, 5, 40)
    pilot._last = 0
    pilot.tick(opened, settings)
    assert registry.get(opened, "tickets@production").version == good.version
    assert registry.canary_percent(opened, "tickets") == 0
    decisions = [(row["action"], row["object"], json.loads(row["details"])) for row in audit.rows(opened)
                 if row["action"].startswith("autopilot.")]
    assert [(action, obj) for action, obj, _ in decisions] == [("autopilot.promote", good.ref),
                                                               ("autopilot.rollback", bad.ref)]
    assert decisions[0][2]["candidate"] == {"feedback": 40, "correct": 34, "accuracy": 0.85}
    assert decisions[1][2]["test"]["p_worse"] < 0.05
    assert {row["actor"] for row in audit.rows(opened) if row["action"].startswith("autopilot.")} == {autopilot.ACTOR}
    (alert,) = alerts.listed(opened)  # a rollback waits for an operator's eye; a promotion does not
    assert alert.source == "autopilot" and alert.message.startswith(f"the canary {bad.ref} was rolled back")

    left_alone = canary()
    labelled(left_alone, 5, 40)
    pilot._last = 0
    pilot.tick(opened, pilot_settings(opened, dataclasses.replace(POLICY, enabled=False, judge_canaries=False)))
    assert registry.canary_percent(opened, "tickets") == 50  # nobody asked the daemon to judge it
