"""Triton's own Python client (tritonclient) against the real server, used as its documentation shows: health,
metadata and configuration, inference with binary and JSON tensors, versioned paths, keys, and a canary split."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serve.conftest import Server

TEXTS = ["refund for the invoice charge please", "the courier lost my parcel delivery",
         "mon colis est perdu, où est la livraison ?", "请退还发票费用", "my login crashed 🙁 " * 40]


@pytest.fixture(scope="module")
def triton(server: Server) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(url=urlsplit(server.url).netloc)
    yield client
    client.close()


@pytest.fixture(scope="module")
def key(server: Server) -> Callable[[], dict[str, str]]:
    """The key's headers, new for each call: the client writes its binary header into the dict it is given."""
    return lambda: {"Authorization": f"Bearer {server.state.token}"}


def texts_input(texts: list[str], binary: bool = True) -> httpclient.InferInput:
    tensor = httpclient.InferInput("text", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[text.encode()] for text in texts], dtype=object), binary_data=binary)
    return tensor


def expected(server: Server, texts: list[str]) -> list[dict]:
    with server.client() as client:
        return client.post("/v1/models/tickets:predict", json={"instances": texts}).json()["predictions"]


def test_health_metadata_and_configuration(triton: httpclient.InferenceServerClient, key: Callable[[], dict[str, str]]) -> None:
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready("tickets", headers=key()) and triton.is_model_ready("tickets", "2", headers=key())
    assert not triton.is_model_ready("tickets", "9", headers=key())  # a version that does not serve
    assert triton.get_server_metadata(headers=key())["extensions"] == ["binary_tensor_data", "model_configuration",
                                                                     "parameters"]
    metadata = triton.get_model_metadata("tickets", headers=key())
    assert metadata["versions"] == ["2"] and metadata["inputs"] == [{"name": "text", "datatype": "BYTES",
                                                                     "shape": [-1]}]
    assert [(output["name"], output["datatype"]) for output in metadata["outputs"]] == [
        ("label", "BYTES"), ("probabilities", "FP32"), ("truncated", "BOOL"), ("prediction_id", "BYTES")]
    assert triton.get_model_metadata("tickets", "2", headers=key())["versions"] == ["2"]
    config = triton.get_model_config("tickets", headers=key())
    assert config["max_batch_size"] == 16 and config["input"][0]["data_type"] == "TYPE_STRING"
    assert config["output"][1] == {"name": "probabilities", "data_type": "TYPE_FP32", "dims": [3]}


@pytest.mark.parametrize("binary", [True, False], ids=["binary tensors", "json tensors"])
def test_infer_answers_what_the_plain_endpoint_does(
    server: Server, triton: httpclient.InferenceServerClient, key: Callable[[], dict[str, str]], binary: bool
) -> None:
    outputs = None if binary else [httpclient.InferRequestedOutput(name, binary_data=False)
                                   for name in ("label", "probabilities", "truncated")]
    result = triton.infer("tickets", [texts_input(TEXTS, binary)], outputs=outputs, request_id="r-7", headers=key())
    plain = expected(server, TEXTS)
    response = result.get_response()
    assert response["id"] == "r-7" and response["model_version"] == "2"
    labels = [label.decode() if binary else label for label in result.as_numpy("label")]  # JSON BYTES come as str
    assert labels == [p["label"] for p in plain]
    probabilities = result.as_numpy("probabilities")
    assert probabilities.shape == (len(TEXTS), 3) and probabilities.dtype == np.float32
    np.testing.assert_allclose(probabilities, [list(p["scores"].values()) for p in plain], atol=1e-5)
    assert result.as_numpy("truncated").tolist() == [False, False, False, False, True]
    if binary:  # no outputs named: every output, each as binary tensor data
        assert all(output["parameters"]["binary_data_size"] > 0 for output in response["outputs"])
        assert all(i.decode().startswith("p_") for i in result.as_numpy("prediction_id"))
    else:
        assert [output["name"] for output in response["outputs"]] == ["label", "probabilities", "truncated"]


