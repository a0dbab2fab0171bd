"""Inference requests counted per model and API key, without a database write on the request path."""

from __future__ import annotations

import time

from appliance.access import auth
from appliance.registry import usage
from tests.serve.conftest import Server


def test_requests_are_counted_per_model_and_key(server: Server) -> None:
    with server.state.open() as opened:
        _, token = auth.create(opened, "usage-meter")
    with server.client(token) as client:
        server.wait(lambda: client.get("/v2/models/tickets/ready").status_code == 200)  # the key is read at a poll
        answers = [client.post("/v1/models/tickets:predict", json={"instances": ["refund please"]}) for _ in range(3)]
        answers.append(client.post("/v2/models/tickets/infer", json={
            "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["my parcel is late"]}]}))
    assert [answer.status_code for answer in answers] == [200] * 4

    def counted() -> dict | None:
        with server.state.open() as opened:
            rows = [row for row in usage.report(opened) if row["user"] == "key:usage-meter"]
        return rows[0] if rows and rows[0]["requests"] == 4 else None

    deadline = time.monotonic() + 30
    while (row := counted()) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert row is not None, "the server did not flush its counts"
    assert row["model"] == "tickets" and row["inference_hours"] > 0 and row["cpu_hours"] == 0
