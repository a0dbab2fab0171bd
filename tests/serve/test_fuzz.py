"""Both HTTP APIs fuzzed from their own OpenAPI documents (schemathesis) against the real daemon.

The daemon runs on a copy of the served state (tickets:2 in production), with jobs held outside their
training hours so that submitted jobs queue rather than train. Every operation gets a bounded number of
generated requests, valid and invalid, with a token that may do everything; the checks are
schemathesis' defaults: no 5xx, and every status, header and body as the document says.
"""

from __future__ import annotations

import shutil
import signal
import ssl
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from tests.daemon import Daemon, environment, settings_of
from tests.serve.conftest import State

EXAMPLES = 30  # generated requests per operation and mode: a couple of thousand requests, about two minutes
STREAMS = ("/v1/events",)  # server-sent events never end: not for a request-answer fuzzer
# Invalid data may also be refused for its size (413), which both documents promise; the rest is schemathesis' list.
REFUSALS = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]


@pytest.fixture(scope="module")
def fuzzed(state: State, tiny_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("fuzzed")
    shutil.copytree(state.settings.state_dir, root / "var")
    later = (datetime.now() + timedelta(hours=2)).strftime("%H:%M")
    much_later = (datetime.now() + timedelta(hours=3)).strftime("%H:%M")
    env = environment(root / "var", tiny_base, APPLIANCE_DAEMON_TRAINING_HOURS=f"{later}-{much_later}")
    running = Daemon(env, settings_of(env))
    running.start()
    monkeypatch = pytest.MonkeyPatch()  # every request of the fuzzer (its own checks too) trusts the daemon's certificate
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(running.settings.state_dir / "tls-cert.pem"))
    running.wait(lambda: _ready(running, state.token), 120, "the copied model did not serve")
    yield running
    monkeypatch.undo()
    if running.process is not None:
        running.stop(signal.SIGKILL)


def _ready(daemon: Daemon, token: str) -> bool:
    try:
        return httpx.get(f"{daemon.settings.inference_url}/v2/models/tickets/ready",
                         headers={"X-API-Key": token}).status_code == 200
    except httpx.TransportError:
        return False


def _control(daemon: Daemon) -> str:
    return f"https://{daemon.settings.daemon.tcp_host}:{daemon.settings.daemon.tcp_port}"


def _admin(daemon: Daemon) -> dict[str, str]:
    return {"Authorization": f"Bearer {daemon.settings.cli_token_path.read_text().strip()}"}


@pytest.fixture(scope="module")
def inference_schema(fuzzed: Daemon, state: State) -> Any:
    document = httpx.get(f"{fuzzed.settings.inference_url}/openapi.json", headers={"X-API-Key": state.token})
    assert document.status_code == 200, document.text
    return schemathesis.openapi.from_dict(document.json(), config=_config(document.json(), state.token))


@pytest.fixture(scope="module")
def control_schema(fuzzed: Daemon) -> Any:
    document = httpx.get(f"{_control(fuzzed)}/openapi.json", headers=_admin(fuzzed),
                         verify=ssl.create_default_context(cafile=fuzzed.settings.state_dir / "tls-cert.pem"))
    assert document.status_code == 200, document.text
    token = fuzzed.settings.cli_token_path.read_text().strip()
    return schemathesis.openapi.from_dict(document.json(), config=_config(document.json(), token, refers=True))


def _config(document: dict[str, Any], token: str, *, refers: bool = False) -> SchemathesisConfig:
    """The token for every security scheme the document names, so the fuzzer decides when to leave it out.

    An API that refers to things (refers=True: a dataset, a job, a folder that must exist) refuses some
    schema-valid requests with a documented 400, so the check that every valid request is taken is off for it.
    """
    schemes = document["components"]["securitySchemes"]
    auth = {name: {"api_key": token} if scheme["type"] == "apiKey" else {"bearer": token}
            for name, scheme in schemes.items()}
    checks: dict[str, Any] = {"negative_data_rejection": {"expected-statuses": REFUSALS}}
    if refers:
        checks["positive_data_acceptance"] = {"enabled": False}
    return SchemathesisConfig.from_dict({"auth": {"openapi": auth}, "checks": checks})


inference_api = schemathesis.pytest.from_fixture("inference_schema")
control_api = schemathesis.pytest.from_fixture("control_schema").exclude(path=list(STREAMS))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=list(HealthCheck))


@pytest.mark.slow
@inference_api.parametrize()
@FUZZ
def test_the_inference_api_keeps_to_its_document(case: Any, fuzzed: Daemon) -> None:
    response = case.call(base_url=fuzzed.settings.inference_url, timeout=30)
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code} {response.text}"
    case.validate_response(response)


@pytest.mark.slow
@control_api.parametrize()
@FUZZ
def test_the_control_api_keeps_to_its_document(case: Any, fuzzed: Daemon) -> None:
    response = case.call(base_url=_control(fuzzed), timeout=120)
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code} {response.text}"
    case.validate_response(response)
