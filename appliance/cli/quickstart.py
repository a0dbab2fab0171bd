"""`appliance quickstart`: from a fresh clone to a served model, on embedded defaults.

It creates the master key and the store on first use, starts the daemon if none runs,
sends the sample dataset that ships with the appliance to it for import, and submits
one pipeline job: fine-tune the bundled base model on the sample, optimise the result for this box (OpenVINO,
INT8 under the accuracy guard) and deploy it. Then it prints the endpoint, an example
`curl` and a live prediction from the running server. Running it again reuses what the
first run made: the key, the daemon, the finished job and the API key it created.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import click
import httpx

from appliance.cli.base import cli, load_settings
from appliance.cli.jobs import result_of
from appliance.core.config import Settings
from appliance.core.errors import ApplianceError, DaemonError
from appliance.daemon import client
from appliance.operations.jobspec import PipelineJob
from appliance.store import keys, lifecycle

SAMPLE_NAME = "sample-tickets"
EXAMPLE = "I was charged twice for my subscription this month"
DAEMON_START_S = 120
MODEL_READY_S = 120


@cli.command()
def quickstart() -> None:
    """Start the daemon, fine-tune the bundled model on the sample data, deploy it and try it."""
    settings = load_settings()
    if not settings.key_file.exists() and not os.environ.get("APPLIANCE_PASSPHRASE"):
        with lifecycle.init(settings):
            click.echo(f"created the master key at {settings.key_file} (mode 0600)")
            click.echo("  back it up somewhere safe: without it nothing in the store can be read")
    _ensure_daemon(settings)
    with client.Client(settings) as api:
        job = _pipeline_job(api)
        result = result_of(api, job)
        served = next(v for v in api.get("/v1/models") if f"{v['model']}:{v['version']}" == result["version"])
        metrics = served["variants"][served["chosen"]]["metrics"]
        click.echo(f"job {job['id']}: trained run {result['run_id']}, deployed {result['version']}, serving its"
                   f" {served['chosen']} variant: validation accuracy {metrics.get('accuracy', 0):.3f}")
        token = _api_key(api, settings)
    model = result["version"].partition(":")[0]
    url = f"{settings.inference_url}/v1/models/{model}:predict"
    prediction = _live_prediction(settings, url, token, model)
    click.echo(f"\nserving {model} at {url}")
    click.echo(f"API key (kept in {_key_path(settings)}, mode 0600): {token[:20]}...")
    click.echo("try it:")
    click.echo(f"  curl -s -H \"Authorization: Bearer $(cat {_key_path(settings)})\" -H 'Content-Type: application/json' \\")
    click.echo(f"       -d '{{\"instances\": [\"{EXAMPLE}\"]}}' {url}")
    click.echo(f"live prediction for {EXAMPLE!r}: {prediction['label']} ({max(prediction['scores'].values()):.2f})")
    click.echo("stop the daemon with 'appliance stop'; 'appliance jobs list' and 'appliance models list' show the rest")


def _ensure_daemon(settings: Settings) -> None:
    """Start `appliance daemon` in the background unless one answers already."""
    if client.daemon_running(settings):
        click.echo(f"using the running daemon on {settings.socket_path}")
        return
    log_path = settings.state_dir / "daemon.log"
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log_file:
        process = subprocess.Popen([sys.executable, "-m", "appliance", "daemon"], stdin=subprocess.DEVNULL,
                                   stdout=log_file, stderr=log_file, start_new_session=True)
    deadline = time.monotonic() + DAEMON_START_S
    while not client.daemon_running(settings):
        if process.poll() is not None or time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
            raise DaemonError("the daemon did not start: " + (" / ".join(tail) or "no output"),
                              hint=f"its log is {log_path}")
        time.sleep(0.2)
    click.echo(f"started the daemon (pid {process.pid}); its log is {log_path}")


def _pipeline_job(api: client.Client) -> dict[str, Any]:
    """The quickstart's pipeline job: an earlier one that finished or is under way, else a new one."""
    for job in api.get("/v1/jobs"):
        mine = job["kind"] == "pipeline" and job["params"].get("name") == SAMPLE_NAME
        if mine and job["status"] in ("queued", "running", "finished"):
            click.echo(f"reusing job {job['id']} ({job['status']})")
            return job
    with resources.as_file(resources.files("appliance.samples") / "support_tickets.csv") as sample:
        imported = api.upload(sample, {"name": SAMPLE_NAME})  # the daemon reads only the bytes it is sent
    click.echo(f"sample data {'already stored as' if imported['unchanged'] else 'imported as'} {imported['ref']}")
    job = api.post("/v1/jobs", PipelineJob(dataset=SAMPLE_NAME, name=SAMPLE_NAME, deploy="now").body())
    click.echo(f"job {job['id']} queued: fine-tune, optimise, deploy")
    return job


def _api_key(api: client.Client, settings: Settings) -> str:
    """The quickstart's API key: made once, kept in a 0600 file in the state directory."""
    path = _key_path(settings)
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    token = api.post("/v1/api-keys", {"name": "quickstart"})["token"]
    keys.write_private(path, token + "\n")
    return token


def _key_path(settings: Settings) -> Path:
    return settings.state_dir / "quickstart.key"


def _live_prediction(settings: Settings, url: str, token: str, model: str) -> dict[str, Any]:
    """Ask the running server, waiting while it loads and warms the new version."""
    headers = {"Authorization": f"Bearer {token}"}
    deadline = time.monotonic() + MODEL_READY_S
    with httpx.Client(verify=False, timeout=30) as http:  # our own self-signed certificate, on loopback
        while True:
            try:
                ready = http.get(f"{settings.inference_url}/v2/models/{model}/ready", headers=headers)
                if ready.status_code == 200:
                    answer = http.post(url, headers=headers, json={"instances": [EXAMPLE]})
                    if answer.status_code == 200:
                        return answer.json()["predictions"][0]
                    raise ApplianceError(f"the server answered {answer.status_code}: {answer.text[:200]}")
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise DaemonError(f"the server did not load {model} within {MODEL_READY_S} s",
                                  hint=f"see {settings.state_dir / 'daemon.log'}")
            time.sleep(0.5)
