"""The real daemon's control API: every error body is typed by its class, and the client raises that class again."""

from __future__ import annotations

import pytest

from appliance import store
from appliance.access import users
from appliance.core import errors
from appliance.daemon.client import Client
from tests.daemon import Daemon

pytestmark = pytest.mark.slow

REFUSED = [  # (method, path, what the request sends, status, type)
    ("GET", "/v1/jobs/nope", {}, 404, "JobNotFound"),
    ("GET", "/v1/studies/nope", {}, 404, "StudyNotFound"),
    ("GET", "/v1/runs/nope", {}, 404, "RunNotFound"),
    ("POST", "/v1/models/nope/predict", {"json": {"texts": ["x"]}}, 404, "ModelNotFound"),
    ("POST", "/v1/models/nope/deploy", {"json": {}}, 404, "VersionNotFound"),
    ("POST", "/v1/models/tickets:9/deploy", {"json": {}}, 404, "VersionNotFound"),
    ("POST", "/v1/datasets/nope/residency", {"json": {"residency": "local-only"}}, 404, "DatasetNotFound"),
    ("POST", "/v1/feedback", {"json": {"feedback": [{"prediction_id": "nope", "label": "x"}]}}, 404,
     "PredictionNotFound"),
    ("POST", "/v1/jobs", {"json": {"kind": "train", "params": {}}}, 400, "ValidationError"),
    ("POST", "/v1/jobs", {"content": b"{not json"}, 400, "ValidationError"),
    ("GET", "/v1/audit", {"params": {"since": "soon"}}, 400, "BadRequest"),
    ("GET", "/v1/audit", {"params": {"since": "999999999d"}}, 400, "BadRequest"),  # before the year 1
    ("POST", "/v1/models/tickets:\u00b2/deploy", {"json": {}}, 400, "RegistryError"),  # a digit int() refuses
    ("POST", "/v1/jobs", {"content": b"{" + b" " * (2 << 20) + b"}"}, 413, "PayloadTooLarge"),
    ("GET", "/v1/nothing-here", {}, 404, "RouteNotFound"),
    ("DELETE", "/v1/jobs", {}, 405, "MethodNotAllowed"),
]


def test_every_error_body_names_its_class(daemon: Daemon) -> None:
    with store.open(daemon.settings) as opened:
        _, viewer = users.add(opened, "auditor", "viewer")
    with daemon.api() as api:
        answers = [api.request(method, path, headers={"Content-Type": "application/json"}, **sent)
                   for method, path, sent, _, _ in REFUSED]
    with daemon.api(viewer) as api:
        answers.append(api.post("/v1/models/tickets/deploy", json={}))
    with daemon.api("apu_nonsense") as api:
        answers.append(api.get("/v1/jobs"))
    expected = [(status, kind) for _, _, _, status, kind in REFUSED] + [(403, "Forbidden"), (401, "Unauthenticated")]
    assert [(answer.status_code, answer.json()["type"]) for answer in answers] == expected, [a.text for a in answers]
    assert all(set(answer.json()) <= {"type", "error", "hint"} for answer in answers)


def test_the_client_raises_what_the_daemon_refused_with(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    with Client(daemon.settings) as client:
        for path, kind in [("/v1/jobs/nope", errors.JobNotFound), ("/v1/studies/nope", errors.StudyNotFound),
                           ("/v1/runs/nope", errors.RunNotFound)]:
            with pytest.raises(errors.ApplianceError) as raised:
                client.get(path)
            assert type(raised.value) is kind, path
        with pytest.raises(errors.ModelNotFound, match="no model named 'nope' is being served"):
            client.post("/v1/models/nope/predict", {"texts": ["x"]})  # a 404 that is not a job's
        with pytest.raises(errors.VersionNotFound, match="nope"):
            client.post("/v1/models/nope/deploy")
        with pytest.raises(errors.DatasetNotFound, match="no dataset 'nope'"):
            client.post("/v1/datasets/nope/residency", {"residency": "local-only"})
        with pytest.raises(errors.PredictionNotFound):
            client.post("/v1/feedback", {"feedback": [{"prediction_id": "nope", "label": "x"}]})
    with store.open(daemon.settings) as opened:
        _, viewer = users.add(opened, "auditor", "viewer")
    monkeypatch.setenv("APPLIANCE_TOKEN", viewer)
    with Client(daemon.settings) as client, pytest.raises(errors.Forbidden, match="needs operator"):
        client.post("/v1/models/tickets/deploy")
    monkeypatch.setenv("APPLIANCE_TOKEN", "apu_nonsense")
    with Client(daemon.settings) as client, pytest.raises(errors.Unauthenticated):
        client.get("/v1/jobs")
