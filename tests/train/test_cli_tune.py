"""`appliance tune` as an operator runs it: in the foreground, and as a daemon job that ends optimised."""

from __future__ import annotations

import json
import signal
from dataclasses import asdict
from pathlib import Path

import pytest

from appliance import store
from appliance.access import users
from appliance.core import config
from appliance.operations import pipeline
from appliance.train import studies
from tests.conftest import run_cli, write_tickets
from tests.daemon import TINY, Daemon, alive, submit

SPACE = 'learning_rate = { low = 1e-3, high = 1e-2, log = true }\nepochs = { low = 3, high = 5 }\nbatch_size = [8, 16]\n' \
        'max_length = 32\nlora = false\n'


@pytest.fixture
def imported(tmp_path: Path) -> str:
    run_cli("keys", "init", check=True)
    run_cli("data", "import", str(write_tickets(tmp_path / "tickets.csv")), "--name", "tickets", check=True)
    (tmp_path / "space.toml").write_text(SPACE)
    return "tickets"


@pytest.mark.slow
def test_tune_searches_registers_and_optimises_the_best_and_shows_a_ranked_table(imported: str,
                                                                                 tiny_base: Path) -> None:
    """With --distill, the search has half the budget and the student, taught by its best trial, the rest."""
    done = run_cli("tune", "--data", imported, "--budget", "40s", "--base", str(tiny_base), "--space", "space.toml",
                   "--distill", check=True)
    assert "tune trial" in done.stderr  # the progress bar
    assert "the search has 20s of the 40s budget; the student distilled from its best trial learns" in done.stderr
    assert "registered and optimised as tickets:2" in done.stdout  # as a daemon's tune job does: tickets:1, then :2
    shown = json.loads(run_cli("models", "show", "tickets:2", "--json", check=True).stdout)
    assert "student-fp32" in shown["variants"] and "1-layer student, " in shown["reason"]
    study_id = done.stdout.split("appliance tune show ")[1].split("'")[0]
    shown = run_cli("tune", "show", study_id, check=True).stdout
    assert "importance:" in shown and " complete " in shown and "rank" in shown
    data = json.loads(run_cli("tune", "show", study_id, "--json", check=True).stdout)
    assert data["status"] == "finished" and data["trials"][0]["run_id"] == data["best_run_id"]
    assert data["budget_s"] == 20
    assert data["trials"][0]["epochs"]  # the curve, for charts
    assert study_id in run_cli("tune", "list", check=True).stdout


def test_a_budget_too_short_for_a_search_and_its_optimisation_is_refused_with_one_that_holds_both(
    imported: str, tiny_base: Path
) -> None:
    """'--budget 1s' ran 33 s: a whole trial, then the optimisation and a deployment. On a box whose optimisations
    take long, a budget that holds one but no search before it is refused, naming a budget that holds both."""
    slow = pipeline.Pace(fixed_s=1e6, quantised_s=1e6, scored_s=1.0, measured_at="2026-12-07T00:00:00+00:00")
    with store.open(config.load()) as opened:
        opened.db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (pipeline.PACE_KEY, json.dumps(asdict(slow))))
    refused = run_cli("tune", "--data", imported, "--budget", "40s", "--base", str(tiny_base), "--deploy", "auto")
    assert refused.returncode == 1 and "a budget of 40s holds no search" in refused.stderr, refused.stderr
    assert "give --budget" in refused.stderr and "Traceback" not in refused.stderr
    assert "tickets:2" not in run_cli("models", "list", check=True).stdout


def test_tune_refuses_bad_input_with_a_message(imported: str, tmp_path: Path) -> None:
    assert run_cli("tune", "--data", imported, "--budget", "30x").returncode == 2
    assert run_cli("tune", "--budget", "30m").returncode == 2
    (tmp_path / "bad.toml").write_text("learning_rat = 0.1\n")
    bad = run_cli("tune", "--data", imported, "--budget", "1m", "--space", "bad.toml")
    assert bad.returncode == 1 and "bad.toml" in bad.stderr and "cannot be searched" in bad.stderr
    (tmp_path / "binary.toml").write_bytes(b"\xff\xfe\x00lr")
    binary = run_cli("tune", "--data", imported, "--budget", "1m", "--space", "binary.toml")
    assert binary.returncode == 1 and "binary.toml is not valid TOML: byte 1 is not UTF-8" in binary.stderr
    missing = run_cli("tune", "--data", "no-such-dataset", "--budget", "1m")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    unknown = run_cli("tune", "show", "nope")
    assert unknown.returncode == 1 and "no hyperparameter search" in unknown.stderr


