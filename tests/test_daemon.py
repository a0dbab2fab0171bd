"""The real daemon as a subprocess on a temporary state directory, driven through its control socket."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from appliance import config, events, jobs, store, users
from appliance.store import audit, lifecycle
from appliance.train import runs
from tests.conftest import write_tickets

pytestmark = pytest.mark.slow

TINY = {"epochs": 3, "learning_rate": 3e-3, "batch_size": 16, "max_length": 32, "seed": 3}
# Long enough to interrupt: many short epochs, a checkpoint every other step, no early stop.
LONG = {**TINY, "epochs": 60, "patience": 60, "checkpoint_every": 2}


@dataclass
class Daemon:
    env: dict[str, str]
    settings: config.Settings
    process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        log = open(self.settings.state_dir / "daemon.log", "a")  # noqa: SIM115  closed with the process
        self.process = subprocess.Popen([sys.executable, "-m", "appliance", "daemon"], env=self.env, text=True,
                                        stdout=log, stderr=log, start_new_session=True)
        self.wait(self._answers, 60, "the daemon did not start")

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 60) -> int:
        assert self.process is not None
        os.kill(self.process.pid, signum)
        code = self.process.wait(timeout=timeout)
        self.process = None
        return code

    def api(self, token: str | None = None) -> httpx.Client:
        token = token or self.settings.cli_token_path.read_text().strip()
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.settings.socket_path)),
                            base_url="http://appliance", headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "appliance", *args], env=self.env, capture_output=True, check=False,
                              text=True, timeout=300)

    def job(self, job_id: str) -> dict[str, Any]:
        with self.api() as api:
            return api.get(f"/v1/jobs/{job_id}").json()

    def wait(self, predicate: Callable[[], Any], seconds: float, message: str) -> Any:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                log = (self.settings.state_dir / "daemon.log").read_text()
                raise AssertionError(f"the daemon exited {self.process.returncode}:\n{log[-3000:]}")
            found = predicate()
            if found:
                return found
            time.sleep(0.2)
        raise AssertionError(message + "\n" + (self.settings.state_dir / "daemon.log").read_text()[-3000:])

    def ended(self, job_id: str, seconds: float = 240) -> dict[str, Any]:
        return self.wait(lambda: (job := self.job(job_id))["status"] in ("finished", "failed", "cancelled") and job,
                         seconds, f"job {job_id} did not end")

    def _answers(self) -> bool:
        try:
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(self.settings.socket_path))) as http:
                return http.get("http://appliance/v1/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False


@pytest.fixture
def daemon(tiny_base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    short = Path(tempfile.mkdtemp(prefix="apl-", dir="/tmp"))  # a unix socket path must stay under 108 bytes
    env = {**os.environ, "APPLIANCE_STATE_DIR": str(tmp_path / "var"), "APPLIANCE_DAEMON_SOCKET": str(short / "s"),
           "APPLIANCE_SERVE_PORT": str(port), "APPLIANCE_SERVE_POLL_S": "0.2", "APPLIANCE_TRAIN_BASE_MODEL":
           str(tiny_base), "APPLIANCE_DAEMON_STOP_TIMEOUT_S": "60", "HF_HUB_OFFLINE": "1"}
    for name, value in env.items():
        if name.startswith("APPLIANCE_"):
            monkeypatch.setenv(name, value)  # the same settings for config.load() in the test
    settings = config.load()
    lifecycle.init(settings).close()
    write_tickets(tmp_path / "tickets.csv")
    running = Daemon(env, settings)
    running.start()
    yield running
    if running.process is not None:
        running.stop(signal.SIGKILL)


def _submit(daemon: Daemon, kind: str, params: dict[str, Any], priority: int = 0) -> str:
    with daemon.api() as api:
        answer = api.post("/v1/jobs", json={"kind": kind, "params": params, "priority": priority})
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def _events(daemon: Daemon, job_id: str) -> list[events.Event]:
    with store.open(daemon.settings) as opened:
        return events.after(opened, 0, job_id, 100_000)


def _steps_done(daemon: Daemon, job_id: str) -> int:
    steps = [event.data.get("step", 0) for event in _events(daemon, job_id) if event.kind == "progress"]
    return max(steps, default=0)


def test_the_pipeline_imports_trains_optimises_deploys_and_serves(daemon: Daemon, tmp_path: Path) -> None:
    job_id = _submit(daemon, "pipeline", {"source": str(tmp_path / "tickets.csv"), "dataset": "tickets",
                                          "params": TINY, "int8": False})
    job = daemon.ended(job_id)
    assert job["status"] == "finished", job["error"]
    assert [e.data["stage"] for e in _events(daemon, job_id) if e.kind == "stage"] == \
        ["import", "train", "optimize", "deploy"]
    assert job["result"]["version"] == "tickets:2" and job["state"]["deployed"] == "tickets:2"

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
    with store.open(daemon.settings) as opened:
        actors = {row["actor"] for row in audit.rows(opened) if row["action"] in ("job.submit", "model.deploy")}
    assert actors == {f"user:{users.LOCAL_ADMIN}"}


def test_kill_9_mid_training_then_restart_resumes_from_the_checkpoint(daemon: Daemon) -> None:
    from appliance import datasets

    with store.open(daemon.settings) as opened:
        datasets.import_file(opened, daemon.settings.state_dir.parent / "tickets.csv", name="tickets")
    job_id = _submit(daemon, "train", {"dataset": "tickets", "params": LONG})
    daemon.wait(lambda: _steps_done(daemon, job_id) >= 12, 120, "training did not get going")
    child = daemon.job(job_id)["pid"]

    daemon.stop(signal.SIGKILL)
    daemon.wait(lambda: not _alive(child), 10, "the job process outlived the daemon")
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
    from appliance import datasets

    with store.open(daemon.settings) as opened:
        datasets.import_file(opened, daemon.settings.state_dir.parent / "tickets.csv", name="tickets")
    job_id = _submit(daemon, "train", {"dataset": "tickets", "params": LONG})
    daemon.wait(lambda: _steps_done(daemon, job_id) >= 4, 120, "training did not get going")

    assert daemon.stop(signal.SIGTERM) == 0
    with store.open(daemon.settings) as opened:
        job = jobs.get(opened, job_id)
        assert job.status == "queued" and job.owner is None
        assert runs.get(opened, job.state["run_id"]).status == "interrupted"
    assert not daemon.settings.socket_path.exists() and not daemon.settings.pid_path.exists()


def test_a_higher_priority_job_preempts_and_a_cancel_stops(daemon: Daemon) -> None:
    from appliance import datasets

    with store.open(daemon.settings) as opened:
        datasets.import_file(opened, daemon.settings.state_dir.parent / "tickets.csv", name="tickets")
    low = _submit(daemon, "train", {"dataset": "tickets", "params": LONG})
    daemon.wait(lambda: _steps_done(daemon, low) >= 4, 120, "training did not get going")
    high = _submit(daemon, "train", {"dataset": "tickets", "params": TINY}, priority=10)

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
        assert api.get("/v1/jobs").status_code == 200
        refused = api.post("/v1/models/tickets/deploy", json={})
        submit = api.post("/v1/jobs", json={"kind": "train", "params": {"dataset": "x"}})
    assert refused.status_code == 403 and submit.status_code == 403
    assert "operator" in refused.json()["error"]
    with store.open(daemon.settings) as opened:
        refusals = [row for row in audit.rows(opened) if row["action"] == "api.refused"]
    assert [(row["actor"], row["object"]) for row in refusals] == [
        ("user:auditor", "POST /v1/models/tickets/deploy"), ("user:auditor", "POST /v1/jobs")]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "says"),
    [
        ("POST", "/v1/jobs", b"{not json", 400, "not valid"),
        ("POST", "/v1/jobs", {"kind": "dance", "params": {}}, 400, "unknown job kind"),
        ("POST", "/v1/jobs", {"kind": "train", "params": {"dataset": "t", "colour": 1}}, 400, "unknown parameters"),
        ("POST", "/v1/jobs", {"kind": "train", "params": {"dataset": "t", "params": {"epochz": 1}}}, 400, "epochz"),
        ("POST", "/v1/jobs", {"kind": "train", "params": {}}, 400, "needs 'dataset'"),
        ("POST", "/v1/jobs", {"kind": "train", "params": {"dataset": "t"}, "priority": 1000}, 400, "priority"),
        ("GET", "/v1/jobs/nope", None, 404, "no job"),
        ("POST", "/v1/jobs/nope/cancel", None, 404, "no job"),
        ("POST", "/v1/models/nope/deploy", {}, 400, "nope"),
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


def test_calls_without_a_valid_token_get_401(daemon: Daemon) -> None:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.settings.socket_path))) as http:
        assert http.get("http://appliance/v1/health").status_code == 200
        answer = http.get("http://appliance/v1/jobs")
        assert answer.status_code == 401 and answer.headers["WWW-Authenticate"] == "Bearer"
        bad = http.get("http://appliance/v1/jobs", headers={"Authorization": "Bearer apu_nonsense"})
        assert bad.status_code == 401


def test_the_control_socket_and_the_cli_token_are_private(daemon: Daemon) -> None:
    assert daemon.settings.socket_path.stat().st_mode & 0o777 == 0o660
    assert daemon.settings.cli_token_path.stat().st_mode & 0o777 == 0o600


def test_the_cli_talks_to_the_running_daemon(daemon: Daemon, tmp_path: Path) -> None:
    from appliance import datasets

    with store.open(daemon.settings) as opened:
        datasets.import_file(opened, tmp_path / "tickets.csv", name="tickets")
    submitted = daemon.cli("jobs", "submit", "train", "-p", "dataset=tickets", "-p", f"params={_json(TINY)}",
                           "--follow")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[1]
    assert daemon.job(job_id)["status"] == "finished"
    listed = daemon.cli("jobs", "list")
    assert f"{job_id}" in listed.stdout and "finished" in listed.stdout
    shown = daemon.cli("jobs", "show", job_id)
    assert '"run_id"' in shown.stdout
    assert daemon.cli("jobs", "logs", job_id).stdout.splitlines() == ["stage: train", "finished"]
    again = daemon.cli("jobs", "cancel", job_id)
    assert again.returncode == 1 and "already finished" in again.stderr and "Traceback" not in again.stderr

    stopped = daemon.cli("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert daemon.process is not None and daemon.process.wait(timeout=30) == 0
    daemon.process = None
    assert daemon.cli("stop").stderr.startswith("error: no daemon is running")


def _alive(pid: int) -> bool:
    """Running, not gone and not a zombie waiting for a reaper."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _json(value: Any) -> str:
    import json

    return json.dumps(value)