def test_a_version_is_addressed_by_its_number_and_one_that_does_not_serve_is_a_404(
    triton: httpclient.InferenceServerClient, key: Callable[[], dict[str, str]]
) -> None:
    result = triton.infer("tickets", [texts_input(TEXTS[:1])], model_version="2", headers=key())
    assert result.get_response()["model_version"] == "2"
    with pytest.raises(InferenceServerException) as refused:
        triton.infer("tickets", [texts_input(TEXTS[:1])], model_version="9", headers=key())
    assert refused.value.status() == "404" and "version 9 of 'tickets' is not being served" in refused.value.message()


def test_without_a_key_or_beyond_its_scope_the_client_hears_why(
    server: Server, triton: httpclient.InferenceServerClient
) -> None:
    with pytest.raises(InferenceServerException) as anonymous:
        triton.infer("tickets", [texts_input(TEXTS[:1])])
    assert anonymous.value.status() == "401"
    with pytest.raises(InferenceServerException) as scoped:
        triton.get_model_metadata("tickets", headers={"X-API-Key": server.state.scoped_token})
    assert scoped.value.status() == "403" and "may not call model 'tickets'" in scoped.value.message()


def test_unknown_names_and_bad_shapes_are_400s_naming_them(
    triton: httpclient.InferenceServerClient, key: Callable[[], dict[str, str]]
) -> None:
    wrong_name = httpclient.InferInput("texts", [1], "BYTES")
    wrong_name.set_data_from_numpy(np.array([b"hello"], dtype=object))
    cases = {
        "unknown input 'texts'": ([wrong_name], None),
        "unknown output 'score'": ([texts_input(["hello"])], [httpclient.InferRequestedOutput("score")]),
        "instance 0 is empty or only whitespace": ([texts_input(["   "])], None),
    }
    for message, (inputs, outputs) in cases.items():
        with pytest.raises(InferenceServerException) as refused:
            triton.infer("tickets", inputs, outputs=outputs, headers=key())
        assert refused.value.status() == "400" and message in refused.value.message(), refused.value


def test_a_canary_split_shows_in_the_versions_that_answer(
    server: Server, triton: httpclient.InferenceServerClient, key: Callable[[], dict[str, str]]
) -> None:
    server.state.cli("deploy", "tickets:3", "--canary", "50")
    try:
        server.wait(lambda: triton.get_model_metadata("tickets", headers=key())["versions"] == ["2", "3"])
        versions = [triton.infer("tickets", [texts_input(TEXTS[:1])], headers=key()).get_response()["model_version"]
                    for _ in range(100)]
        assert 15 <= versions.count("3") <= 85, versions.count("3")
        assert triton.infer("tickets", [texts_input(TEXTS[:1])], model_version="3",
                            headers=key()).get_response()["model_version"] == "3"
    finally:
        server.state.cli("rollback", "tickets")
        server.wait(lambda: triton.get_model_metadata("tickets", headers=key())["versions"] == ["2"])


def test_curl_style_bodies_nested_data_and_a_chunked_body_over_the_limit(server: Server) -> None:
    nested = {"inputs": [{"name": "text", "shape": [2, 1], "datatype": "BYTES", "data": [[TEXTS[0]], [TEXTS[1]]]}],
              "outputs": [{"name": "label"}]}
    with server.client() as client:
        for content_type in (None, "application/x-www-form-urlencoded", "application/json; charset=utf-8"):
            answer = client.post("/v2/models/tickets/infer", content=httpx.Request("POST", "/", json=nested).content,
                                 headers={"Content-Type": content_type} if content_type else {})
            assert answer.status_code == 200, answer.text
            assert answer.json()["outputs"] == [{"name": "label", "datatype": "BYTES", "shape": [2],
                                                 "data": ["billing", "shipping"]}]

        def chunks() -> Iterator[bytes]:
            yield b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["'
            for _ in range(40):
                yield b"x" * 65536

        too_large = client.post("/v2/models/tickets/infer", content=chunks())
    assert too_large.status_code == 413 and too_large.json()["type"] == "PayloadTooLarge", too_large.text
