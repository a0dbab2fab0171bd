"""Hyperparameter search on the tiny model and the tickets data: real trials, real pruning, the real store."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.core.errors import ConfigError
from appliance.store import Store, audit
from appliance.train import engine, runs, space, studies, tune
from appliance.train.params import TrainParams
from tests.daemon import TINY

# Wide enough that some trials learn nothing in an epoch (and are pruned), small enough for seconds per trial.
NARROW = {"learning_rate": {"low": 1e-4, "high": 1e-2, "log": True}, "epochs": {"low": 3, "high": 8},
          "batch_size": [8, 16], "max_length": 32}
BASE = {**TINY, "epochs": 6}  # the tiny model needs a few epochs before trials differ


def _request(tickets: str, tiny_base: Path, budget_s: float, **extra) -> tune.Request:
    return tune.Request(dataset=tickets, base_dir=tiny_base, budget_s=budget_s, narrowing=NARROW,
                        base_params=TrainParams(**BASE), **extra)


@pytest.mark.slow
def test_a_search_stays_in_its_budget_prunes_and_beats_the_defaults(
    opened: Store, tickets: str, tiny_base: Path
) -> None:
    default = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=TrainParams(**BASE))
    reports: list[tune.Progress] = []
    result = tune.start(opened, _request(tickets, tiny_base, 60), progress=reports.append)

    record, ranked = studies.ranked(opened, result.study_id)
    assert result.status == "finished" and record.status == "finished"
    assert record.spent_s <= record.budget_s + 5  # one step and one evaluation of the tiny model at most
    assert result.pruned >= 1 and any(row.trial.state == "pruned" for row in ranked)
    assert result.best_value >= default.metrics["macro_f1"]
    assert ranked[0].trial.run_id == result.best_run_id and ranked[0].trial.value == result.best_value
    # Trial 0 is the base configuration; every trial that trained is a run with its curve.
    first = next(row.trial for row in ranked if row.trial.number == 0)
    assert first.params["learning_rate"] == TINY["learning_rate"] and first.params["batch_size"] == 16
    assert all(row.epochs for row in ranked if row.trial.run_id)
    pruned = next(row for row in ranked if row.trial.state == "pruned")
    assert len(pruned.epochs) < TrainParams(**runs.get(opened, pruned.trial.run_id).params).epochs
    # Only the best trial keeps a model.
    kept = [run.id for run in runs.list_runs(opened) if run.model_blob and run.id != default.run_id]
    assert kept == [result.best_run_id]
    assert reports and reports[-1].budget_s == 60 and reports[-1].trials >= 2
    actions = {row["action"] for row in audit.rows(opened)}
    assert {"tune.start", "tune.trial.start", "tune.trial.pruned", "tune.finished"} <= actions


def test_a_budget_too_small_for_two_trainings_is_said_with_the_budget_that_would_do(
    opened: Store, tickets: str, tiny_base: Path
) -> None:
    lines: list[str] = []
    request = tune.Request(dataset=tickets, base_dir=tiny_base, budget_s=2, base_params=TrainParams(**BASE),
                           narrowing={**NARROW, "epochs": 50})
    result = tune.start(opened, request, log=lines.append)
    record = studies.get(opened, result.study_id)
    assert result.status == "finished" and record.spent_s <= record.budget_s + 1
    [note] = [line for line in lines if line.startswith("one training of the base configuration (50 epochs) takes")]
    assert "so a 2s budget cannot compare two whole trainings: each trial gets at most 1s" in note
    assert "would let two finish" in note
    first = runs.get(opened, next(trial.run_id for trial in studies.trials(opened, result.study_id)
                                  if trial.number == 0))
    assert first.params["max_minutes"] <= 1 / 60  # half the budget: a second configuration gets its turn


@pytest.mark.slow
def test_a_stopped_search_resumes_its_study(opened: Store, tickets: str, tiny_base: Path) -> None:
    epochs_seen = []

    def stop_after_two_trials() -> bool:
        epochs_seen.append(1)
        return len(studies.trials(opened, study_id)) >= 3

    study_id = tune.create(opened, _request(tickets, tiny_base, 40))
    stopped = tune.resume(opened, study_id, should_stop=stop_after_two_trials)
    assert stopped.status == "interrupted"
    before = studies.trials(opened, study_id)
    assert [trial.state for trial in before][-1] == "running"
    assert runs.get(opened, before[-1].run_id).status == "interrupted"  # checkpointed mid-trial

    finished = tune.resume(opened, study_id)
    after = studies.trials(opened, study_id)
    assert finished.status == "finished" and len(after) > len(before)
    resumed = next(trial for trial in after if trial.number == before[-1].number)
    assert resumed.state in ("complete", "pruned") and resumed.run_id == before[-1].run_id
    assert [trial.params for trial in after[: len(before)]] == [trial.params for trial in before]
    assert studies.get(opened, study_id).spent_s <= 40 + 5


def test_a_space_file_narrows_the_default_and_bad_entries_are_named(tmp_path: Path) -> None:
    good = tmp_path / "space.toml"
    good.write_text('learning_rate = { low = 1e-4, high = 1e-3, log = true }\nbatch_size = [16, 32]\nlora = false\n')
    searched = space.narrowed("text-classification", space.read(good))
    assert searched["learning_rate"] == {"low": 1e-4, "high": 1e-3, "log": True}
    assert searched["batch_size"] == [16, 32] and searched["lora"] is False
    assert searched["epochs"] == space.TEXT["epochs"]  # untouched entries keep the default
    for text, words in (("learning_rat = 0.1", "cannot be searched"), ("epochs = { low = 5, high = 2 }", "5..2"),
                        ("batch_size = [16, 'x']", '"x" is not a whole number'), ("lora = [", "not valid TOML")):
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(ConfigError, match=words) as caught:
            space.read(bad)
        assert str(bad) in caught.value.message


def test_a_space_too_large_for_the_box_is_refused_before_training(
    opened: Store, tickets: str, tiny_base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from appliance.core import hardware
    from appliance.core.errors import PlanError

    monkeypatch.setattr(hardware, "BUDGET_SHARE", {"cpu": 1e-9, "cuda": 1e-9})  # a box with no memory to spare
    with pytest.raises(PlanError, match="refused 10 trials in a row"):
        tune.start(opened, _request(tickets, tiny_base, 30))
    study = studies.list_studies(opened)[0]
    assert {trial.state for trial in studies.trials(opened, study.id)} == {"refused"}
    assert not runs.list_runs(opened)
