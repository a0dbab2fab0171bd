"""The gRPC inference API (serve.grpc_port) driven by Triton's gRPC client, as its documentation shows: health,
metadata, inference, versions, keys, TLS; and the compiled protocol matches its source."""

from __future__ import annotations

import asyncio
import re
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aio_grpcclient
from tritonclient.utils import InferenceServerException

from appliance.serve import grpc_api
from tests.daemon import free_port
from tests.serve.conftest import Server, State, start_server, stop_server

TEXTS = ["refund for the invoice charge please", "the courier lost my parcel delivery", "où est mon colis ?",
         "my login crashed " * 40]


@pytest.fixture(scope="module")
def served(state: State) -> Iterator[tuple[Server, str]]:
    port = free_port()
    running = start_server(state, grpc_port=str(port))
    yield running, f"127.0.0.1:{port}"
    stop_server(running)


@pytest.fixture(scope="module")
def triton(served: tuple[Server, str]) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(url=served[1])
    yield client
    client.close()


def key(state: State) -> dict[str, str]:
    return {"authorization": f"Bearer {state.token}"}


def texts_input(texts: list[str]) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("text", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[text.encode()] for text in texts], dtype=object))
    return tensor


def test_health_and_metadata(triton: grpcclient.InferenceServerClient, state: State) -> None:
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready("tickets", headers=key(state))
    assert triton.is_model_ready("tickets", "2", headers=key(state))
    assert not triton.is_model_ready("tickets", "9", headers=key(state))
    assert triton.get_server_metadata(headers=key(state)).extensions == ["binary_tensor_data", "model_configuration",
                                                                        "parameters"]
    metadata = triton.get_model_metadata("tickets", headers=key(state), as_json=True)
    assert metadata["versions"] == ["2"] and metadata["platform"] == "openvino"
    assert [(output["name"], output["datatype"]) for output in metadata["outputs"]] == [
        ("label", "BYTES"), ("probabilities", "FP32"), ("truncated", "BOOL"), ("prediction_id", "BYTES")]


def test_infer_answers_as_rest_does(served: tuple[Server, str], triton: grpcclient.InferenceServerClient,
                                    state: State) -> None:
    server, _ = served
    with server.client() as client:
        plain = client.post("/v1/models/tickets:predict", json={"instances": TEXTS}).json()["predictions"]
    result = triton.infer("tickets", [texts_input(TEXTS)], request_id="g-1", headers=key(state))
    response = result.get_response(as_json=True)
    assert response["id"] == "g-1" and response["model_version"] == "2"
    assert [label.decode() for label in result.as_numpy("label")] == [p["label"] for p in plain]
    np.testing.assert_allclose(result.as_numpy("probabilities"), [list(p["scores"].values()) for p in plain],
                               atol=1e-5)
    assert result.as_numpy("truncated").tolist() == [False, False, False, True]
    assert all(i.decode().startswith("p_") for i in result.as_numpy("prediction_id"))
    only = triton.infer("tickets", [texts_input(TEXTS[:1])], outputs=[grpcclient.InferRequestedOutput("label")],
                        model_version="2", headers=key(state))
    assert [output.name for output in only.get_response().outputs] == ["label"]


@pytest.mark.parametrize(("headers", "model", "version", "inputs", "status", "message"), [
    (None, "tickets", "", None, "StatusCode.UNAUTHENTICATED", "no API key"),
    ("scoped", "tickets", "", None, "StatusCode.PERMISSION_DENIED", "may not call model 'tickets'"),
    ("key", "nope", "", None, "StatusCode.NOT_FOUND", "no model named 'nope'"),
    ("key", "tickets", "9", None, "StatusCode.NOT_FOUND", "version 9 of 'tickets' is not being served"),
    ("key", "tickets", "\u00b2", None, "StatusCode.INVALID_ARGUMENT", "is not a number"),
    ("key", "tickets", "", ["  "], "StatusCode.INVALID_ARGUMENT", "instance 0 is empty"),
    ("key", "tickets", "", ["x" * 20_001], "StatusCode.RESOURCE_EXHAUSTED", "at most 20000 are allowed"),
])
def test_refusals_carry_the_status_and_words_rest_would(
    triton: grpcclient.InferenceServerClient, state: State, headers: str | None, model: str, version: str,
    inputs: list[str] | None, status: str, message: str
) -> None:
    sent = {"key": key(state), "scoped": {"x-api-key": state.scoped_token}, None: None}[headers]
    with pytest.raises(InferenceServerException) as refused:
        triton.infer(model, [texts_input(inputs or TEXTS[:1])], model_version=version, headers=sent)
    assert refused.value.status() == status and message in refused.value.message(), refused.value


def test_grpc_calls_have_access_lines_too(served: tuple[Server, str], triton: grpcclient.InferenceServerClient,
                                          state: State) -> None:
    server, _ = served
    triton.infer("tickets", [texts_input(["where is parcel 31337"])], headers=key(state))
    with pytest.raises(InferenceServerException):
        triton.infer("tickets", [texts_input(["where is parcel 31337"])])
    server.wait(lambda: "grpc ModelInfer UNAUTHENTICATED" in server.logged())
    logged = server.logged()
    assert re.search(rf"grpc ModelInfer OK [\d.]+ms key={state.token.split('_')[1]} model=tickets:2", logged)
    assert "31337" not in logged


