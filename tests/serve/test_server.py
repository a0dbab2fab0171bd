"""The real server on loopback: answers, refusals, auth, metrics, drift, and swaps under load."""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance import registry
from appliance.access import auth
from appliance.store import alerts, audit, events
from tests.serve.conftest import Server, start_server, stop_server

BILLING = "refund for the invoice charge please"
SHIPPING = "the courier lost my parcel delivery"


def predict(client: httpx.Client, texts: list[str], model: str = "tickets") -> httpx.Response:
    return client.post(f"/v1/models/{model}:predict", json={"instances": texts})


def test_health_needs_no_key_and_says_ready_once_the_model_is_warm(server: Server) -> None:
    with server.client(token=None) as anonymous:
        assert anonymous.get("/v2/health/live").json() == {"live": True}
        assert anonymous.get("/v2/health/ready").json() == {"ready": True}
    with server.client() as client:
        assert client.get("/v2/models/tickets/ready").json() == {"name": "tickets", "ready": True}
        metadata = client.get("/v2/models/tickets").json()
    assert metadata["versions"] == ["2"] and metadata["parameters"]["labels"] == ["billing", "shipping", "technical"]


def test_both_apis_answer_what_the_model_predicts_in_process(server: Server) -> None:
    with server.client() as client:
        plain = predict(client, [BILLING, SHIPPING]).json()
        oip = client.post("/v2/models/tickets/infer", json={
            "id": "r-1", "inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": [BILLING, SHIPPING]}],
        }).json()
    assert [p["label"] for p in plain["predictions"]] == ["billing", "shipping"] and plain["model_version"] == "2"
    assert sum(plain["predictions"][0]["scores"].values()) == pytest.approx(1, abs=1e-4)
    assert oip["id"] == "r-1" and oip["model_name"] == "tickets" and oip["model_version"] == "2"
    outputs = {output["name"]: output for output in oip["outputs"]}
    labels, probabilities = outputs["label"], outputs["probabilities"]
    assert labels["data"] == ["billing", "shipping"] and probabilities["shape"] == [2, 3]
    assert outputs["truncated"]["data"] == [False, False] and plain["predictions"][0]["truncated"] is False
    assert probabilities["data"][:3] == pytest.approx(list(plain["predictions"][0]["scores"].values()), abs=1e-5)
    # The shell's quick check runs the same variant in its own process.
    shell = json.loads(server.state.cli("predict", "tickets", BILLING, SHIPPING, "--json").stdout)
    assert [p["label"] for p in shell["predictions"]] == ["billing", "shipping"]
    # Or from standard input, a text a line: customer texts stay out of the process list and the shell's history.
    piped = subprocess.run([sys.executable, "-m", "appliance", "predict", "tickets", "-", "--json"], check=True,
                           input=f"{BILLING}\n\n{SHIPPING}\n", capture_output=True, text=True, env=server.state.env,
                           timeout=300)
    assert [p["label"] for p in json.loads(piped.stdout)["predictions"]] == ["billing", "shipping"]
    shown = server.state.cli("predict", "tickets", "refund \x1b[2J my invoice").stdout  # a terminal's control
    assert "refund ?[2J my invoice" in shown and "\x1b" not in shown
    for text, problem in (("  ", "text 2 is empty"), ("caf\udcff", "text 2 is not valid UTF-8")):  # b"caf\xff"
        refused = server.state.cli("predict", "tickets", BILLING, text, check=False)
        assert refused.returncode == 2 and problem in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b'{"instances": ["a"', 400, "the request body is not valid JSON"),
        (b'{"texts": ["a"]}', 400, "instances: Field required"),
        (b'{"instances": "a"}', 400, "instances: Input should be a valid list"),
        (b'{"instances": [1, 2]}', 400, "instances.0: Input should be a text (a string) or an image"),
        (b'{"instances": []}', 400, "the request holds no texts"),
        (json.dumps({"instances": ["a"] * 257}).encode(), 400, "257 texts; at most 256"),
        (json.dumps({"instances": ["a" * 2_000_000]}).encode(), 413, "over the limit of 1048576 bytes"),
    ],
)
def test_a_bad_predict_request_gets_a_clear_4xx(server: Server, body: bytes, status: int, message: str) -> None:
    with server.client() as client:
        response = client.post("/v1/models/tickets:predict", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status and message in response.json()["error"], response.text


@pytest.mark.parametrize(
    ("request_input", "message"),
    [
        ({"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a"]}, "has shape [2] but holds 1 texts"),
        ({"name": "text", "shape": [1], "datatype": "FP32", "data": [1.0]}, "input 'text' is FP32, not BYTES"),
        ({"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"], "extra": 1}, "Extra inputs"),
    ],
)
def test_a_bad_infer_request_gets_a_clear_400(server: Server, request_input: dict, message: str) -> None:
    with server.client() as client:
        response = client.post("/v2/models/tickets/infer", json={"inputs": [request_input]})
    assert response.status_code == 400 and message in response.json()["error"], response.text


