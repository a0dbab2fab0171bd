"""The real server against a hostile client holding a valid low-privilege key, or none: what the attacker gets,
and what the owner sees (metrics, audit records, the server's log)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from appliance.access import users
from appliance.core import config
from appliance.core.errors import BadRequest, RateLimited
from appliance.operations import autopilot
from appliance.registry import feedback
from appliance.serve import metrics as serve_metrics
from appliance.serve.metrics import LATENCY_BUCKETS, Counts
from appliance.serve.rates import KeyRates
from appliance.serve.runtime import check_texts
from appliance.store import audit
from tests.serve.conftest import Server, State, start_server, stop_server

BILLING = "refund for the invoice charge please"
MAX_TEXT = 3000
LIMITS = {"max_text_chars": str(MAX_TEXT), "keep_predictions_mb": "1"}


@pytest.fixture(scope="module")
def server(state: State) -> Iterator[Server]:
    running = start_server(state, **LIMITS)
    yield running
    log = stop_server(running)
    assert "Traceback" not in log, log  # whatever the attacker sent, the owner's log holds no crash


def predict(client: httpx.Client, texts: list[str], model: str = "tickets") -> httpx.Response:
    return client.post(f"/v1/models/{model}:predict", json={"instances": texts})


def counts(text: str) -> dict[tuple[str, str], Counts]:
    """The request counts of a /metrics page, as the autopilot and the dashboard read them in process."""
    found: dict[tuple[str, str], Counts] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "appliance_requests_total":
                entry = found.setdefault((labels["model"], labels["version"]), Counts.zero())
                entry.by_status[labels["status"]] = sample.value
            elif sample.name == "appliance_request_seconds_bucket":
                entry = found.setdefault((labels["model"], labels["version"]), Counts.zero())
                bound = float(labels["le"])
                entry.latency[LATENCY_BUCKETS.index(bound) if bound in LATENCY_BUCKETS else -1] = sample.value
    return found


# -- 1. one bad text never fails the others -------------------------------------------------------


def test_a_lone_surrogate_fails_its_own_request_alone_and_is_never_echoed(server: Server) -> None:
    surrogate = b'{"instances": ["my secret 4711", "the courier lost my parcel", "secret 4711 \\ud800"]}'
    infer = (b'{"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES",'
             b' "data": ["my secret 4711", "\\udfff secret 4711"]}]}')

    async def scenario() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, headers={"X-API-Key": server.state.token,
                                                                   "Content-Type": "application/json"}) as client:
            good = [client.post("/v1/models/tickets:predict", json={"instances": [f"{BILLING} {n}"]})
                    for n in range(20)]
            bad = [client.post("/v1/models/tickets:predict", content=surrogate),
                   client.post("/v2/models/tickets/infer", content=infer)]
            return await asyncio.gather(*bad, *good)

    plain, oip, *good = asyncio.run(scenario())
    assert [answer.status_code for answer in good] == [200] * 20
    assert all(answer.json()["predictions"][0]["label"] == "billing" for answer in good)
    assert plain.status_code == 400, plain.text
    assert plain.json()["error"] == "instance 2 is not valid Unicode text (a lone surrogate at character 12)"
    assert oip.status_code == 400 and oip.json()["error"].startswith("instance 1 is not valid Unicode text")
    assert "4711" not in plain.text + oip.text
    with server.client() as client:
        text = client.get("/metrics").text
    assert 'appliance_requests_total{model="tickets",status="400",version=""}' in text
    assert 'status="503"' not in text


def test_a_text_over_the_limit_is_a_413_naming_it_and_the_limit(server: Server) -> None:
    with server.client() as client:
        answer = predict(client, ["short", "x" * (MAX_TEXT + 1)])
        infer = client.post("/v2/models/tickets/infer", json={"inputs": [
            {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["y" * (MAX_TEXT + 1)]}]})
    assert answer.status_code == 413 and infer.status_code == 413
    assert answer.json()["error"] == f"instance 1 holds {MAX_TEXT + 1} characters; at most {MAX_TEXT} are allowed"


def test_the_control_api_path_checks_each_text_as_the_server_does() -> None:
    """The daemon's try-a-prediction calls Runtime.predict, which checks the texts of every path (check_texts)."""
    with pytest.raises(BadRequest, match="instance 1 is not valid Unicode text"):
        check_texts(["fine", "\ud800"], 256, MAX_TEXT)
    with pytest.raises(BadRequest, match="instance 0 is not text, and this model classifies texts"):
        check_texts([b"\xff\xd8 a photo"], 256, MAX_TEXT)


