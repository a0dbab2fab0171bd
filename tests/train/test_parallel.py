"""Data-parallel training on one box: two processes joined by gloo, on the real store and a real (tiny) model."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from appliance.core.errors import JobError, PlanError
from appliance.store import Store
from appliance.train import engine, runs
from appliance.train.params import TrainParams
from tests.daemon import Daemon
from tests.train.test_engine import FAST


@pytest.mark.parametrize("base", ["tiny_base", "tiny_sentence_base"])  # a classifier read by the first token, the mean
def test_two_workers_learn_what_one_does_and_record_the_run_once(opened: Store, tickets: str, base: str,
                                                                 request: pytest.FixtureRequest) -> None:
    tiny_base: Path = request.getfixturevalue(base)
    one = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=TrainParams(**FAST))
    lines: list[str] = []
    two = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=TrainParams(**FAST, workers=2),
                       log=lines.append)

    assert two.status == "finished"
    assert two.metrics["accuracy"] == pytest.approx(one.metrics["accuracy"], abs=0.1), (one.metrics, two.metrics)
    run = runs.get(opened, two.run_id)
    assert run.plan["workers"] == 2 and run.plan["threads"] == 1
    assert any("data-parallel over 2 processes" in note for note in run.plan["notes"])
    history = runs.epochs(opened, two.run_id)
    assert [row.epoch for row in history] == list(range(1, len(history) + 1))  # the lead alone records
    assert two.steps == one.steps  # the same batches: each worker takes half of every one
    assert opened.db.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0] == 0


def test_a_data_parallel_run_stopped_resumes_to_where_it_would_have_ended(opened: Store, tickets: str,
                                                                           tiny_base: Path) -> None:
    params = TrainParams(**FAST, workers=2)
    straight = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=params)
    steps = iter(range(1000))
    stopped = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=params,
                           should_stop=lambda: next(steps) == 7)
    assert stopped.status == "interrupted" and stopped.steps == 8

    resumed = engine.resume(opened, stopped.run_id)
    assert resumed.status == "finished" and resumed.steps == straight.steps
    for name, value in straight.metrics.items():
        assert resumed.metrics[name] == pytest.approx(value, abs=1e-4), name


def test_a_worker_that_dies_fails_the_run_with_a_reason_instead_of_hanging(opened: Store, tickets: str,
                                                                           tiny_base: Path) -> None:
    def kill_the_helper(report: engine.Progress) -> None:
        if report.phase == "train":  # the first report, mid-training (the run goes on while the helper dies)
            for helper in multiprocessing.active_children():
                os.kill(helper.pid, signal.SIGKILL)

    with pytest.raises(JobError, match="a data-parallel worker stopped") as raised:
        engine.start(opened, dataset=tickets, base_dir=tiny_base, params=TrainParams(**FAST, workers=2),
                     progress=kill_the_helper)
    assert "--workers 1" in raised.value.hint


def test_more_workers_than_the_machine_has_are_refused_before_training(opened: Store, tickets: str,
                                                                        tiny_base: Path) -> None:
    with pytest.raises(PlanError, match="workers were asked for") as raised:
        engine.start(opened, dataset=tickets, base_dir=tiny_base, params=TrainParams(**FAST, workers=64))
    assert "or fewer workers" in raised.value.hint
    assert opened.db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


def test_fast_mode_takes_no_workers() -> None:
    with pytest.raises(ValueError, match="fast mode trains a linear head in seconds, in one process"):
        TrainParams(mode="fast", workers=2)


@pytest.mark.slow
def test_the_cli_trains_data_parallel_through_the_daemon_and_says_so(daemon: Daemon) -> None:
    imported = daemon.cli("data", "import", str(daemon.settings.state_dir.parent / "tickets.csv"), "--name", "tickets")
    assert imported.returncode == 0, imported.stderr
    trained = daemon.cli("train", "--data", "tickets", "--mode", "full", "--epochs", "2", "--lr", "3e-3",
                         "--batch-size", "16", "--workers", "2")
    assert trained.returncode == 0, trained.stderr
    assert "data-parallel over 2 workers: each trains on 8 of every batch of 16" in trained.stdout + trained.stderr