def test_keys_are_required_scoped_and_revocable(server: Server) -> None:
    with server.client(token=None) as anonymous:
        missing = predict(anonymous, [BILLING])
        assert missing.status_code == 401 and missing.headers["WWW-Authenticate"] == "Bearer"
        garbage = anonymous.post("/v1/models/tickets:predict", json={"instances": ["x"]},
                                 headers={"Authorization": "Bearer apl_nonsense"})
        assert garbage.status_code == 401 and "malformed" in garbage.json()["error"]
        assert anonymous.get("/metrics").status_code == 401
        # The key is checked before the body: a stranger learns nothing about what a valid body is.
        assert anonymous.post("/v1/models/tickets:predict", content=b"{").status_code == 401
    with server.client(server.state.scoped_token) as other_team:
        refused = predict(other_team, [BILLING])
        assert refused.status_code == 403 and "may not call model 'tickets'" in refused.json()["error"]
        assert predict(other_team, [BILLING], model="other").status_code == 404  # allowed, but not served
    with server.state.open() as opened:
        key, token = auth.create(opened, "short-lived")
    with server.client(token) as client:
        server.wait(lambda: predict(client, [BILLING]).status_code == 200)  # picked up at the next poll
        with server.state.open() as opened:
            auth.revoke(opened, key.id)
        server.wait(lambda: predict(client, [BILLING]).status_code == 401)
    with server.state.open() as opened:
        assert auth.get(opened, key.id).last_used_at is not None


def test_an_unknown_model_is_a_404_that_names_what_the_key_may_call(server: Server) -> None:
    with server.client() as client:
        response = predict(client, [BILLING], model="nope")
    assert response.status_code == 404 and response.json()["hint"] == "served models this key may call: tickets"


def test_every_error_body_names_its_class(server: Server) -> None:
    with server.client(token=None) as anonymous, server.client(server.state.scoped_token) as other_team, \
            server.client() as client:
        answers = {
            "Unauthenticated": predict(anonymous, [BILLING]),
            "Forbidden": predict(other_team, [BILLING]),
            "ModelNotFound": predict(client, [BILLING], model="nope"),
            "BadRequest": predict(client, []),
            "PayloadTooLarge": predict(client, ["z" * 20_001]),
            "ValidationError": client.post("/v1/models/tickets:predict", json={"texts": [BILLING]}),
            "PredictionNotFound": client.post("/v1/feedback", json={"feedback": [{"prediction_id": "p_00",
                                                                                  "label": "billing"}]}),
            "RouteNotFound": client.get("/v3/models"),
            "MethodNotAllowed": client.delete("/v2/health/live"),
        }
        # The routes that infer are answered ahead of FastAPI (serve/lean.py): the same refusals there.
        answers["too large a body"] = client.post("/v1/models/tickets:predict", content=b"x" * 2_000_000)
        answers["an infer route asked to GET"] = client.get("/v2/models/tickets/infer")
        answers["a version that is no number"] = client.post("/v2/models/tickets/versions/two/infer", json={})
        answers["a version not served"] = client.post("/v2/models/tickets/versions/-9/infer", json={})
    assert {name: answer.json()["type"] for name, answer in answers.items()} == {
        **{name: name for name in answers}, "too large a body": "PayloadTooLarge",
        "an infer route asked to GET": "MethodNotAllowed", "a version that is no number": "ValidationError",
        "a version not served": "ModelNotFound"}
    assert answers["MethodNotAllowed"].headers["Allow"] == "GET"
    assert answers["an infer route asked to GET"].headers["Allow"] == "POST"
    assert "path.version" in answers["a version that is no number"].json()["error"]


