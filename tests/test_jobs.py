"""The job queue against a real store: ordering, claims, requeue after a crash, cancel, events; each kind's
parameters checked at submission, and the files a job names confined to their folders."""

from __future__ import annotations

import dataclasses
import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from appliance import store
from appliance.core.errors import ConfinementError, JobError, JobNotFound, Overloaded
from appliance.operations import jobs, jobspec, worker
from appliance.store import Store, audit, events
from appliance.train.params import TrainParams
from tests.conftest import run_cli
from tests.daemon import Daemon


def _train(store: Store, priority: int = 0) -> jobs.Job:
    return jobs.submit(store, jobspec.TrainJob(dataset="tickets"), priority, actor="user:alice")


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
        ("dance", {}, 'unknown job kind "dance"'),
        ("train", {}, "send 'dataset' for a new run, or 'resume' with an interrupted run's id"),
        ("optimize", {"version": "x", "dataset": "x"}, "dataset: an optimize job takes no such parameter; it takes"),
        ("train", {"dataset": "x", "params": {"epochs": 2, "speed": 11}}, "params.speed: the training takes no such"),
        ("train", {"dataset": "x", "params": {"epochs": 1e308}}, "epochs: 1e+308 is not a whole number from 1 to 1000"),
        ("train", {"dataset": "x", "params": {"epochs": "5"}}, 'params.epochs: "5" is not a whole number from 1'),
        ("train", {"dataset": "x", "params": {"epochs": "abc"}}, 'params.epochs: "abc" is not a whole number'),
        ("train", {"dataset": "x", "params": {"epochs": -1}}, "params.epochs: -1 is not a whole number from 1 to"),
        ("train", {"dataset": "x", "params": {"batch_size": 0}}, "batch_size: 0 is not a whole number from 1 to 4096"),
        ("train", {"dataset": "x", "params": {"learning_rate": 2}}, "rate: 2 is not a number above 0 and at most 1"),
        ("train", {"dataset": "x", "params": {"schedule": "steep"}}, '"steep" is not one of "linear", "cosine"'),
        ("train", {"dataset": "x", "params": {"lora": 1}}, "params.lora: 1 is not true or false"),
        ("train", {"dataset": "x", "params": {"warmup_ratio": float("nan")}}, "warmup_ratio: NaN is not a number"),
        ("train", {"dataset": "x", "params": 3}, "params: 3 is not an object of what the training takes: epochs"),
        ("train", {"dataset": "x", "params": {"max_minutes": 1e308}},  # a job that would fail later, on an overflow
         "params.max_minutes: 1e+308 is not a number above 0 and at most 10080"),
        ("train", {"dataset": 7}, "dataset: 7 is not text of 1 to 200 characters"),
        ("train", {"dataset": "x" * 201}, 'dataset: "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…'),
        ("train", {"dataset": "x", "device": "gpu"}, 'device: "gpu" is not one of "cpu", "cuda"'),
        ("train", {"dataset": "x", "burst": "yes"}, 'burst: "yes" is not true or false'),
        ("train", {"dataset": "x", "name": "no spaces"}, 'name: "no spaces" is not a usable model name'),
        ("optimize", {"version": "x", "distill_layers": 49}, "distill_layers: 49 is not a whole number from 1 to 48"),
        ("optimize", {"version": "x", "distill_width": 0}, "distill_width: 0 is not a whole number from 1 to 65536"),
        ("optimize", {"version": "x", "distill": "yes"}, 'distill: "yes" is not true or false'),
        ("optimize", {"version": "x", "max_accuracy_drop": -0.5}, "drop: -0.5 is not a number from 0 to 100"),
        ("optimize", {"version": "x", "calibration_size": 10**6}, "calibration_size: 1000000 is not a whole number"),
        ("optimize", {"version": "x", "int8": "no"}, 'int8: "no" is not true or false'),
        ("optimize", {"version": "x", "metric": "f1"}, 'metric: "f1" is not one of "macro_f1", "accuracy"'),
        ("optimize", {"version": "x", "seed": -1}, "seed: -1 is not a whole number from 0 to 4294967295"),
        ("optimize", {"version": "x", "max_minutes": 0}, "max_minutes: 0 is not a number above 0 and at most 10080"),
        ("pipeline", {"dataset": "x", "canary_percent": 0}, "percent: 0 is not a number above 0 and at most 100"),
        ("pipeline", {"dataset": "x", "deploy": "yes"}, 'deploy: "yes" is not one of "auto", "now", "canary", "never"'),
        ("pipeline", {"dataset": "x", "task": "speech"}, 'task: "speech" is not one of "text-classification"'),
        ("pipeline", {"dataset": "x", "residency": "anywhere"}, 'residency: "anywhere" is not one of "local-only"'),
        ("pipeline", {"dataset": "x", "source": ["a.csv"]}, 'source: ["a.csv"] is not text of 1 to 255 characters'),
        ("pipeline", {"dataset": "x", "retrain": "tickets", "source": "a.csv"}, "takes no 'source'"),
        ("tune", {"dataset": "x"}, "send 'dataset' and 'budget_s' for a new search, or 'resume'"),
        ("tune", {"resume": "s", "space": {"epochs": 3}}, "'resume' continues a search as it started: 'space' cannot"),
        ("train", {"resume": "r", "burst": True}, "'resume' continues a run as it started: 'burst' cannot be sent"),
        ("train", {"resume": "nosuchrun"}, "no training run 'nosuchrun'"),
        ("tune", {"dataset": "x", "budget_s": 10**9}, "budget_s: 1000000000 is not a number above 0 and at most"),
        ("tune", {"dataset": "x", "budget_s": "60"}, 'budget_s: "60" is not a number above 0'),
        ("tune", {"dataset": "x", "budget_s": 60, "sampler": "grid"}, 'sampler: "grid" is not one of "tpe", "random"'),
        ("tune", {"dataset": "x", "budget_s": 60, "metric": "loss"}, 'metric: "loss" is not one of "macro_f1"'),
        ("tune", {"dataset": "x", "budget_s": 60, "space": {"speed": 1}}, "space: 'speed' cannot be searched"),
        ("tune", {"dataset": "x", "budget_s": 60, "space": {"epochs": {"low": 1, "high": 5000}}},
         "space: epochs: 5000 is not a whole number from 1 to 1000"),
        ("tune", {"dataset": "x", "budget_s": 60, "space": []}, "space: [] is not an object"),
    ],
)
def test_bad_submissions_are_refused_naming_field_value_and_range_and_nothing_is_queued(
    opened: Store, kind: str, params: dict, message: str
) -> None:
    with pytest.raises(JobError) as refused:
        jobs.submit(opened, jobspec.parse(kind, params))
    assert message in refused.value.message
    assert jobs.list_jobs(opened) == []