def test_other_strings_of_a_body_with_a_lone_surrogate_are_refused_too(server: Server) -> None:
    json_type = {"Content-Type": "application/json"}
    with server.client() as client:
        request_id = client.post("/v2/models/tickets/infer", headers=json_type, content=b'{"id": "\\ud800", "inputs":'
                                 b' [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["ok"]}]}')
        label = client.post("/v1/feedback", headers=json_type,
                            content=b'{"feedback": [{"prediction_id": "\\ud800", "label": "x"}]}')
        key = client.post("/v1/models/tickets:predict", headers=json_type, content=b'{"instances": ["ok"], "\\ud800": 1}')
    assert [answer.status_code for answer in (request_id, label, key)] == [400] * 3
    assert "id: Value error, not valid Unicode text" in request_id.json()["error"]
    assert "prediction_id: Value error, not valid Unicode text" in label.json()["error"]
    assert key.json()["error"].startswith("the request is not valid")


# -- 2. client errors never count as server errors -------------------------------------------------


def test_bad_requests_against_a_canary_do_not_raise_its_error_rate(server: Server) -> None:
    server.state.cli("deploy", "tickets:3", "--canary", "50")
    try:
        with server.client() as client:
            server.wait(lambda: client.get("/v2/models/tickets").json()["versions"] == ["2", "3"])
            for n in range(150):
                assert predict(client, [f"{BILLING} {n}"]).status_code == 200
                assert predict(client, [] if n % 3 else ["x" * (MAX_TEXT + 1)]).status_code in (400, 413)
                assert client.post("/v1/models/tickets:predict", content=b"{").status_code == 400
            found = counts(client.get("/metrics").text)
    finally:
        server.state.cli("rollback", "tickets")
    candidate = found[("tickets", "3")]
    assert not any(status.startswith("4") for status in candidate.by_status)  # refused before any version
    policy = config.Policy(canary_min_feedback=1)
    verdict = autopilot.judge(feedback.Evidence(0, 0), feedback.Evidence(0, 0), policy,
                              found[("tickets", "2")], candidate)
    assert verdict.decision == "wait" and verdict.evidence["guards"]["error_rate"] == 0.0
    every = sum((value for (model, _), value in found.items() if model == "tickets"), Counts.zero())
    assert every.refused >= 300
    assert serve_metrics._stats(Counts.zero(), every, 1.0)["error_rate"] == 0.0  # the owner's dashboard


# -- 3. a bounded set of metric labels -----------------------------------------------------------


def test_made_up_model_names_add_no_metric_series(server: Server) -> None:
    names = [f"m{uuid.uuid4().hex[:12]}" for _ in range(300)]
    with server.client(token=None) as anonymous, server.client() as client, \
            server.client(server.state.scoped_token) as other_team:
        for index, name in enumerate(names):
            caller = (anonymous, client, other_team)[index % 3]
            assert predict(caller, [BILLING], model=name).status_code in (401, 403, 404)
        text = client.get("/metrics").text
    models = {labels["model"] for family in text_string_to_metric_families(text) for labels in
              (sample.labels for sample in family.samples) if "model" in labels}
    assert models <= {"tickets", serve_metrics.OTHER} and not any(name in text for name in names)
    assert counts(text)[(serve_metrics.OTHER, "")].by_status["404"] >= 100


# -- 5. a rate per key ---------------------------------------------------------------------------


def test_a_key_over_its_rate_gets_429_with_retry_after(state: State) -> None:
    limited = start_server(state, rate_limit_per_s="0.5", rate_limit_burst="3")
    try:
        with limited.client() as client, limited.client(state.scoped_token) as other_team:
            assert predict(client, [BILLING, BILLING]).status_code == 200
            assert predict(client, [BILLING]).status_code == 200
            refused = predict(client, [BILLING])
            body = client.post("/v1/models/tickets:predict", content=b"not even json")  # refused before the body
            assert predict(other_team, [BILLING], model="other").status_code == 404  # a key of its own bucket
            text = client.get("/metrics").text
    finally:
        stop_server(limited)
    key_id = state.token.split("_")[1]
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "2"  # 1 text at 0.5/s, rounded up
    assert refused.json()["error"] == f"API key {key_id} (tests) sent more than its rate of 0.5 texts a second"
    assert refused.json()["type"] == "RateLimited"
    assert body.status_code == 429
    assert 'appliance_requests_total{model="tickets",status="429",version=""} 2.0' in text


def test_a_user_trying_predictions_in_the_console_has_the_rate_of_a_key() -> None:
    rates = KeyRates(per_s=0.5, burst=3, clock=lambda: 0.0)
    alice = users.User("u1", "alice", "viewer", "2026-12-01", None, None)
    rates.admit(alice)
    rates.charge(alice, 3)
    with pytest.raises(RateLimited, match="^user alice sent more than its rate of 0.5 texts a second$") as refused:
        rates.admit(alice)
    assert refused.value.retry_after_s == 2


# -- 7. kept predictions bounded by size -------------------------------------------------------------