def test_every_request_has_an_access_line_that_holds_none_of_what_was_sent(server: Server) -> None:
    secret = "invoice for Jane Roe account 4711"
    with server.client() as client:
        assert predict(client, [secret]).status_code == 200
        infer = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [secret]}]}
        assert client.post("/v2/models/tickets/infer?trace=4711", json=infer).status_code == 200
    with server.client(token=None) as anonymous:
        assert predict(anonymous, [secret]).status_code == 401
    with server.client() as client:
        assert predict(client, [secret], model="nope").status_code == 404
        client.get("/v2/models/x%0D%0Aforged%1B[2J/ready")  # no line of its own, no terminal escape, in the log
    server.wait(lambda: "/v2/models/x??forged?[2J/ready" in server.logged())
    lines = [line.split("appliance.access: ", 1)[1] for line in server.logged().splitlines() if "appliance.access" in line]
    key = server.state.token.split("_")[1]  # apl_<id>_<secret>: the id, and only it, is logged
    assert any(re.fullmatch(rf"rest POST /v1/models/tickets:predict 200 [\d.]+ms key={key} model=tickets:2", line)
               for line in lines), lines
    assert any(re.fullmatch(rf"rest POST /v2/models/tickets/infer 200 [\d.]+ms key={key} model=tickets:2", line)
               for line in lines), lines
    assert any(re.fullmatch(r"rest POST /v1/models/tickets:predict 401 [\d.]+ms key=- model=-", line) for line in lines)
    assert any(re.fullmatch(rf"rest POST /v1/models/nope:predict 404 [\d.]+ms key={key} model=-", line)
               for line in lines)
    logged = server.logged()
    secret_part = server.state.token.split("_", 2)[2]  # apl_<id>_<secret>, and the secret may hold "_" itself
    assert "Jane" not in logged and "account 4711" not in logged and "trace=" not in logged  # nor the query string
    assert secret_part not in logged


def test_metrics_count_requests_errors_batches_and_queue_per_version(server: Server) -> None:
    with server.client() as client:
        predict(client, [BILLING, SHIPPING])
        predict(client, [])
        text = client.get("/metrics").text
    assert re.search(r'appliance_requests_total\{model="tickets",status="200",version="2"\} [1-9]', text)
    assert re.search(r'appliance_requests_total\{model="tickets",status="400",version=""\} [1-9]', text)
    assert 'appliance_batch_size_bucket{le="2.0",model="tickets",version="2"}' in text
    assert 'appliance_queue_depth{model="tickets",version="2"} 0.0' in text
    assert 'appliance_traffic_share{model="tickets",version="2"} 1.0' in text