def test_the_api_body_describes_each_kinds_parameters_with_their_bounds() -> None:
    described = jobspec.JobRequest.model_json_schema()
    assert described["discriminator"]["propertyName"] == "kind" and set(described["discriminator"]["mapping"]) == {
        "train", "optimize", "pipeline", "tune", "export"}
    kinds = described["$defs"]
    assert kinds["TrainParams"]["properties"]["epochs"] | {"minimum": 1, "maximum": 1000, "type": "integer"} == \
        kinds["TrainParams"]["properties"]["epochs"]
    tune = kinds["TuneJob"]  # a new search needs dataset and budget_s, a resumed one neither: refused in words
    assert {"dataset", "budget_s", "resume"} <= set(tune["properties"]) and tune["additionalProperties"] is False
    assert kinds["PipelineJob"]["properties"]["task"]["enum"] == ["text-classification", "image-classification"]
    assert kinds["ExportJob"]["properties"]["format"]["enum"] == ["onnx", "openvino", "hf"]


def test_a_job_keeps_its_parameters_as_given_and_reads_them_back_typed(opened: Store) -> None:
    spec = jobspec.parse("tune", {"dataset": "tickets", "budget_s": 60, "params": {"epochs": 3},
                                  "space": {"lora": False}})
    job = jobs.submit(opened, spec, priority=-5)
    assert job.params == {"dataset": "tickets", "budget_s": 60.0, "params": {"epochs": 3}, "space": {"lora": False}}
    again = jobs.get(opened, job.id).spec
    assert again == spec and isinstance(again, jobspec.TuneJob)
    assert again.params.epochs == 3 and again.params.learning_rate == TrainParams().learning_rate
    assert again.deploy == "auto" and again.optimize_options().metric == "macro_f1"
    with pytest.raises(JobError, match="priority: 101 is not a whole number from -100 to 100"):
        jobs.submit(opened, spec, priority=101)


