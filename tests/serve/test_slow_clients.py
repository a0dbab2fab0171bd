"""Slow clients against the real server: a connection that sends half a head, or half a body, is cut off in
time, while everyone else is answered; past serve.max_connections, requests get 503."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from tests.serve.conftest import Server, State, start_server, stop_server

BILLING = "refund for the invoice charge please"


@pytest.fixture(scope="module")
def server(state: State) -> Iterator[Server]:
    running = start_server(state, header_timeout_s="3", body_timeout_s="3", max_connections="60")
    yield running
    assert "Traceback" not in stop_server(running)


def predict(client: httpx.Client, texts: list[str]) -> httpx.Response:
    return client.post("/v1/models/tickets:predict", json={"instances": texts})


HALF_SENT = (b"", b"POST /v1/models/tick", b"POST /v1/models/tickets:predict HTTP/1.1\r\nHost: x\r\nX-API")


def test_half_sent_requests_are_cut_off_while_others_get_answers(server: Server) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    sockets = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
    try:
        for index, sock in enumerate(sockets):
            sock.sendall(HALF_SENT[index % len(HALF_SENT)])  # nothing, half a request line, half the headers
            sock.settimeout(15)
        with server.client() as client:
            assert predict(client, [BILLING]).status_code == 200  # while 50 hang
            sockets += [socket.create_connection(("127.0.0.1", port)) for _ in range(10)]  # 60 hang: full
            with server.client() as late:
                crowded = predict(late, [BILLING])
        assert crowded.status_code == 503
        assert all(sock.recv(100) == b"" for sock in sockets)  # closed by the server, not by the test's timeout
        with server.client() as client:
            assert predict(client, [BILLING]).status_code == 200
    finally:
        for sock in sockets:
            sock.close()


def test_a_body_that_stops_arriving_gets_408(server: Server) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /v1/models/tickets:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"X-API-Key: " + server.state.token.encode() + b"\r\nContent-Length: 100\r\n\r\n{\"instances\"")
        sock.settimeout(15)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and json.loads(body)["error"] == "the request body did not arrive in time"
    assert json.loads(body)["type"] == "RequestTimeout"