def test_answers_carry_prediction_ids_that_take_true_labels(server: Server) -> None:
    with server.state.open() as opened:  # the store is shared with other modules' servers: count from here
        last_seq = opened.db.execute("SELECT MAX(seq) FROM audit").fetchone()[0]
        labels_before = opened.db.execute("SELECT COUNT(*) FROM feedback").fetchone()[0]
    with server.client() as client:
        plain = predict(client, [BILLING, SHIPPING]).json()["predictions"]
        oip = client.post("/v2/models/tickets/infer", json={
            "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [BILLING]}]}).json()
        ids = [p["id"] for p in plain] + next(o["data"] for o in oip["outputs"] if o["name"] == "prediction_id")
        assert len(set(ids)) == 3 and all(i.startswith("p_") for i in ids)
        # At once, before the next poll wrote them: the server writes what waits before it looks.
        stored = client.post("/v1/feedback", json={"feedback": [
            {"prediction_id": ids[0], "label": "billing"}, {"prediction_id": ids[1], "label": "technical"}]})
        assert stored.status_code == 200 and stored.json() == {"accepted": 2, "by_model": {"tickets": 2}}
        refusals = {
            "label": client.post("/v1/feedback", json={"feedback": [{"prediction_id": ids[2], "label": "returns"}]}),
            "id": client.post("/v1/feedback", json={"feedback": [{"prediction_id": "p_00", "label": "billing"}]}),
            "empty": client.post("/v1/feedback", json={"feedback": []}),
        }
        with server.client(server.state.scoped_token) as other_team:
            refusals["scope"] = other_team.post("/v1/feedback", json={
                "feedback": [{"prediction_id": ids[2], "label": "billing"}]})
        with server.client(server.state.unlabelling_token) as shop_front:  # predicts, but was not made to label
            refusals["labelling"] = shop_front.post("/v1/feedback", json={
                "feedback": [{"prediction_id": ids[2], "label": "billing"}]})
        server.wait(lambda: 'appliance_feedback_accuracy{model="tickets",version="2",window="1h"}'
                    in client.get("/metrics").text, 30)
        text = client.get("/metrics").text
    assert {name: answer.status_code for name, answer in refusals.items()} == {
        "label": 400, "id": 404, "empty": 400, "scope": 403, "labelling": 403}
    assert "may not send true labels" in refusals["labelling"].json()["error"]
    assert "tickets" not in refusals["scope"].text  # the model of a prediction out of scope is not named to the key
    assert "--feedback" in refusals["labelling"].json()["hint"]
    assert "'returns' is not a label of tickets:2" in refusals["label"].json()["error"]
    assert 'appliance_feedback_labels{model="tickets",version="2",window="24h"}' in text
    with server.state.open() as opened:
        [record] = [row for row in audit.rows(opened, action="feedback.add") if row["seq"] > last_seq]
        assert record["actor"].startswith("apikey:") and json.loads(record["details"])["labels"] == 2
        assert opened.db.execute("SELECT COUNT(*) FROM feedback").fetchone()[0] == labels_before + 2


def test_traffic_unlike_the_training_data_raises_a_drift_alert(server: Server) -> None:
    strange = [" ".join(["zebra quantum violin"] * 12) + f" {n}" for n in range(45)]  # long, and unseen words
    with server.state.open() as opened:  # the session's store: an earlier module's traffic may have raised one
        for earlier in alerts.listed(opened):
            alerts.acknowledge(opened, earlier.id, "tests")
    with server.client() as client:
        for start in range(0, len(strange), 15):
            assert predict(client, strange[start : start + 15]).status_code == 200
        server.wait(lambda: "appliance_drift_psi{" in client.get("/metrics").text)
        text = client.get("/metrics").text
    psi = float(re.search(r'appliance_drift_psi\{feature="length",model="tickets",version="2"\} (\S+)', text)[1])
    assert psi > 0.2
    with server.state.open() as opened:
        def drift_events() -> list[events.Event]:
            return [event for event in events.after(opened, 0, "tickets") if event.topic == "drift"]

        server.wait(lambda: alerts.listed(opened))  # written off the request path, after the audit record and event
        recorded, shown, (alert,) = audit.rows(opened, action="serve.drift_alert"), drift_events(), alerts.listed(opened)
    assert recorded and recorded[-1]["object"] == "tickets:2" and recorded[-1]["actor"] == "service:serve"
    assert shown and shown[-1].data["version"] == "tickets:2" and shown[-1].data["psi"] > 0.2
    assert (alert.source, alert.subject) == ("drift", "tickets") and "tickets:2: what it is sent has drifted" in alert.message


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["instances", "inputs", "name", "shape", "datatype", "data", "id", "outputs"]) | st.text(max_size=5),
        inner, max_size=4),
    max_leaves=12,
))
def test_no_body_makes_the_server_fail(server: Server, body: object) -> None:
    with server.client() as client:
        for path in ("/v1/models/tickets:predict", "/v2/models/tickets/infer"):
            response = client.post(path, json=body)
            assert response.status_code < 500, (path, body, response.text)
            assert response.status_code == 200 or "error" in response.json()


async def _load(server: Server, done: asyncio.Event, clients: int) -> list[tuple[int, str]]:
    """clients workers sending one text at a time until done; (status, version) of every answer."""
    answers: list[tuple[int, str]] = []
    async with httpx.AsyncClient(base_url=server.url, headers={"X-API-Key": server.state.token}, timeout=30) as client:

        async def worker(n: int) -> None:
            while not done.is_set():
                response = await client.post("/v1/models/tickets:predict", json={"instances": [f"{BILLING} {n}"]})
                answers.append((response.status_code, response.json().get("model_version", "")))

        await asyncio.gather(*(worker(n) for n in range(clients)))
    return answers