def test_an_older_yes_or_no_deploy_reads_as_the_policy_it_meant() -> None:
    def policy(**given: object) -> str:
        return jobspec.parse("pipeline", {"dataset": "tickets", **given}).deploy

    assert policy() == "auto" and policy(deploy=True) == "now" and policy(deploy=False) == "never"
    assert policy(deploy=True, canary_percent=5) == "canary"


def test_a_pipeline_keeps_its_time_limit_for_the_whole_job() -> None:
    """--max-minutes with --deploy --distill: the training has half, the student the other half, as in a tune job;
    without a student, the training has what the optimisation after it leaves, at least half."""
    def pipeline(**given: object) -> jobspec.PipelineJob:
        return jobspec.parse("pipeline", {"dataset": "tickets", "params": {"max_minutes": 4}, **given})

    student = pipeline(distill=True)
    assert student.training_params().max_minutes == 2 and student.optimize_options().within_s == 120
    assert student.dump()["params"]["max_minutes"] == 4  # the job shows the limit it was given
    shaped = pipeline(distill_layers=1)
    assert shaped.training_params().max_minutes == 2 and shaped.optimize_options().within_s == 120
    assert student.training_params(optimising_s=60).max_minutes == 2  # the student's half holds the optimisation
    alone = pipeline()  # the optimisation after the training cannot be cut: the training leaves it its time
    assert alone.training_params(optimising_s=60).max_minutes == 3 and alone.optimize_options().within_s is None
    assert alone.training_params(optimising_s=600).max_minutes == 2  # the training keeps half
    unbounded = jobspec.parse("pipeline", {"dataset": "tickets", "distill": True})
    assert unbounded.training_params().max_minutes is None and unbounded.optimize_options().within_s is None


def test_a_row_an_older_appliance_wrote_fails_its_job_with_a_message(opened: Store) -> None:
    job = _train(opened)
    opened.db.execute("UPDATE jobs SET params = ? WHERE id = ?", ('{"dataset": "tickets", "params": {"epochs": "5"}}',
                                                                 job.id))
    owner = jobs.claim(opened, job.id)
    assert owner is not None
    assert worker._run_claimed(opened, job.id, owner, None) == 1
    assert jobs.get(opened, job.id).error == ('params.epochs: "5" is not a whole number from 1 to 1000 (give each value'
                                              " named the type and range it says, then try again)")


def test_training_parameters_stored_by_earlier_versions_still_read() -> None:
    stored = {"epochs": 5, "learning_rate": 0.0001, "batch_size": 32, "warmup_ratio": 0.1, "schedule": "linear",
              "weight_decay": 0, "max_grad_norm": 1, "max_length": 128, "lora": False, "lora_rank": 8, "patience": 2,
              "metric": "macro_f1", "checkpoint_every": 50, "seed": 13, "max_minutes": None}  # dataclasses.asdict
    params = TrainParams.stored(stored)
    assert params.model_dump() == {**stored, "weight_decay": 0.0, "max_grad_norm": 1.0, "mode": "auto", "workers": None,
                                    "checkpoint_minutes": 10.0, "freeze": 0.0, "truncation": "head",
                                    "contrastive_pairs": 0}  # as they did
    assert TrainParams.parse(stored).truncation == "head+tail"  # a new request's default
    assert TrainParams.parse({"epochs": 3}) == TrainParams().changed(epochs=3)
    with pytest.raises(JobError, match="max_minutes: 0 is not a number above 0"):
        TrainParams().changed(max_minutes=0)  # a copy is checked like a client's values


# -- files a job names, confined to root's folders -------------------------------------------------


