"""`appliance train` and `appliance runs` as an operator runs them, crashes included."""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli, write_tickets
from tests.daemon import Daemon
from tests.train.test_images import write_shapes

LONG = ["--epochs", "12", "--patience", "12", "--lr", "3e-3", "--batch-size", "16", "--seed", "5",
        "--checkpoint-every", "3"]


@pytest.fixture
def imported(tmp_path: Path) -> str:
    run_cli("keys", "init", check=True)
    run_cli("data", "import", str(write_tickets(tmp_path / "tickets.csv")), "--name", "tickets", check=True)
    return "tickets"


def _metrics(run_id: str) -> dict:
    return json.loads(run_cli("runs", "show", run_id, "--json", check=True).stdout)["metrics"]


def _start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "appliance", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_checkpoint(db: Path, child: subprocess.Popen[str], timeout: float = 120, known: tuple[str, ...] = ()) -> str:
    """The id of a run not in known, once its first checkpoint has committed (read straight from the file)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert child.poll() is None, child.communicate()
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                found = [run_id for (run_id,) in conn.execute("SELECT run_id FROM checkpoints") if run_id not in known]
        except sqlite3.OperationalError:
            found = []
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError("no checkpoint appeared")


def _stopped_at_a_checkpoint(args: list[str], env: dict[str, str], db: Path, known: tuple[str, ...] = ()) -> str:
    """A foreground run, SIGTERMed once it has checkpointed: its id."""
    child = _start(args, env)
    run_id = _wait_for_checkpoint(db, child, known=known)
    child.send_signal(signal.SIGTERM)
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 143 and f"appliance train --resume {run_id}" in out
    return run_id


def test_train_reports_progress_and_runs_can_be_listed_and_compared(imported: str, tiny_base: Path) -> None:
    first = run_cli("train", "--data", imported, "--base", str(tiny_base), "--epochs", "3", "--lr", "3e-3", check=True)
    assert "finished after" in first.stdout and "best validation" in first.stdout
    assert "samples/s" in first.stderr  # the progress bar
    second = run_cli("train", "--data", imported, "--base", str(tiny_base), "--epochs", "2", "--lr", "1e-3", check=True)
    listed = run_cli("runs", "list", check=True).stdout.splitlines()
    ids = [line.split()[0] for line in listed]
    assert len(ids) == 2 and "on tickets:1" in listed[0] and "made tickets:1" in listed[0]  # what, and what it made
    shown = run_cli("runs", "show", ids[0], check=True).stdout
    assert "epoch   3" in shown and "micro-batch" in shown
    compared = run_cli("runs", "compare", *ids, check=True).stdout
    assert "*p.epochs" in compared and "*p.learning_rate" in compared
    assert " p.seed" in compared  # unchanged parameters are not marked
    assert first.returncode == second.returncode == 0


def test_train_with_deploy_optimises_distils_and_deploys_what_it_trained(imported: str, tiny_base: Path) -> None:
    trained = run_cli("train", "--data", imported, "--base", str(tiny_base), "--epochs", "2", "--lr", "3e-3",
                      "--deploy", "now", "--distill", "--max-minutes", "0.001", check=True)
    assert "the student distilled from it learns in the other half; that holds no more than optimising the teacher" \
        in trained.stderr  # a limit too short for the student says so before the work
    assert "registered and optimised as tickets:2" in trained.stdout
    assert "tickets:2 serves in production" in trained.stdout
    versions = {v["version"]: v for v in json.loads(run_cli("models", "list", "--json", check=True).stdout)}
    assert versions[2]["servable"] and versions[2]["aliases"] == ["production"] and not versions[1]["servable"]
    shown = json.loads(run_cli("models", "show", "tickets:2", "--json", check=True).stdout)
    assert "student-fp32" in shown["variants"] and "(shape: half the teacher's 2 layers" in shown["reason"]
    refused = run_cli("train", "--resume", "abc", "--deploy", "now")
    assert refused.returncode == 2 and "takes no --burst, --fallback, --base, --deploy or --distill" in refused.stderr
    alone = run_cli("train", "--data", imported, "--distill")
    assert alone.returncode == 2 and "add --deploy" in alone.stderr and "appliance optimize MODEL --distill" in alone.stderr


def test_train_refuses_bad_input_with_a_message(imported: str, tmp_path: Path) -> None:
    missing = run_cli("train", "--data", "no-such-dataset")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    not_a_model = run_cli("train", "--data", imported, "--base", str(tmp_path))
    assert not_a_model.returncode == 1 and "Traceback" not in not_a_model.stderr
    assert f"{tmp_path} has no config.json, so it is not a Hugging Face model directory" in not_a_model.stderr
    assert "sentencepiece" not in not_a_model.stderr
    nowhere = run_cli("train", "--data", imported, "--base", str(tmp_path / "nowhere"))
    assert nowhere.returncode == 1 and f"the base model folder {tmp_path / 'nowhere'} does not exist" in nowhere.stderr
    assert "Repo id" not in nowhere.stderr  # the hub's words for a name it would look up: none here
    assert run_cli("train").returncode == 2
    for command in ("train", "tune"):  # an empty id is named as such, not taken as no --resume at all
        empty = run_cli(command, "--resume", "")
        assert empty.returncode == 1 and 'resume: "" is not text of 1 to 200 characters' in empty.stderr


@pytest.fixture(params=["text", "image"])
def long_run(request: pytest.FixtureRequest, tmp_path: Path, tiny_base: Path) -> list[str]:
    """The arguments of a run long enough to be killed after its first checkpoint: a text one, and an image one on
    the pretrained backbone, whose head is fitted before its first step (the checkpoint keeps that model too)."""
    run_cli("keys", "init", check=True)
    if request.param == "text":
        run_cli("data", "import", str(write_tickets(tmp_path / "tickets.csv")), "--name", "tickets", check=True)
        return ["train", "--data", "tickets", "--base", str(tiny_base), *LONG]
    write_shapes(tmp_path / "shapes", per_class=8)
    run_cli("data", "import", str(tmp_path / "shapes"), "--name", "shapes", "--task", "image-classification",
            check=True)
    return ["train", "--data", "shapes", "--epochs", "3", "--batch-size", "8", "--seed", "5", "--checkpoint-every", "2"]


@pytest.mark.slow
def test_sigkill_then_resume_ends_with_the_metrics_of_an_uninterrupted_run(long_run: list[str], tmp_path: Path
                                                                           ) -> None:
    args = long_run
    child = _start(args)
    run_id = _wait_for_checkpoint(tmp_path / "var" / "appliance.db", child)
    child.send_signal(signal.SIGKILL)
    child.communicate()

    resumed = run_cli("train", "--resume", run_id, check=True)
    assert f"run {run_id} finished" in resumed.stdout
    straight = run_cli("train", *args[1:], check=True)
    straight_id = straight.stdout.split()[1]
    expected = _metrics(straight_id)
    for name, value in _metrics(run_id).items():
        assert value == pytest.approx(expected[name], abs=1e-4), name


@pytest.mark.slow
def test_sigterm_checkpoints_now_and_exits(imported: str, tiny_base: Path, tmp_path: Path) -> None:
    child = _start(["train", "--data", imported, "--base", str(tiny_base), *LONG])
    run_id = _wait_for_checkpoint(tmp_path / "var" / "appliance.db", child)
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 143
    assert f"appliance train --resume {run_id}" in out
    assert "Traceback" not in err
    assert json.loads(run_cli("runs", "show", run_id, "--json", check=True).stdout)["status"] == "interrupted"


@pytest.mark.slow
def test_a_run_stopped_in_the_foreground_is_finished_by_the_daemon_from_a_base_it_may_load(
    daemon: Daemon, tmp_path: Path
) -> None:
    """`train --resume` with a daemon running is a job; the daemon continues a run only from a base model it would
    start one from (train.base_model or train.base_models_dir), as it never opens a folder an API caller names."""
    assert daemon.upload(tmp_path / "tickets.csv", name="tickets").is_success
    daemon.stop()  # no daemon: the CLI trains in the foreground
    db = daemon.settings.state_dir / "appliance.db"
    args = ["train", "--data", "tickets", *LONG]
    usual = _stopped_at_a_checkpoint(args, daemon.env, db)  # from train.base_model
    elsewhere = shutil.copytree(daemon.settings.base_model, tmp_path / "elsewhere")
    foreign = _stopped_at_a_checkpoint([*args, "--base", str(elsewhere)], daemon.env, db, known=(usual,))

    daemon.start()
    refused = daemon.cli("train", "--resume", foreign)
    assert refused.returncode == 1 and "train.base_models_dir" in refused.stderr
    assert "Traceback" not in refused.stderr
    resumed = daemon.cli("train", "--resume", usual)
    assert resumed.returncode == 0, resumed.stderr
    assert "queued with the daemon" in resumed.stderr and f"run {usual} finished" in resumed.stdout
    assert "registered as tickets:1" in resumed.stdout
    again = daemon.cli("train", "--resume", usual)
    assert again.returncode == 1 and "nothing to resume" in again.stderr
    with daemon.api() as api:
        assert api.post("/v1/jobs", json={"kind": "train", "params": {"resume": usual, "params": {"epochs": 1}}}
                        ).status_code == 400  # a resumed run keeps its own hyperparameters
