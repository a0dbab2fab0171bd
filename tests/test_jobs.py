"""The job queue against a real store: ordering, claims, requeue after a crash, cancel, events."""

from __future__ import annotations

from datetime import timedelta

import pytest

from appliance import events, jobs
from appliance.errors import JobError, JobNotFound
from appliance.store import Store, audit


def _train(store: Store, priority: int = 0) -> jobs.Job:
    return jobs.submit(store, "train", {"dataset": "tickets"}, priority, actor="user:alice")


def test_the_next_job_is_the_highest_priority_then_the_oldest(opened: Store) -> None:
    first, urgent, second = _train(opened), _train(opened, priority=5), _train(opened)
    order = []
    while (job := jobs.next_queued(opened)) is not None:
        order.append(job.id)
        jobs.claim(opened, job.id)
    assert order == [urgent.id, first.id, second.id]
    assert jobs.get(opened, first.id).submitted_by == "user:alice"


def test_a_job_is_claimed_once_and_a_stale_owner_cannot_change_it(opened: Store) -> None:
    job = _train(opened)
    owner = jobs.claim(opened, job.id)
    assert owner is not None and jobs.claim(opened, job.id) is None
    jobs.requeue(opened, job.id, owner, "preempted")
    newer = jobs.claim(opened, job.id)
    assert newer is not None and jobs.get(opened, job.id).attempts == 2

    assert not jobs.heartbeat(opened, job.id, owner)  # the first attempt lost its claim
    with pytest.raises(JobError, match="no longer run by this attempt"):
        jobs.finish(opened, job.id, owner, {})
    jobs.finish(opened, job.id, newer, {"version": "tickets:2"})
    assert jobs.get(opened, job.id).status == "finished"


def test_state_saved_by_a_step_survives_a_restart_and_recover_requeues(opened: Store) -> None:
    job = _train(opened)
    owner = jobs.claim(opened, job.id)
    assert owner is not None
    jobs.save_state(opened, job.id, owner, dataset="tickets:1", run_id="abc")
    assert jobs.recover(opened) == [job.id]  # the daemon that ran it is gone
    again = jobs.get(opened, job.id)
    assert again.status == "queued" and again.owner is None and again.state == {"dataset": "tickets:1", "run_id": "abc"}
    assert [row["action"] for row in audit.rows(opened, action="job.*")] == ["job.submit", "job.recover"]


def test_cancel_ends_a_queued_job_and_asks_a_running_one_to_stop(opened: Store) -> None:
    queued, running = _train(opened), _train(opened)
    owner = jobs.claim(opened, running.id)
    assert owner is not None
    assert jobs.cancel(opened, queued.id).status == "cancelled"
    asked = jobs.cancel(opened, running.id)
    assert asked.status == "running" and asked.cancel_requested
    assert jobs.next_queued(opened) is None
    jobs.cancelled_while_running(opened, running.id, owner)
    with pytest.raises(JobError, match="already cancelled"):
        jobs.cancel(opened, running.id)


@pytest.mark.parametrize(
    ("kind", "params", "message"),
    [
        ("dance", {}, "unknown job kind 'dance'"),
        ("train", {}, "needs 'dataset'"),
        ("optimize", {"dataset": "x"}, "unknown parameters for a optimize job: dataset"),
        ("train", {"dataset": "x", "params": {"epochs": 2, "speed": 11}}, "unknown training parameters: speed"),
    ],
)
def test_bad_submissions_are_refused_and_nothing_is_queued(
    opened: Store, kind: str, params: dict, message: str
) -> None:
    with pytest.raises(JobError, match=message):
        jobs.submit(opened, kind, params)
    assert jobs.list_jobs(opened) == []


def test_an_unknown_job_is_not_found(opened: Store) -> None:
    with pytest.raises(JobNotFound) as raised:
        jobs.get(opened, "nope")
    assert raised.value.status == 404


def test_events_follow_a_job_in_order(opened: Store) -> None:
    job = _train(opened)
    owner = jobs.claim(opened, job.id)
    assert owner is not None
    jobs.set_stage(opened, job.id, owner, "train")
    jobs.progress(opened, job.id, {"step": 3})
    jobs.finish(opened, job.id, owner, {"run_id": "r"})
    seen = events.after(opened, 0, job.id)
    assert [event.kind for event in seen] == ["queued", "started", "stage", "progress", "finished"]
    assert events.after(opened, seen[2].seq, job.id)[0].data == {"step": 3}


def test_old_progress_reports_are_pruned_and_the_rest_of_a_job_kept(opened: Store) -> None:
    job = _train(opened)
    owner = jobs.claim(opened, job.id)
    assert owner is not None
    jobs.progress(opened, job.id, {"step": 1})
    jobs.log(opened, job.id, "stage: train")
    assert events.prune_progress(opened) == 0  # fresh reports stay
    assert events.prune_progress(opened, older_than=timedelta(seconds=-1)) == 1  # a cutoff just after it
    assert [event.kind for event in events.after(opened, 0, job.id)] == ["queued", "started", "log"]