@pytest.fixture
def folders(opened: Store, tmp_path: Path) -> Store:
    """The store with daemon.import_dir and train.base_models_dir set, each holding one good entry and one link."""
    imports, models = tmp_path / "import", tmp_path / "models"
    (models / "tiny").mkdir(parents=True)
    imports.mkdir()
    (imports / "tickets.csv").write_text("text,label\nhello,a\n")
    (imports / "photos").mkdir()
    (imports / "key.csv").symlink_to(opened.settings.key_file)  # a link root did not mean to let a client follow
    (models / "linked").symlink_to(models / "tiny", target_is_directory=True)
    opened.settings = dataclasses.replace(opened.settings, base_models_dir=models,
                                         daemon=dataclasses.replace(opened.settings.daemon, import_dir=imports))
    return opened


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"source": "../../etc/passwd"}, "source: '../../etc/passwd' is not a name inside daemon.import_dir"),
        ({"source": "/etc/passwd"}, "source: '/etc/passwd' is not a name inside daemon.import_dir"),
        ({"source": "key.csv"}, "source: 'key.csv' in daemon.import_dir is or passes through a link"),
        ({"source": "missing.csv"}, "source: there is no 'missing.csv' in daemon.import_dir"),
        ({"source": "photos"}, "source: 'photos' in daemon.import_dir is not a regular file"),
        ({"source": "tickets.csv", "task": "image-classification"}, 'source: there is no folder "tickets.csv" in'),
        ({"base": "../import"}, 'base: there is no folder "../import" in train.base_models_dir'),
        ({"base": "/usr"}, 'base: there is no folder "/usr" in train.base_models_dir'),
        ({"base": "linked"}, 'base: there is no folder "linked" in train.base_models_dir'),
    ],
)
def test_a_source_or_base_outside_its_folder_is_refused_at_submission(
    folders: Store, params: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfinementError) as refused:
        jobs.submit(folders, jobspec.parse("pipeline", {"dataset": "tickets", **params}))
    assert refused.value.message.startswith(message)
    assert folders.settings.key_file.read_bytes().decode(errors="replace") not in str(refused.value.__dict__)
    assert jobs.list_jobs(folders) == []


def test_names_inside_the_folders_are_taken_and_base_resolves_to_its_folder(folders: Store) -> None:
    jobs.submit(folders, jobspec.parse("pipeline", {"dataset": "tickets", "source": "tickets.csv", "base": "tiny"}))
    jobs.submit(folders, jobspec.parse("pipeline", {"dataset": "pets", "source": "photos",
                                                    "task": "image-classification"}))
    settings = folders.settings
    assert jobspec.base_dir("tiny", settings) == settings.base_models_dir / "tiny"
    assert jobspec.base_dir(None, settings) == settings.base_model
    assert jobspec.base_name(settings.base_models_dir / "tiny", settings) == "tiny"
    assert jobspec.base_name(settings.base_model, settings) is None
    with pytest.raises(JobError, match="the daemon loads base models only from train.base_models_dir"):
        jobspec.base_name(settings.base_models_dir.parent / "import", settings)


def test_without_the_folders_configured_a_job_names_no_file(opened: Store) -> None:
    with pytest.raises(ConfinementError, match="no daemon.import_dir is configured"):
        jobs.submit(opened, jobspec.parse("pipeline", {"dataset": "tickets", "source": "tickets.csv"}))
    with pytest.raises(ConfinementError, match="base: no train.base_models_dir is configured") as refused:
        jobs.submit(opened, jobspec.TrainJob(dataset="tickets", base="tiny"))
    assert "leave 'base' out" in (refused.value.hint or "")
    assert jobs.list_jobs(opened) == []
    assert os.path.isdir(jobspec.base_dir(None, opened.settings))


def test_an_unknown_job_is_not_found(opened: Store) -> None:
    with pytest.raises(JobNotFound):
        jobs.get(opened, "nope")


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


def test_an_ended_job_is_deleted_with_its_log_and_an_active_one_is_not(opened: Store) -> None:
    ended, queued = _train(opened), _train(opened)
    jobs.log(opened, ended.id, "epoch 1")
    jobs.cancel(opened, ended.id)
    with pytest.raises(JobError, match=f"job {queued.id} is queued, so it cannot be deleted") as refused:
        jobs.delete(opened, queued.id)
    assert f"appliance jobs cancel {queued.id}" in refused.value.hint

    assert jobs.delete(opened, ended.id, actor="user:op").status == "cancelled"
    with pytest.raises(JobNotFound):
        jobs.get(opened, ended.id)
    assert not [event for event in events.after(opened, 0, ended.id) if event.topic == "job"]
    assert [job.id for job in jobs.list_jobs(opened)] == [queued.id]
    assert [(r["object"], r["outcome"]) for r in audit.rows(opened, action="job.delete")] == [
        (queued.id, "failed"), (ended.id, "ok")]
    assert audit.rows(opened, action="job.cancel")[-1]["object"] == ended.id  # what happened to it stays on record


