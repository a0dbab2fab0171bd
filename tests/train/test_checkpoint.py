"""Checkpoints written beside training: a copy of the state at its step, stored by a thread over its own connection."""

from __future__ import annotations

import pytest
import torch

from appliance.data import datasets
from appliance.store import Store, audit
from appliance.train import checkpoint, runs
from tests.conftest import write_tickets


@pytest.fixture
def run_id(opened: Store, tmp_path) -> str:
    version = datasets.import_file(opened, write_tickets(tmp_path / "tickets.csv"), name="tickets")
    return runs.create(opened, dataset_id=version.id, base_model="tiny-bert", task=version.task,
                       params={"epochs": 1}, plan={"device": "cpu"})


def test_a_checkpoint_holds_the_state_of_its_step_while_training_changes_it(opened: Store, run_id: str) -> None:
    weights = torch.zeros(1 << 20)
    writer = checkpoint.Writer(opened, run_id)
    try:
        writer.submit(7, checkpoint.snapshot({"model": {"w": weights}, "position": {"step": 7}}))
        weights += 1  # the next optimizer step, while the write is in flight
        runs.set_status(opened, run_id, "running")  # the store's own connection writes meanwhile
        saved = writer.wait()
    finally:
        writer.close()
    assert saved == checkpoint.latest(opened, run_id)
    stored = checkpoint.state(saved)
    assert stored["position"] == {"step": 7} and torch.equal(stored["model"]["w"], torch.zeros(1 << 20))
    assert [row["object"] for row in audit.rows(opened, action="checkpoint.save")] == [run_id]
    assert audit.verify(opened).ok  # two connections wrote to one chain


def test_a_failed_write_is_raised_to_the_training_loop_and_the_last_checkpoint_stays(
        opened: Store, run_id: str) -> None:
    writer = checkpoint.Writer(opened, run_id)
    try:
        writer.submit(1, {"position": {"step": 1}})
        writer.submit(2, {"position": {"step": 2}, "unpicklable": lambda: None})
        with pytest.raises(Exception, match="pickle"):
            writer.wait()
    finally:
        writer.close()
    assert checkpoint.state(checkpoint.latest(opened, run_id))["position"] == {"step": 1}
