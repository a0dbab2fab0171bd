"""The real daemon as a subprocess on a temporary state directory, driven through its control socket."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from appliance import store
from appliance.access import users
from appliance.daemon.api import events as events_api
from appliance.operations import jobs, jobspec
from appliance.store import audit, events
from appliance.train import runs
from tests.conftest import run_cli
from tests.daemon import TINY, Daemon, alive, submit

pytestmark = pytest.mark.slow

# Long enough to interrupt: many short epochs, a checkpoint every other step, no early stop.
LONG = {**TINY, "epochs": 60, "patience": 60, "checkpoint_every": 2}


def _events(daemon: Daemon, job_id: str) -> list[events.Event]:
    with store.open(daemon.settings) as opened:
        return events.after(opened, 0, job_id, 100_000)


def _logged(daemon: Daemon, job_id: str) -> list[str]:
    """The job's log lines once complete: its process's own lines reach the log after the job is recorded as ended,
    and `exited` closes the log after them."""
    ended = daemon.wait(lambda: (found := _events(daemon, job_id))[-1].kind == "exited" and found, 10, "no exited")
    return [event.data["line"] for event in ended if event.kind == "log"]


def _steps_done(daemon: Daemon, job_id: str) -> int:
    steps = [event.data.get("step", 0) for event in _events(daemon, job_id) if event.kind == "progress"]
    return max(steps, default=0)


def test_the_pipeline_imports_trains_optimises_deploys_and_serves(daemon: Daemon, tmp_path: Path) -> None:
    job_id = submit(daemon, "pipeline", {"source": "tickets.csv", "dataset": "tickets",
                                          "params": TINY, "int8": False})
    job = daemon.ended(job_id)
    assert job["status"] == "finished", job["error"]
    assert [e.data["stage"] for e in _events(daemon, job_id) if e.kind == "stage"] == \
        ["import", "train", "optimize", "deploy"]
    assert job["result"]["version"] == "tickets:2"
    logged = _logged(daemon, job_id)
    assert "tickets:2: production (nothing served tickets yet)" in logged and logged[-1] == "finished"
    assert not [line for line in logged if "Warning" in line]  # the libraries' notes to their developers stay out
    assert job["result"]["deployed"] == {"how": "production", "reason": "nothing served tickets yet"}

    with daemon.api() as api:
        token = api.post("/v1/api-keys", json={"name": "test"}).json()["token"]
        models = api.get("/v1/models").json()
    assert "production" in next(m for m in models if m["version"] == 2)["aliases"]
    inference = daemon.settings.inference_url

    def predicted() -> dict[str, Any] | None:
        answer = httpx.post(f"{inference}/v1/models/tickets:predict", json={"instances": ["refund my invoice"]},
                            headers={"Authorization": f"Bearer {token}"}, timeout=10)
        return answer.json() if answer.status_code == 200 else None

    answer = daemon.wait(predicted, 60, "the deployed model was not served")
    assert answer["model_version"] == "2" and answer["predictions"][0]["label"] in ("billing", "shipping", "technical")
    assert answer["predictions"][0]["id"]  # kept, for feedback
    with daemon.api() as api:  # tried from the console: answered, and not kept
        tried = api.post("/v1/models/tickets/predict", json={"texts": ["refund my invoice"]})
        flood = api.post("/v1/models/tickets/predict", json={"texts": ["refund"] * 300_000})  # 3 MB
    assert tried.status_code == 200 and tried.json()["predictions"][0]["id"] is None, tried.text
    assert flood.status_code == 413, flood.text  # a text model's tries are bounded as its server's requests: 1 MiB
    with store.open(daemon.settings) as opened:
        actors = {row["actor"] for row in audit.rows(opened) if row["action"] in ("job.submit", "model.deploy")}
    assert actors == {f"user:{users.LOCAL_ADMIN}"}

    # With a model served, the next training leaves it cores and runs at lower priority.
    retrain = submit(daemon, "train", {"dataset": "tickets", "params": TINY})
    assert daemon.ended(retrain)["status"] == "finished"
    assert any("training uses at most" in line for line in _logged(daemon, retrain))


def test_kill_9_mid_training_then_restart_resumes_from_the_checkpoint(daemon: Daemon) -> None:
    from appliance.data import datasets

    with store.open(daemon.settings) as opened:
        datasets.import_file(opened, daemon.settings.state_dir.parent / "tickets.csv", name="tickets")
    job_id = submit(daemon, "train", {"dataset": "tickets", "params": LONG})
    daemon.wait(lambda: _steps_done(daemon, job_id) >= 12, 120, "training did not get going")
    child = daemon.job(job_id)["pid"]

    daemon.stop(signal.SIGKILL)
    daemon.wait(lambda: not alive(child), 10, "the job process outlived the daemon")
    with store.open(daemon.settings) as opened:
        assert jobs.get(opened, job_id).status == "running"  # as the crash left it
        run_id = jobs.get(opened, job_id).state["run_id"]
        checkpointed = opened.db.execute("SELECT MAX(step) FROM checkpoints WHERE run_id = ?", (run_id,)).fetchone()[0]
    assert checkpointed >= 10

    daemon.start()
    job = daemon.ended(job_id)
    assert job["status"] == "finished", job["error"]
    assert job["attempts"] == 2 and job["state"]["run_id"] == run_id
    with store.open(daemon.settings) as opened:
        history = runs.epochs(opened, run_id)
        assert len(runs.list_runs(opened)) == 1  # the same run went on: nothing trained twice from scratch
    assert [row.epoch for row in history] == list(range(1, LONG["epochs"] + 1))  # every epoch once
    seen = _events(daemon, job_id)
    second = [i for i, e in enumerate(seen) if e.kind == "started"][1]
    first_step = next(e.data["step"] for e in seen[second:] if e.kind == "progress" and "step" in e.data)
    assert checkpointed <= first_step <= checkpointed + 6  # from the checkpoint on, not from step 0


def test_sigterm_drains_the_running_job_back_into_the_queue(daemon: Daemon) -> None:
    from appliance.data import datasets

    with store.open(daemon.settings) as opened:
        datasets.import_file(opened, daemon.settings.state_dir.parent / "tickets.csv", name="tickets")
    job_id = submit(daemon, "train", {"dataset": "tickets", "params": LONG})
    daemon.wait(lambda: _steps_done(daemon, job_id) >= 4, 120, "training did not get going")

    assert daemon.stop(signal.SIGTERM) == 0
    with store.open(daemon.settings) as opened:
        job = jobs.get(opened, job_id)
        assert job.status == "queued" and job.owner is None
        assert runs.get(opened, job.state["run_id"]).status == "interrupted"
    assert not daemon.settings.socket_path.exists() and not daemon.settings.pid_path.exists()

    run_id = job.state["run_id"]  # the queued job resumes it: not to be given up under it
    refused = daemon.cli("runs", "discard", run_id, "--yes")
    assert refused.returncode == 1 and f"job {job_id} trains run {run_id} or will resume it" in refused.stderr
    assert daemon.cli("jobs", "cancel", job_id).returncode == 0
    daemon.start()
    discarded = daemon.cli("runs", "discard", run_id, "--yes")
    assert discarded.returncode == 0 and f"run {run_id} discarded" in discarded.stdout, discarded.stderr
    with store.open(daemon.settings) as opened:
        assert opened.db.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0] == 0
        [record] = audit.rows(opened, action="train.discarded")
        assert record["actor"] == "user:local-admin"  # through the control API, as its user


def test_a_user_holds_a_bounded_number_of_event_streams(daemon: Daemon) -> None:
    with contextlib.ExitStack() as held, daemon.api() as api:
        lines = [held.enter_context(api.stream("GET", "/v1/events")).iter_lines()
                 for _ in range(events_api.STREAMS_PER_USER)]
        assert [next(open_one) for open_one in lines] == [": idle"] * events_api.STREAMS_PER_USER
        refused = held.enter_context(api.stream("GET", "/v1/events"))
        assert refused.status_code == 429 and json.loads(refused.read())["type"] == "RateLimited"
    def given_back() -> bool:  # the closed ones are, as their ends reach the daemon
        with daemon.api() as api, api.stream("GET", "/v1/events") as again:
            return again.status_code == 200

    daemon.wait(given_back, 10, "closed event streams still count")


def test_an_open_event_stream_ends_when_the_daemon_stops(daemon: Daemon) -> None:
    """A watching TUI or `jobs watch` must not hold up a stop (systemd would kill the daemon mid-drain)."""
    with daemon.api() as api, api.stream("GET", "/v1/events", timeout=30) as stream:
        lines = stream.iter_lines()
        assert next(lines) == ": idle"  # the stream is open and waiting
        assert daemon.stop(signal.SIGTERM, timeout=20) == 0
        assert set(lines) <= {"", ": idle"}  # the stream ended cleanly, not cut off mid-answer


def test_a_higher_priority_job_preempts_and_a_cancel_stops(daemon: Daemon) -> None:
    from appliance.data import datasets

    with store.open(daemon.settings) as opened:
        datasets.import_file(opened, daemon.settings.state_dir.parent / "tickets.csv", name="tickets")
    low = submit(daemon, "train", {"dataset": "tickets", "params": LONG})
    daemon.wait(lambda: _steps_done(daemon, low) >= 4, 120, "training did not get going")
    high = submit(daemon, "train", {"dataset": "tickets", "params": TINY}, priority=10)

    assert daemon.ended(high)["status"] == "finished"
    requeued = [e for e in _events(daemon, low) if e.kind == "requeued"]
    assert requeued and f"preempted by job {high}" in requeued[0].data["reason"]
    daemon.wait(lambda: daemon.job(low)["status"] == "running" and daemon.job(low)["attempts"] == 2, 60,
                "the preempted job did not resume")
    with daemon.api() as api:
        assert api.post(f"/v1/jobs/{low}/cancel").status_code == 200
    assert daemon.ended(low)["status"] == "cancelled"


def test_a_viewer_cannot_deploy_and_the_refusal_is_audited(daemon: Daemon) -> None:
    with store.open(daemon.settings) as opened:
        _, viewer = users.add(opened, "auditor", "viewer")
    with daemon.api(viewer) as api:
        assert api.get("/v1/jobs").status_code == 200 and api.get("/v1/jobs").status_code == 200
        assert api.get("/v1/jobs/nope").status_code == 404
        refused = api.post("/v1/models/tickets/deploy", json={})
        submit = api.post("/v1/jobs", json={"kind": "train", "params": {"dataset": "x"}})
    with daemon.api() as api:  # a path that would move a terminal's cursor and colour what follows
        forged = api.get("/v1/jobs/%1B%5B1A%1B%5B2K%1B%5B32mFAKE", headers={"Authorization": "Bearer apu_nope"})
    assert refused.status_code == 403 and submit.status_code == 403 and forged.status_code == 401
    assert "operator" in refused.json()["error"]
    daemon.stop()  # the refusals counted in the last minute go on the record as the daemon stops
    with store.open(daemon.settings) as opened:
        refusals = [row for row in audit.rows(opened) if row["action"] == "api.refused"]
        reads = [(row["actor"], row["object"]) for row in audit.rows(opened, action="api.read")]
    assert [(row["actor"], row["object"]) for row in refusals] == [
        ("user:auditor", "POST /v1/models/tickets/deploy"), ("anonymous", "GET /v1/jobs/?[1A?[2K?[32mFAKE"),
        ("user:auditor", "POST /v1/jobs")]
    assert json.loads(refusals[2]["details"])["repeated"] == 1  # the first at once, the rest of its minute counted
    assert reads == [("user:auditor", "GET /v1/jobs"), ("user:auditor", "GET /v1/jobs/{job_id}")]  # once each


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "says"),
    [
        ("POST", "/v1/jobs", b"{not json", 400, "not valid"),
        ("POST", "/v1/jobs", {"kind": "dance", "params": {}}, 400, 'kind: "dance" is not a job kind'),
        ("POST", "/v1/jobs", {"kind": "train", "params": {"dataset": "t", "colour": 1}}, 400, ("params.colour: a train"
                                                                                              " job takes no such")),
        ("POST", "/v1/jobs", {"kind": "train", "params": {"dataset": "t", "params": {"epochz": 1}}}, 400, "epochz"),
        ("POST", "/v1/jobs", {"kind": "train", "params": {}}, 400, "params: send 'dataset' for a new run, or 'resume'"),
        ("POST", "/v1/jobs", {"kind": "train", "params": {"dataset": "t"}, "priority": 1000}, 400, "priority"),
        ("GET", "/v1/jobs/nope", None, 404, "no job"),
        ("POST", "/v1/jobs/nope/cancel", None, 404, "no job"),
        ("POST", "/v1/models/nope/deploy", {}, 404, "no model named 'nope'"),
        ("POST", "/v1/models/nope/deploy", {"version": 10**30}, 400, "version: Input should be less than or"),
        ("GET", "/v1/events?after=100000000000000000000", None, 400, "after: Input should be less than or equal"),
    ],
)
def test_malformed_calls_get_a_4xx_and_change_nothing(
    daemon: Daemon, method: str, path: str, body: Any, status: int, says: str
) -> None:
    with daemon.api() as api:
        content = body if isinstance(body, bytes) else None
        answer = api.request(method, path, content=content, json=None if content else body,
                             headers={"Content-Type": "application/json"})
        assert answer.status_code == status, answer.text
        assert says in answer.json()["error"]
        assert api.get("/v1/jobs").json() == []


BAD_PARAMS = [  # (kind, params, what the answer says): the field, the value as sent, what it takes
    ("train", {"dataset": "t", "params": {"epochs": 1e308}}, ("params.params.epochs: 1e+308 is not a whole number from"
                                                              " 1 to 1000")),
    ("train", {"dataset": "t", "params": {"epochs": "5"}}, 'params.params.epochs: "5" is not a whole number from 1'),
    ("train", {"dataset": "t", "params": {"epochs": "abc"}}, 'params.params.epochs: "abc" is not a whole number'),
    ("train", {"dataset": "t", "params": {"epochs": -1}}, "params.params.epochs: -1 is not a whole number from 1"),
    ("train", {"dataset": "t", "params": {"batch_size": 0}}, ("params.params.batch_size: 0 is not a whole number from"
                                                             " 1 to 4096")),
    ("train", {"dataset": "t", "speed": 11}, "params.speed: a train job takes no such parameter; it takes"),
    ("train", {"dataset": "t", "device": 1}, 'params.device: 1 is not one of "cpu", "cuda"'),
    ("optimize", {"version": "t:1", "distill_layers": "2"}, ('params.distill_layers: "2" is not a whole number from'
                                                            " 1 to 48")),
    ("optimize", {"version": "t:1", "distill_width": 0}, "params.distill_width: 0 is not a whole number from 1 to"),
    ("pipeline", {"dataset": "t", "canary_percent": "20"}, ('params.canary_percent: "20" is not a number above 0 and'
                                                           " at most 100")),
    ("tune", {"dataset": "t", "budget_s": "60"}, 'params.budget_s: "60" is not a number above 0 and at most 604800'),
    ("tune", {"dataset": "t", "budget_s": 60, "space": {"epochs": [2, 2.5]}}, ("params.space: epochs: 2.5 is not a"
                                                                               " whole number")),
]


def test_job_parameters_are_refused_at_submission_naming_field_value_and_range(daemon: Daemon) -> None:
    with daemon.api() as api:
        for kind, params, says in BAD_PARAMS:
            answer = api.post("/v1/jobs", json={"kind": kind, "params": params})
            assert answer.status_code == 400 and says in answer.json()["error"], answer.text
        assert api.get("/v1/jobs").json() == []
    assert "Traceback" not in (daemon.settings.state_dir / "daemon.log").read_text()


@pytest.fixture
def base_models(tmp_path: Path, tiny_base: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """train.base_models_dir holding the tiny model as 'tiny'; asked for before `daemon`, so the daemon has it."""
    shutil.copytree(tiny_base, tmp_path / "models" / "tiny")
    monkeypatch.setenv("APPLIANCE_TRAIN_BASE_MODELS_DIR", str(tmp_path / "models"))
    return tmp_path / "models"


def test_a_job_names_files_only_inside_roots_folders(base_models: Path, daemon: Daemon) -> None:
    settings = daemon.settings
    assert settings.base_models_dir == base_models and settings.daemon.import_dir is not None
    (settings.daemon.import_dir / "notes.csv").symlink_to(settings.key_file)  # what a careless root might leave
    (base_models / "state").symlink_to(settings.state_dir, target_is_directory=True)
    key = settings.key_file.read_text().strip()
    refused = [({"source": "../../etc/passwd"}, ("source: '../../etc/passwd' is not a name inside"
                                                " daemon.import_dir")),
               ({"source": str(settings.key_file)}, "is not a name inside daemon.import_dir"),
               ({"source": "notes.csv"}, "source: 'notes.csv' in daemon.import_dir is or passes through a link"),
               ({"source": "../var/master.key"}, "is not a name inside daemon.import_dir"),
               ({"base": "../var"}, 'base: there is no folder "../var" in train.base_models_dir'),
               ({"base": str(settings.state_dir)}, "in train.base_models_dir"),
               ({"base": "state"}, 'base: there is no folder "state" in train.base_models_dir')]
    with daemon.api() as api:
        for params, says in refused:
            answer = api.post("/v1/jobs", json={"kind": "pipeline", "params": {"dataset": "tickets", **params}})
            assert answer.status_code == 400 and key not in answer.text, answer.text
            assert says in answer.json()["error"], answer.text
        assert api.get("/v1/jobs").json() == []

    job_id = submit(daemon, "pipeline", {"source": "tickets.csv", "dataset": "tickets", "base": "tiny",
                                         "params": {**TINY, "epochs": 1}, "int8": False, "deploy": False})
    job = daemon.ended(job_id)
    assert job["status"] == "finished", job["error"]
    with store.open(settings) as opened:
        assert runs.get(opened, job["result"]["run_id"]).base_model == str(base_models / "tiny")


def test_calls_without_a_valid_token_get_401_on_the_socket_and_over_tls(daemon: Daemon) -> None:
    token = daemon.settings.cli_token_path.read_text().strip()
    remote = f"https://127.0.0.1:{daemon.env['APPLIANCE_DAEMON_TCP_PORT']}"
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.settings.socket_path))) as local, \
            httpx.Client(verify=False) as tcp:
        for http, base in ((local, "http://appliance"), (tcp, remote)):
            assert http.get(f"{base}/v1/health").status_code == 200
            answer = http.get(f"{base}/v1/jobs")
            assert answer.status_code == 401 and answer.headers["WWW-Authenticate"] == "Bearer"
            bad = http.get(f"{base}/v1/jobs", headers={"Authorization": "Bearer apu_nonsense"})
            assert bad.status_code == 401
            assert http.get(f"{base}/v1/jobs", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    with pytest.raises(httpx.RemoteProtocolError):  # TLS only: plain HTTP on that port gets no answer
        httpx.get(remote.replace("https", "http") + "/v1/health", timeout=5)


def _outside_now() -> str:
    later = datetime.now() + timedelta(hours=2)
    return f"{later:%H}:00-{(later + timedelta(hours=1)):%H}:00"


@pytest.mark.parametrize("daemon", [{"APPLIANCE_DAEMON_TRAINING_HOURS": _outside_now()}], indirect=True)
def test_jobs_wait_for_the_training_hours(daemon: Daemon) -> None:
    job_id = submit(daemon, "train", {"dataset": "tickets"})
    time.sleep(2)
    assert daemon.job(job_id)["status"] == "queued"
    with daemon.api() as api:
        status = api.get("/v1/status").json()
    assert status["running_job"] is None and "outside the training hours" in status["jobs_wait_for"]


def test_the_control_socket_is_the_groups_and_every_file_is_private(daemon: Daemon) -> None:
    daemon.wait(daemon.settings.pid_path.exists, 30, "the daemon wrote no pid file")  # written once both servers listen
    assert daemon.settings.socket_path.stat().st_mode & 0o777 == 0o660
    assert daemon.settings.socket_path.parent.stat().st_mode & 0o070 == 0o010  # the group passes, lists nothing
    for path in (daemon.settings.cli_token_path, daemon.settings.pid_path, daemon.settings.audit_head_path,
                 daemon.settings.db_path):
        assert path.stat().st_mode & 0o777 == 0o600, path


def test_the_cli_talks_to_the_running_daemon(base_models: Path, daemon: Daemon, tmp_path: Path) -> None:
    def cli(*args: str) -> str:
        result = daemon.cli(*args)
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert "imported as tickets:1" in cli("data", "import", str(tmp_path / "tickets.csv"), "--name", "tickets")
    elsewhere = daemon.cli("train", "--data", "tickets", "--base", str(tmp_path / "downloads" / "bert"))
    assert elsewhere.returncode == 1 and "Traceback" not in elsewhere.stderr
    assert "the daemon loads base models only from train.base_models_dir" in elsewhere.stderr
    training = daemon.cli("train", "--data", "tickets", "--base", str(base_models / "tiny"), "--epochs", "3", "--lr",
                          "3e-3", "--batch-size", "16", "--max-length", "32", "--seed", "3")
    assert training.returncode == 0, training.stderr
    assert "registered as tickets:1" in training.stdout
    assert "epoch 1/3: validation macro-F1 " in training.stderr  # the job's log, above the progress bar
    job_id = cli("jobs", "list").split()[0]  # newest first
    assert daemon.job(job_id)["params"]["base"] == "tiny"  # its name, which the daemon finds in its folder
    assert daemon.job(job_id)["kind"] == "train" and daemon.job(job_id)["status"] == "finished"
    assert '"run_id"' in cli("jobs", "show", job_id)
    logged = cli("jobs", "logs", job_id).splitlines()
    assert logged[0] == "stage: train" and logged[-1] == "finished"
    assert next(line for line in logged if line.startswith("epoch ")).startswith("epoch 1/3: validation macro-F1 ")
    assert logged[-2].startswith("kept epoch ") and "final figures on all " in logged[-2]
    assert "tickets:2" in cli("optimize", "tickets:1", "--no-int8", "--max-minutes", "30")
    assert daemon.job(cli("jobs", "list").split()[0])["params"]["max_minutes"] == 30  # the job keeps its limit
    assert "tickets:2 is production" in cli("deploy", "tickets:2")

    refused = daemon.cli("rollback", "tickets")
    assert refused.returncode == 1 and "no earlier version" in refused.stderr and "Traceback" not in refused.stderr
    again = daemon.cli("jobs", "cancel", job_id)
    assert again.returncode == 1 and "already finished" in again.stderr
    with store.open(daemon.settings) as opened:
        actors = {row["action"]: row["actor"] for row in audit.rows(opened)
                  if row["action"] in ("dataset.import", "job.submit", "model.deploy", "model.rollback")}
    assert actors == dict.fromkeys(("dataset.import", "job.submit", "model.deploy", "model.rollback"),
                                   f"user:{users.LOCAL_ADMIN}")

    assert "the daemon stopped" in cli("stop")
    assert daemon.process is not None and daemon.process.wait(timeout=30) == 0
    daemon.process = None
    assert daemon.cli("stop").stderr.startswith("error: no daemon is running")




NOTIFY_PATH = Path(tempfile.gettempdir()) / f"apl-notify-{os.getpid()}"


@pytest.fixture
def notify_socket() -> Iterator[socket.socket]:
    """What systemd listens on for Type=notify services: a datagram socket, named by $NOTIFY_SOCKET."""
    NOTIFY_PATH.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(NOTIFY_PATH))
    listener.settimeout(30)
    yield listener
    listener.close()
    NOTIFY_PATH.unlink(missing_ok=True)


@pytest.mark.parametrize("daemon", [{"NOTIFY_SOCKET": str(NOTIFY_PATH), "WATCHDOG_USEC": "1000000"}], indirect=True)
def test_the_daemon_speaks_systemds_notify_protocol(notify_socket: socket.socket, daemon: Daemon) -> None:
    def messages_until(wanted: str) -> list[str]:
        seen: list[str] = []
        while not any(wanted in message for message in seen):
            seen.append(notify_socket.recv(4096).decode())
        return seen

    assert any(message.startswith("READY=1") for message in messages_until("READY=1"))
    assert messages_until("WATCHDOG=1")  # every half of WatchdogSec while the loop and the supervisor tick
    assert daemon.process is not None
    os.kill(daemon.process.pid, signal.SIGTERM)
    assert any("STOPPING=1" in message for message in messages_until("STOPPING=1"))
    assert daemon.process.wait(timeout=60) == 0
    daemon.process = None


def test_sighup_rereads_the_config_file(daemon: Daemon, tmp_path: Path) -> None:
    from appliance.data import datasets

    daemon.stop()
    config_file = tmp_path / "appliance.toml"
    config_file.write_text(f'[daemon]\ntraining_hours = "{_outside_now()}"\n')
    daemon.env["APPLIANCE_CONFIG"] = str(config_file)
    daemon.start()
    with store.open(daemon.settings) as opened:
        datasets.import_file(opened, tmp_path / "tickets.csv", name="tickets")
    job_id = submit(daemon, "train", {"dataset": "tickets", "params": TINY})
    time.sleep(2)
    assert daemon.job(job_id)["status"] == "queued"

    config_file.write_text("[daemon]\n")  # no training hours: any time
    assert daemon.process is not None
    os.kill(daemon.process.pid, signal.SIGHUP)
    assert daemon.ended(job_id)["status"] == "finished"
    assert f"configuration reloaded from {config_file}" in (daemon.settings.state_dir / "daemon.log").read_text()


def test_serving_slower_than_its_objective_holds_jobs_back(opened: store.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor's judgement on the daemon's own metrics, in-process: windows of fast, then slow, answers."""
    from appliance.daemon import supervisor as service
    from appliance.serve.metrics import Metrics

    monkeypatch.setattr(service, "LATENCY_WINDOW_S", 0.0)
    metrics = Metrics()
    limits = dataclasses.replace(opened.settings.daemon, latency_objective_ms=50)
    supervisor = service.Supervisor(dataclasses.replace(opened.settings, daemon=limits), None, metrics)
    try:
        supervisor.tick()  # opens the first window
        for seconds in [0.004] * 30:
            metrics.latency.labels("tickets", "2").observe(seconds)
        supervisor.tick()
        assert supervisor.describe()["jobs_wait_for"] is None
        for seconds in [0.004] * 10 + [0.3] * 20:
            metrics.latency.labels("tickets", "2").observe(seconds)
        supervisor.tick()
        assert supervisor.describe()["jobs_wait_for"] == "serving latency was over its objective"
        job = jobs.submit(opened, jobspec.TrainJob(dataset="tickets"))
        supervisor.tick()
        assert jobs.get(opened, job.id).status == "queued" and supervisor.running is None
    finally:
        supervisor.close()