def test_kept_predictions_of_a_model_stay_under_their_size_and_the_oldest_go(server: Server) -> None:
    text = ("where is my parcel " * 200)[:MAX_TEXT]
    with server.client() as client:
        first = predict(client, [text]).json()["predictions"][0]["id"]
        labelled = predict(client, [text]).json()["predictions"][0]["id"]
        assert client.post("/v1/feedback", json={"feedback": [{"prediction_id": labelled, "label": "shipping"}]}
                           ).status_code == 200
        ids = [p["id"] for _ in range(16) for p in predict(client, [text] * 25).json()["predictions"]]
    limit = 2**20
    with server.state.open() as opened:
        def settled() -> bool:
            present = opened.db.execute("SELECT COUNT(*) FROM predictions WHERE id = ?", (ids[-1],)).fetchone()[0]
            return present and feedback.waiting_bytes(opened)["tickets"] <= limit

        server.wait(settled)
        present = {row[0] for row in opened.db.execute("SELECT id FROM predictions")}
        records = audit.rows(opened, action="serve.predictions_trimmed")
    assert first not in present and labelled in present and ids[-1] in present  # oldest first; labels stay
    assert records and {(record["object"], record["actor"]) for record in records} == {("tickets", "service:serve")}
    details = [json.loads(record["details"]) for record in records]
    assert all(found["rows"] > 0 and found["bytes"] > 0 and found["limit_bytes"] == limit for found in details)


# -- 8. smaller leaks --------------------------------------------------------------------------------


def test_a_404_names_only_the_models_the_key_may_call(server: Server) -> None:
    with server.client(server.state.scoped_token) as other_team:
        answers = [predict(other_team, [BILLING], model="other"), other_team.get("/v2/models/other"),
                   other_team.get("/v2/models/other/ready")]
    for answer in answers:
        assert answer.status_code == 404 and answer.json()["hint"] == "served models this key may call: none"
        assert "tickets" not in answer.text


def test_metrics_need_a_key_for_every_model(server: Server) -> None:
    with server.client(server.state.scoped_token) as other_team, server.client() as client:
        refused = other_team.get("/metrics")
        assert client.get("/metrics").status_code == 200
    assert refused.status_code == 403 and "may not read the metrics of every model" in refused.json()["error"]
    assert "without --model" in refused.json()["hint"] and "tickets" not in refused.text


def test_only_health_is_open(server: Server) -> None:
    with server.client(token=None) as anonymous:
        assert anonymous.get("/openapi.json").status_code == 401
        assert anonymous.get("/docs").status_code == 404
        assert anonymous.get("/v2/health/live").status_code == 200
    with server.client(server.state.scoped_token) as other_team:
        assert other_team.get("/openapi.json").status_code == 200


# -- 9. the OpenAPI document tells the truth ---------------------------------------------------------


def test_the_openapi_document_says_what_the_server_does(server: Server) -> None:
    with server.client() as client:
        document = client.get("/openapi.json").json()
        empty = predict(client, [])
        too_long = predict(client, ["z" * (MAX_TEXT + 1)])
    schemes = document["components"]["securitySchemes"]
    assert schemes["ApiKey"] == {"type": "apiKey", "in": "header", "name": "X-API-Key",
                                 "description": schemes["ApiKey"]["description"]}
    assert schemes["Bearer"]["scheme"] == "bearer"
    for path, operations in document["paths"].items():
        for operation in operations.values():
            responses = operation["responses"]
            assert "422" not in responses
            if not path.startswith("/v2/health/"):
                assert operation["security"] == [{"ApiKey": []}, {"Bearer": []}] and "401" in responses
            assert "text/plain" in responses["503"]["content"]  # uvicorn's own, past serve.max_connections
            for status, answer in responses.items():
                body = answer.get("content", {}).get("application/json", {}).get("schema")
                if status != "200" and body is not None:
                    shown = [{"$ref": "#/components/schemas/Error"}]
                    if path.endswith("/ready") and status == "400":  # not ready, or (with a path to check) not valid
                        shown = ([{"$ref": "#/components/schemas/Readiness"}] if path == "/v2/health/ready"
                                 else [{"anyOf": [{"$ref": "#/components/schemas/Readiness"}, *shown]}])
                    assert [body] == shown, (path, status)
    assert not {"HTTPValidationError", "ValidationError"} & set(document["components"]["schemas"])
    predict_doc = document["paths"]["/v1/models/{name}:predict"]["post"]
    assert {"400", "401", "403", "404", "408", "413", "429", "503"} <= set(predict_doc["responses"])
    assert predict_doc["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/PredictRequest")
    instances = document["components"]["schemas"]["PredictRequest"]["properties"]["instances"]
    assert instances["maxItems"] == 256 and instances["minItems"] == 1
    assert instances["items"]["anyOf"][0]["maxLength"] == MAX_TEXT  # a text; an image is {"b64": ...}
    data = document["components"]["schemas"]["InferInput"]["properties"]["data"]
    assert data["minItems"] == 1 and "maxItems" not in data  # an image model's pixel values may come flat
    assert document["components"]["schemas"]["Error"]["required"] == ["type", "error"]
    assert empty.status_code == 400 and too_long.status_code == 413  # what the document promises for each
