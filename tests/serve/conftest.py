"""A store with two servable versions of a tiny model, and the real server in a subprocess on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from appliance import inference, optimize, registry, store
from appliance.access import auth
from appliance.core import archive, config
from appliance.data import datasets
from appliance.operations import pipeline
from appliance.store import lifecycle
from appliance.train import engine
from appliance.train.bundle import load_text_classifier
from appliance.train.params import TrainParams
from tests.conftest import Trained, write_tickets

F32 = {"INFERENCE_PRECISION_HINT": "f32"}  # exact logits, to compare a batch with one text at a time
FAST = TrainParams(epochs=8, learning_rate=3e-3, batch_size=16, max_length=32, seed=3)


@dataclass
class State:
    """A state directory with tickets:2 and tickets:3 optimised (2 in production) and three API keys."""

    settings: config.Settings
    token: str  # may call every model, and send true labels
    scoped_token: str  # may call only a model named "other", and send true labels
    unlabelling_token: str  # may call every model, and not send true labels

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "APPLIANCE_STATE_DIR": str(self.settings.state_dir), "HF_HUB_OFFLINE": "1"}

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([sys.executable, "-m", "appliance", *args], capture_output=True, text=True,
                                env=self.env, timeout=300, check=False)
        if check and result.returncode:
            raise AssertionError(f"appliance {' '.join(args)} failed:\n{result.stderr}")
        return result

    def open(self) -> store.Store:
        return store.open(self.settings)


@pytest.fixture(scope="session")
def state(tiny_base: Path, tmp_path_factory: pytest.TempPathFactory) -> State:
    root = tmp_path_factory.mktemp("served")
    settings = config.Settings(state_dir=root / "var", key_file=root / "var" / "master.key", config_file=None,
                               base_model=tiny_base)
    with lifecycle.init(settings) as opened:
        datasets.import_file(opened, write_tickets(root / "tickets.csv"), name="tickets")
        result = engine.start(opened, dataset="tickets", base_dir=tiny_base, params=FAST)
        pipeline.register_run(opened, result.run_id, "tickets")
        for _ in range(2):
            pipeline.optimize_version(opened, "tickets:1", pipeline.OptimizeOptions(int8=False))
        registry.deploy(opened, "tickets:2")
        _, token = auth.create(opened, "tests", may_label=True)
        _, scoped = auth.create(opened, "other-team", ["other"], may_label=True)
        _, unlabelling = auth.create(opened, "shop-front")
    return State(settings, token, scoped, unlabelling)


@dataclass
class Server:
    url: str
    process: subprocess.Popen[str]
    state: State
    log: Path  # its stderr: a file, not a pipe, which its access log would fill and stall

    def logged(self) -> str:
        return self.log.read_text()

    def client(self, token: str | None = "default", **options: object) -> httpx.Client:
        headers = {"X-API-Key": self.state.token if token == "default" else token} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **options)

    def wait(self, predicate: object, seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if predicate():  # type: ignore[operator]
                return
            time.sleep(0.1)
        raise AssertionError("the server did not get there in time")


def start_server(state: State, **settings: str) -> Server:
    """`appliance serve` on a free loopback port, once it answers ready."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = state.env | {"APPLIANCE_SERVE_PORT": str(port), "APPLIANCE_SERVE_POLL_S": "0.2"}
    env |= {f"APPLIANCE_SERVE_{name.upper()}": value for name, value in settings.items()}
    log = state.settings.state_dir.parent / f"serve-{port}.log"
    with log.open("w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "appliance", "serve"], env=env, text=True,
                                   stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
    scheme = "https" if settings.get("tls") == "true" else "http"
    server = Server(f"{scheme}://127.0.0.1:{port}", process, state, log)

    def ready() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the server exited {process.returncode}:\n{server.logged()}")
        try:
            return httpx.get(f"{server.url}/v2/health/ready", verify=False, timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    server.wait(ready, 60)
    return server


def stop_server(server: Server) -> str:
    """SIGTERM, as systemd stops it; returns what it wrote to stderr."""
    os.killpg(server.process.pid, signal.SIGTERM)
    try:
        server.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait()
    return server.logged()


@pytest.fixture(scope="module")
def server(state: State) -> Iterator[Server]:
    running = start_server(state, drift_window="40")
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def servable(trained: Trained) -> inference.Servable:
    """The trained tiny classifier exported to OpenVINO and compiled, as a server would load it."""
    files = archive.unpack(trained.bundle)
    model, _, manifest = load_text_classifier(files)
    packed = inference.pack_ir(optimize.export_openvino(model, manifest["max_length"]), files, "fp32")
    return inference.load_ir(packed, config=F32, throughput=True)