def test_a_job_deleted_while_its_process_exits_frees_the_supervisor(opened: store.Store) -> None:
    """The job records its end, a client deletes it at once, its process is still on its way out: the supervisor
    lets the process go, keeps nothing of the job, and runs the next one (it used to look the job up forever)."""
    import subprocess

    from appliance.daemon import supervisor as service
    from appliance.serve.metrics import Metrics
    from appliance.store import events

    quick = dataclasses.replace(opened.settings.daemon, stop_timeout_s=0.0)
    supervisor = service.Supervisor(dataclasses.replace(opened.settings, daemon=quick), None, Metrics())
    try:
        job = jobs.submit(opened, jobspec.TrainJob(dataset="tickets"))
        owner = jobs.claim(opened, job.id)
        assert owner is not None
        jobs.finish(opened, job.id, owner, {})
        exiting = subprocess.Popen(["sleep", "60"], text=True)
        supervisor.running = service.Running(jobs.get(opened, job.id), owner, exiting)
        jobs.delete(opened, job.id, actor="user:alice")
        supervisor.running.lines.put("a last line, after the job's end")
        supervisor.tick()  # still running: given its stop time (none here), then killed
        exiting.wait(10)
        supervisor.tick()
        assert supervisor.running is None and supervisor.describe()["running_job"] is None
        assert [event.kind for event in events.after(opened, 0, job.id)] == []
    finally:
        supervisor.close()