@pytest.mark.slow
def test_a_tune_job_hands_its_best_trial_to_register_and_optimise(daemon: Daemon, tmp_path: Path) -> None:
    with daemon.api() as api:
        assert daemon.upload(tmp_path / "tickets.csv", name="tickets").is_success
        refused = api.post("/v1/jobs", json={"kind": "tune", "params": {"dataset": "tickets", "budget_s": 0}})
        assert refused.status_code == 400 and "budget_s" in refused.json()["error"]
    narrowing = {"learning_rate": {"low": 1e-3, "high": 1e-2}, "epochs": {"low": 3, "high": 4}, "max_length": 32}
    job_id = submit(daemon, "tune", {"dataset": "tickets", "budget_s": 25, "params": TINY, "space": narrowing})
    job = daemon.ended(job_id, 300)
    assert job["status"] == "finished", job["error"]
    assert job["result"]["study"] == job_id
    assert job["result"]["deployed"]["how"] == "production"  # nothing served tickets yet
    assert job["result"]["version"] == "tickets:2"  # registered (1), then optimised (2)
    shown = daemon.cli("tune", "show", job_id)
    assert shown.returncode == 0 and f"search {job_id}: finished" in shown.stdout

    # A viewer reads the same search over the control API that `tune show --json` prints.
    with store.open(daemon.settings) as opened:
        _, viewer = users.add(opened, "auditor", "viewer")
    with daemon.api(viewer) as api:
        listed = api.get("/v1/studies").json()
        study = api.get(f"/v1/studies/{job_id}").json()
        missing = api.get("/v1/studies/nosuchsearch")
    assert [(s["id"], s["status"], s["trials"]) for s in listed] == [(job_id, "finished", len(study["trials"]))]
    assert study == json.loads(daemon.cli("tune", "show", job_id, "--json").stdout)
    best = study["trials"][0]
    assert best["run_id"] == study["best_run_id"] == job["result"]["run_id"] and best["state"] == "complete"
    assert best["params"]["learning_rate"] and best["epochs"][0]["epoch"] == 1
    assert {trial["state"] for trial in study["trials"]} <= {"complete", "pruned", "refused"}
    assert missing.status_code == 404 and "no hyperparameter search 'nosuchsearch'" in missing.json()["error"]


@pytest.mark.slow
def test_a_search_killed_with_the_daemon_resumes_its_study_after_a_restart(daemon: Daemon, tmp_path: Path) -> None:
    assert daemon.upload(tmp_path / "tickets.csv", name="tickets").is_success
    narrowing = {"learning_rate": {"low": 1e-3, "high": 1e-2}, "epochs": {"low": 3, "high": 6}, "batch_size": [8, 16],
                 "max_length": 32, "lora": False}
    job_id = submit(daemon, "tune", {"dataset": "tickets", "budget_s": 40, "params": {**TINY, "checkpoint_every": 2},
                                     "space": narrowing, "int8": False})

    def ended_trials() -> list[studies.Trial]:
        with store.open(daemon.settings) as opened:
            found = studies.trials(opened, job_id) if studies.exists(opened, job_id) else []
        return [trial for trial in found if trial.state in ("complete", "pruned")]

    daemon.wait(lambda: len(ended_trials()) >= 2, 180, "no two trials ended")
    child = daemon.job(job_id)["pid"]
    daemon.stop(signal.SIGKILL)
    daemon.wait(lambda: not alive(child), 10, "the job process outlived the daemon")
    with store.open(daemon.settings) as opened:
        before = studies.trials(opened, job_id)
        assert studies.get(opened, job_id).status == "running"  # as the crash left it

    daemon.start()
    job = daemon.ended(job_id, 300)
    assert job["status"] == "finished", job["error"]
    assert job["attempts"] == 2 and job["result"]["study"] == job_id
    with store.open(daemon.settings) as opened:
        assert [record.id for record in studies.list_studies(opened)] == [job_id]  # the same study went on
        record = studies.get(opened, job_id)
        after = studies.trials(opened, job_id)
    assert record.status == "finished" and record.best_run_id == job["result"]["run_id"]
    assert [(t.number, t.run_id, t.params) for t in after[: len(before)]] == \
        [(t.number, t.run_id, t.params) for t in before]  # nothing tried before the kill was lost or redone
    assert all(a == b for a, b in zip(after, before, strict=False) if b.state != "running")
    assert all(trial.state in ("complete", "pruned", "refused") for trial in after)
    assert record.spent_s <= record.budget_s + 5  # one step and one evaluation of the tiny model at most