def test_deploy_and_rollback_under_load_fail_no_request(server: Server) -> None:
    async def served(version: str) -> None:
        async with httpx.AsyncClient(base_url=server.url, headers={"X-API-Key": server.state.token}) as client:
            while (await client.get("/v2/models/tickets")).json()["versions"] != [version]:
                await asyncio.sleep(0.1)

    async def scenario() -> list[tuple[int, str]]:
        done = asyncio.Event()
        load = asyncio.create_task(_load(server, done, clients=8))
        await asyncio.sleep(1.0)
        await asyncio.to_thread(server.state.cli, "deploy", "tickets:3")
        await asyncio.wait_for(served("3"), 30)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(server.state.cli, "rollback", "tickets")
        await asyncio.wait_for(served("2"), 30)
        await asyncio.sleep(1.0)
        done.set()
        return await load

    answers = asyncio.run(scenario())
    assert {status for status, _ in answers} == {200}, [a for a in answers if a[0] != 200][:5]
    versions = [version for _, version in answers]
    assert versions[0] == "2" and "3" in versions and versions[-1] == "2"
    assert len(answers) > 50


def test_a_canary_takes_its_share_and_rollback_stops_it(server: Server) -> None:
    server.state.cli("deploy", "tickets:3", "--canary", "50")
    with server.client() as client:
        server.wait(lambda: client.get("/v2/models/tickets").json()["versions"] == ["2", "3"])
        versions = [predict(client, [BILLING]).json()["model_version"] for _ in range(120)]
        assert 20 <= versions.count("3") <= 100, versions.count("3")
        assert 'appliance_traffic_share{model="tickets",version="3"} 0.5' in client.get("/metrics").text
        assert "the canary of tickets is stopped" in server.state.cli("rollback", "tickets").stdout
        server.wait(lambda: client.get("/v2/models/tickets").json()["versions"] == ["2"])
        assert {predict(client, [BILLING]).json()["model_version"] for _ in range(20)} == {"2"}


def test_a_version_that_will_not_load_leaves_the_previous_one_serving(server: Server) -> None:
    with server.state.open() as opened:
        good = registry.get(opened, "tickets:2")
        broken = registry.Variant("fp32", "openvino-ir", good.variants["torch"].blob_id, 1, {})  # not an IR
        bad = registry.register(opened, "tickets", run_id=good.run_id, task=good.task, variants=[broken],
                                chosen="fp32", reason="a broken artifact")
    server.state.cli("deploy", bad.ref)
    with server.client() as client:
        with server.state.open() as opened:
            server.wait(lambda: audit.rows(opened, action="serve.load_failed"))
            failure = audit.rows(opened, action="serve.load_failed")[-1]
        assert failure["object"] == bad.ref and "lacks model.bin" in json.loads(failure["details"])["error"]
        assert predict(client, [BILLING]).json()["model_version"] == "2"
        assert client.get("/v2/health/ready").status_code == 200  # the model serves; the operator sees the audit
    server.state.cli("rollback", "tickets")


def test_tls_with_a_self_signed_certificate_and_a_full_queue(state: object) -> None:
    secure = start_server(state, tls="true", max_queue="1")  # type: ignore[arg-type]
    try:
        cert = state.settings.state_dir / "tls-cert.pem"  # type: ignore[attr-defined]
        assert oct(cert.with_name("tls-key.pem").stat().st_mode & 0o777) == "0o600"
        with secure.client(verify=ssl.create_default_context(cafile=cert)) as client:
            assert predict(client, [BILLING]).json()["predictions"][0]["label"] == "billing"
            overloaded = predict(client, [BILLING, SHIPPING])  # two texts never fit a queue of one
            assert overloaded.status_code == 503 and overloaded.headers["Retry-After"] == "1"
            assert "would pass 1" in overloaded.json()["error"]
        with pytest.raises(httpx.TransportError):  # plain HTTP is not answered on a TLS port
            httpx.get(secure.url.replace("https", "http") + "/v2/health/live", timeout=2).raise_for_status()
    finally:
        stop_server(secure)


def test_a_self_signed_key_is_a_new_private_file_never_written_through_a_link(tmp_path: Path) -> None:
    """A link left at the key's name (by whoever could write the folder) was followed: the key went where it led."""
    from appliance.serve import tls

    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("kept")
    folder = tmp_path / "tls"
    folder.mkdir()
    (folder / "tls-key.pem").symlink_to(elsewhere)
    cert, key = tls.self_signed(folder)
    assert elsewhere.read_text() == "kept" and not key.is_symlink()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and b"PRIVATE KEY" in key.read_bytes()
    assert b"CERTIFICATE" in cert.read_bytes()