def test_the_hardware_is_detected_by_one_child_however_many_ask_at_once(daemon: Daemon) -> None:
    """Each detection loads torch in a child process: a viewer asking many times at once starts one."""
    from concurrent.futures import ThreadPoolExecutor

    import psutil

    def detecting() -> int:
        children = psutil.Process(daemon.process.pid).children()
        return sum("hw" in child.cmdline() for child in children if child.is_running())

    with store.open(daemon.settings) as opened:
        viewer = users.add(opened, "watcher", "viewer")[1]
    with daemon.api(viewer) as api, ThreadPoolExecutor(6) as pool:
        asked = [pool.submit(api.get, "/v1/hardware") for _ in range(6)]
        most = 0
        while not all(answer.done() for answer in asked):
            with contextlib.suppress(psutil.Error):
                most = max(most, detecting())
            time.sleep(0.05)
        reports = [answer.result() for answer in asked]
    assert [report.status_code for report in reports] == [200] * 6
    assert most == 1 and len({report.text for report in reports}) == 1


def test_a_socket_setting_that_names_a_file_leaves_the_file_alone(tmp_path: Path) -> None:
    """A mistyped daemon.socket naming the config file deleted it: only a stale socket is replaced."""
    run_cli("keys", "init", check=True)
    kept = tmp_path / "appliance.toml"
    kept.write_text("# the configuration\n")
    started = run_cli("daemon", env={"APPLIANCE_DAEMON_SOCKET": str(kept)})
    assert started.returncode == 1 and "which is not a socket: the daemon will not replace it" in started.stderr
    assert kept.read_text() == "# the configuration\n"