def test_many_calls_at_once_on_one_connection_all_succeed(served: tuple[Server, str], state: State) -> None:
    """A client with as many calls in flight on its channel as the server allows streams (100) is never refused a
    stream: finished calls no longer count against the limit while their memory is being freed."""

    async def calls() -> list[list[str]]:
        client = aio_grpcclient.InferenceServerClient(url=served[1])

        async def caller(text: str) -> list[str]:  # call after call, as a busy client does
            answers = []
            for _ in range(8):
                result = await client.infer("tickets", [texts_input([text])], headers=key(state))
                answers.append(result.as_numpy("label")[0].decode())
            return answers

        try:
            return await asyncio.gather(*(caller(TEXTS[i % 2]) for i in range(100)))
        finally:
            await client.close()

    answers = asyncio.run(calls())
    assert [set(labels) for labels in answers[:2]] == [{"billing"}, {"shipping"}]
    assert sum(map(len, answers)) == 800


def test_an_unknown_input_is_named(triton: grpcclient.InferenceServerClient, state: State) -> None:
    wrong = grpcclient.InferInput("texts", [1], "BYTES")
    wrong.set_data_from_numpy(np.array([b"hello"], dtype=object))
    with pytest.raises(InferenceServerException, match="unknown input 'texts'"):
        triton.infer("tickets", [wrong], headers=key(state))


def test_grpc_over_tls_with_the_serving_certificate(state: State) -> None:
    port = free_port()
    secure = start_server(state, tls="true", grpc_port=str(port))
    try:
        cert = state.settings.state_dir / "tls-cert.pem"
        client = grpcclient.InferenceServerClient(url=f"localhost:{port}", ssl=True, root_certificates=str(cert))
        result = client.infer("tickets", [texts_input(TEXTS[:1])], headers=key(state))
        assert result.as_numpy("label")[0].decode() == "billing"
        client.close()
    finally:
        stop_server(secure)


def test_the_compiled_protocol_is_the_one_its_source_says(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    source = grpc_api.DESCRIPTOR.with_name("inference.proto")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{source.parent}",
                    f"--descriptor_set_out={tmp_path / 'inference.desc'}", source.name], check=True)
    assert (tmp_path / "inference.desc").read_bytes() == grpc_api.DESCRIPTOR.read_bytes()


def test_a_message_over_the_body_limit_is_refused_before_it_is_read(triton: grpcclient.InferenceServerClient,
                                                                    state: State) -> None:
    with pytest.raises(InferenceServerException) as refused:  # 60 texts of 19,000 characters: over 1 MiB
        triton.infer("tickets", [texts_input(["x" * 19_000] * 60)], headers=key(state))
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED", refused.value


def _stalled_call(port: int, method: str = "ModelInfer", token: str | None = None) -> socket.socket:
    """A connection whose one call (with no key unless given one) says a 1,000-byte message and sends 5 bytes of
    it."""
    def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
        return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload

    sent = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", f"/{grpc_api.SERVICE}/{method}".encode()),
            (b":authority", b"x"), (b"content-type", b"application/grpc"), (b"te", b"trailers")]
    sent += [(b"authorization", f"Bearer {token}".encode())] if token else []
    headers = b"".join(b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value
                       for name, value in sent)  # HPACK literals, each shorter than 127 bytes
    connection = socket.create_connection(("127.0.0.1", port))
    connection.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"") + frame(1, 4, 1, headers)
                       + frame(0, 0, 1, b"\x00" + struct.pack(">I", 1000)))
    return connection


def test_a_call_without_a_key_is_refused_before_its_message_is_read(state: State) -> None:
    port = free_port()
    running = start_server(state, grpc_port=str(port), max_connections="2")  # two calls at once, at most
    try:
        stalled = [_stalled_call(port) for _ in range(2)]  # anyone's: no key, and a message that never comes
        client = grpcclient.InferenceServerClient(url=f"127.0.0.1:{port}")
        try:  # the two slots are free again: neither call waited for its message
            assert client.is_server_live(client_timeout=10)
            assert client.get_model_metadata("tickets", headers=key(state), client_timeout=10).name == "tickets"
        finally:
            client.close()
            for connection in stalled:
                connection.close()
    finally:
        stop_server(running)


def test_a_message_that_does_not_arrive_in_time_frees_its_call(state: State) -> None:
    """A key holder's call, or anyone's health call, whose message stalls holds its slot for serve.body_timeout_s
    at most, as a REST body does, and ends DEADLINE_EXCEEDED."""
    port = free_port()
    running = start_server(state, grpc_port=str(port), max_connections="2", body_timeout_s="4")
    try:  # 4 s, so that a loaded machine still sees the slots held before the messages are late
        stalled = [_stalled_call(port, "ModelInfer", state.token), _stalled_call(port, "ServerLive")]
        client = grpcclient.InferenceServerClient(url=f"127.0.0.1:{port}")
        try:
            def answered() -> bool:
                try:
                    return client.get_model_metadata("tickets", headers=key(state), client_timeout=5).name == "tickets"
                except InferenceServerException as refused:  # both slots held: RESOURCE_EXHAUSTED, at once
                    assert refused.status() == "StatusCode.RESOURCE_EXHAUSTED", refused
                    return False

            running.wait(lambda: not answered(), 4)  # the stalled calls hold both slots
            running.wait(answered, 20)  # until their messages are late
        finally:
            client.close()
            for connection in stalled:
                connection.close()
        running.wait(lambda: "grpc ServerLive DEADLINE_EXCEEDED" in running.logged())
        assert "grpc ModelInfer DEADLINE_EXCEEDED" in running.logged()
    finally:
        stop_server(running)
