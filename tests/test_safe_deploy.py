"""A job's new version never replaces production blindly: it challenges production on held-out validation data
first, then goes out as a canary, or waits for a person; real training, optimisation and store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from appliance import operations, registry
from appliance.cli.jobs import Foreground
from appliance.operations import jobspec, pipeline
from appliance.store import Store, audit
from appliance.train import engine
from appliance.train.params import TrainParams

GOOD = TrainParams(epochs=8, learning_rate=3e-3, batch_size=16, max_length=32, seed=3)
UNTRAINED = TrainParams(epochs=1, learning_rate=1e-7, batch_size=16, max_length=32, seed=3)
FP32 = pipeline.OptimizeOptions(int8=False)


def optimised(opened: Store, tickets: str, base: Path, params: TrainParams) -> registry.ModelVersion:
    result = engine.start(opened, dataset=tickets, base_dir=base, params=params)
    registered = pipeline.register_run(opened, result.run_id, "tickets")
    return pipeline.optimize_version(opened, registered.ref, FP32)


def deployed(opened: Store, version: registry.ModelVersion, how: str = "auto") -> dict:
    spec = jobspec.parse("pipeline", {"dataset": "tickets", "deploy": how})
    return operations.deploy(Foreground(opened, lambda *_: None, stoppable=False), spec, version.ref)


def challenges(opened: Store) -> list[dict]:
    return [json.loads(row["details"]) for row in audit.rows(opened) if row["action"] == "model.challenge"]


def test_a_new_version_challenges_production_before_it_takes_traffic(
    opened: Store, tickets: str, tiny_base: Path
) -> None:
    first = optimised(opened, tickets, tiny_base, GOOD)
    assert deployed(opened, first) == {"how": "production", "reason": "nothing served tickets yet"}
    assert challenges(opened) == []

    # As good as production on its validation data: a canary at the policy's share; production stays.
    equal = pipeline.optimize_version(opened, f"tickets:{first.version - 1}", FP32)  # the same weights again
    outcome = deployed(opened, equal)
    assert outcome["how"] == "canary" and outcome["reason"].startswith(f"{equal.ref} holds up")
    assert registry.get(opened, "tickets@production").version == first.version
    assert registry.canary_percent(opened, "tickets") == opened.settings.autopilot.default.canary_percent
    [evidence] = challenges(opened)
    assert evidence["production"] == first.ref and evidence["challenger"] == equal.ref and evidence["holds"]
    assert evidence["examples"] > 0 and evidence["challenger_accuracy"] == evidence["production_accuracy"]

    # Much worse: it waits, registered, and neither production nor the running canary moves.
    worse = optimised(opened, tickets, tiny_base, UNTRAINED)
    outcome = deployed(opened, worse)
    assert outcome["how"] == "waits" and outcome["reason"].startswith(f"{worse.ref} is worse")
    assert not outcome["challenge"]["holds"] and outcome["challenge"]["p_worse"] < 0.05
    assert outcome["challenge"]["only_production_right"] > outcome["challenge"]["only_challenger_right"]
    assert outcome["challenge"]["challenger_accuracy"] < outcome["challenge"]["production_accuracy"] - 0.02
    assert registry.get(opened, "tickets@production").version == first.version
    assert registry.get(opened, "tickets@candidate").version == equal.version
    assert [entry["holds"] for entry in challenges(opened)] == [True, False]

    # A person's explicit choice is what happens, unchallenged.
    assert deployed(opened, worse, "never")["how"] == "waits"
    assert deployed(opened, worse, "canary")["how"] == "canary"
    assert registry.get(opened, "tickets@candidate").version == worse.version
    assert deployed(opened, worse, "now")["how"] == "production"
    assert registry.get(opened, "tickets@production").version == worse.version
    assert registry.canary_percent(opened, "tickets") == 0
    assert len(challenges(opened)) == 2


def test_on_a_large_validation_split_the_guard_and_the_challenge_score_a_sample_and_say_so(
    opened: Store, tickets: str, tiny_base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each variant's score and each challenge is a pass over what it labels: past GUARD_SAMPLE examples, a sample."""
    first = optimised(opened, tickets, tiny_base, GOOD)
    deployed(opened, first)
    monkeypatch.setattr(pipeline, "GUARD_SAMPLE", 12)
    sampled = pipeline.optimize_version(opened, f"tickets:{first.version - 1}", FP32)
    assert sampled.reason.startswith("Scored on a stratified sample of 12 of the ")
    assert "validation examples. INT8 guard: " in sampled.reason
    assert "Scored on" not in first.reason  # all of a small split, as before

    outcome = deployed(opened, sampled)
    assert outcome["challenge"]["examples"] == 12 and outcome["challenge"]["held_out"] > 12
    assert f"on a sample of 12 of the {outcome['challenge']['held_out']} held-out examples" in outcome["reason"]