def test_cli_delete_checks_every_job_before_it_deletes_any(opened: Store) -> None:
    ended, queued = _train(opened), _train(opened)
    jobs.cancel(opened, ended.id)
    opened.close()

    unknown = run_cli("jobs", "delete", ended.id, "nope")
    assert unknown.returncode == 1 and "nope" in unknown.stderr and "Traceback" not in unknown.stderr
    active = run_cli("jobs", "delete", ended.id, queued.id)
    assert active.returncode == 1 and f"job {queued.id} is queued, so it cannot be deleted" in active.stderr
    listed = json.loads(run_cli("jobs", "list", "--json", check=True).stdout)
    assert {job["id"] for job in listed} == {ended.id, queued.id}  # neither was deleted
    with store.open(opened.settings) as reopened:
        refusals = [(r["object"], r["outcome"]) for r in audit.rows(reopened, action="job.delete")]
    assert refusals == [("nope", "failed"), (queued.id, "failed")]  # each refusal on record, nothing deleted

    assert f"job {ended.id} (train, cancelled) deleted" in run_cli("jobs", "delete", ended.id, check=True).stdout


def test_cli_submit_follow_without_a_daemon_is_refused_and_queues_nothing(opened: Store) -> None:
    opened.close()
    refused = run_cli("jobs", "submit", "train", "-p", "dataset=tickets", "--follow")
    assert refused.returncode == 1
    assert "no daemon is running: nothing was queued" in refused.stderr and "appliance daemon" in refused.stderr
    assert json.loads(run_cli("jobs", "list", "--json", check=True).stdout) == []


@pytest.mark.slow
def test_cli_submit_follow_exits_1_when_the_job_fails(daemon: Daemon) -> None:
    followed = daemon.cli("jobs", "submit", "train", "-p", "dataset=nope", "--follow")
    assert followed.returncode == 1
    assert "failed: no dataset 'nope'" in followed.stderr and "appliance jobs logs" in followed.stderr


@pytest.mark.parametrize(("report", "words"), [
    ({"stage": "train", "phase": "train", "epoch": 2, "epochs": 5, "step": 30, "total_steps": 75, "loss": 0.31234,
      "samples_per_s": 85.25, "eta_s": 80}, "train epoch 2/5, loss 0.3123, eta 1m 20s, 85.2 samples/s"),
    ({"stage": "train", "phase": "contrast", "step": 1, "total_steps": 9, "samples_per_s": 40.0, "eta_s": None},
     "tuning the encoder on pairs (fast mode), 40.0 pairs/s"),
    ({"stage": "tune", "trial": 3, "trials": 3, "epoch": 1, "epochs": 4, "pruned": 1, "best": 0.93191, "step": 50,
      "total_steps": 240}, "tune trial 3 epoch 1/4, 1 pruned, best 0.9319"),
    ({"stage": "optimize", "step": 1, "total_steps": 5, "what": "distil a 3-layer student"},
     "optimize: distil a 3-layer student"),
])
def test_a_progress_report_reads_the_same_in_few_words_on_the_cli_and_the_tui(report: dict, words: str) -> None:
    assert jobs.progress_words(report) == words


def test_the_queue_is_bounded_and_a_listing_takes_the_newest(opened: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator's script gone wrong cannot queue jobs without end (each a row and a log)."""
    monkeypatch.setattr(jobs, "MAX_QUEUED", 3)
    queued = [_train(opened) for _ in range(3)]
    with pytest.raises(Overloaded, match="3 jobs are queued already, the most the queue holds"):
        _train(opened)
    assert [job.id for job in jobs.list_jobs(opened, limit=2)] == [queued[2].id, queued[1].id]
    jobs.cancel(opened, queued[0].id)
    assert _train(opened).status == "queued"  # room again
