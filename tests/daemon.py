"""The real daemon as a subprocess on a temporary state directory: how tests start, ask and stop it.

Its daemon.import_dir is the folder `import` beside the state directory.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from appliance.core import config

TINY = {"epochs": 3, "learning_rate": 3e-3, "batch_size": 16, "max_length": 32, "seed": 3}


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

    def upload(self, path: Path, **options: Any) -> httpx.Response:
        """Import a local file the way the CLI does: its bytes in the body, the options in the query."""
        with self.api() as api:
            return api.post("/v1/datasets", params={"filename": path.name, **options}, content=path.read_bytes(),
                            headers={"Content-Type": "application/octet-stream"})

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



SHORT_DIRS: list[Path] = []


def short_dir() -> Path:
    """A new directory with a short path, for a unix socket (whose path must stay under 108 bytes); conftest removes
    them all when the session ends."""
    SHORT_DIRS.append(Path(tempfile.mkdtemp(prefix="apl-", dir="/tmp")))
    return SHORT_DIRS[-1]


def environment(state_dir: Path, tiny_base: Path, **extra: str) -> dict[str, str]:
    """The daemon's environment: its own state directory, socket and ports, the tiny base model, quick polling."""
    short = short_dir()
    imports = state_dir.parent / "import"  # what root would let the daemon read by name: daemon.import_dir
    imports.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "APPLIANCE_STATE_DIR": str(state_dir), "APPLIANCE_DAEMON_SOCKET": str(short / "s"),
            "APPLIANCE_DAEMON_IMPORT_DIR": str(imports),
            "APPLIANCE_SERVE_PORT": str(free_port()), "APPLIANCE_SERVE_POLL_S": "0.2",
            "APPLIANCE_TRAIN_BASE_MODEL": str(tiny_base), "APPLIANCE_DAEMON_STOP_TIMEOUT_S": "60",
            "APPLIANCE_DAEMON_TCP_PORT": str(free_port()), "HF_HUB_OFFLINE": "1", **extra}


def settings_of(env: dict[str, str]) -> config.Settings:
    """The settings the daemon reads from env, for the test's side."""
    saved = dict(os.environ)
    os.environ.update({name: value for name, value in env.items() if name.startswith("APPLIANCE_")})
    try:
        return config.load()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def submit(daemon: Daemon, kind: str, params: dict[str, Any], priority: int = 0) -> str:
    with daemon.api() as api:
        answer = api.post("/v1/jobs", json={"kind": kind, "params": params, "priority": priority})
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def alive(pid: int) -> bool:
    """Running, not gone and not a zombie waiting for a reaper."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
