"""The Open Inference Protocol's request parsing on its own: JSON and binary tensor data, what each may claim, and
the 400 that names what does not add up."""

from __future__ import annotations

import base64
import json
import struct

import numpy as np
import pytest

from appliance import pixels
from appliance.core.errors import BadRequest
from appliance.serve import oip
from appliance.serve.runtime import check_images


def binary(texts: list[str], *, size: int | None = None, header: int | None = None,
           outputs: list[dict] | None = None) -> tuple[bytes, str]:
    data = b"".join(struct.pack("<I", len(text.encode())) + text.encode() for text in texts)
    request = {"inputs": [{"name": "text", "shape": [len(texts), 1], "datatype": "BYTES",
                           "parameters": {"binary_data_size": len(data) if size is None else size}}]}
    if outputs is not None:
        request["outputs"] = outputs
    head = json.dumps(request).encode()
    return head + data, str(len(head) if header is None else header)


def test_binary_and_json_tensors_give_the_same_texts_and_outputs() -> None:
    texts = ["où est mon colis", "", "请退还"]
    raw, header = binary(texts, outputs=[{"name": "label", "parameters": {"binary_data": True}}])
    ask = oip.parse_rest(raw, header, True, "tickets", None)
    assert ask.examples == texts and ask.outputs == [("label", True)]
    nested = json.dumps({"id": "r", "inputs": [{"name": "text", "shape": [3, 1], "datatype": "BYTES",
                                                "data": [[t] for t in texts]}], "parameters": {"binary_data_output": True}})
    ask = oip.parse_rest(nested.encode(), None, False, "tickets", None)
    assert ask.examples == texts and ask.id == "r"
    assert ask.outputs == [("label", True), ("probabilities", True), ("truncated", True)]  # no ids kept, none given


@pytest.mark.parametrize(("case", "message"), [
    (lambda: binary(["abc"], size=99), "says binary_data_size 99, but 7 bytes follow"),
    (lambda: binary(["abc"], header=10_000), "not a length within"),
    (lambda: binary(["abc"], header=-1), "not a length within"),
    (lambda: (binary(["abc"])[0], "\u00b2"), "not a length within"),  # a digit to str.isdigit, not to int()
    (lambda: (binary(["abc"])[0][:-2], binary(["abc"])[1]), "says binary_data_size 7, but 5 bytes follow"),
    (lambda: (binary(["abc"])[0], None), "not valid JSON: Extra data"),  # no header: the whole body is JSON
])
def test_sizes_that_do_not_add_up_are_named(case, message: str) -> None:
    raw, header = case()
    with pytest.raises(BadRequest, match=message):
        oip.parse_rest(raw, header, True, "tickets", None)


def test_an_element_that_claims_more_bytes_than_there_are_or_is_not_utf8_is_named() -> None:
    with pytest.raises(BadRequest, match="element 1 of input 'text' says 1000 bytes"):
        read(struct.pack("<I", 1) + b"a" + struct.pack("<I", 1000) + b"b")
    with pytest.raises(BadRequest, match="ends inside the length of element 1"):
        read(struct.pack("<I", 1) + b"a" + b"\x01\x00")
    with pytest.raises(BadRequest, match="instance 1 is not UTF-8 text"):
        read(struct.pack("<I", 1) + b"a" + struct.pack("<I", 1) + b"\xff")


def read(raw: bytes) -> list[str]:
    """A text model's input as binary tensor data of two elements."""
    return oip.examples_of("text", "BYTES", [2], raw, None)


@pytest.mark.parametrize(("request_body", "message"), [
    ({"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a"]}]}, "has shape \\[2\\] but holds 1"),
    ({"inputs": [{"name": "text", "shape": [1, 2], "datatype": "BYTES", "data": [["a", "b"]]}]}, "shape \\[1, 2\\]"),
    ({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [[5]]}]}, "element 0 .* is int"),
    ({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]},
                 {"name": "extra", "shape": [1], "datatype": "BYTES", "data": ["b"]}]}, "unknown input 'extra'"),
    ({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES"}]}, "has no data"),
    ({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
      "outputs": [{"name": "label"}, {"name": "scores"}, {"name": "logits"}]}, "unknown outputs 'scores', 'logits'"),
    ({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
      "outputs": [{"name": "prediction_id"}]}, "unknown output 'prediction_id'"),
    ({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
      "outputs": [{"name": "label", "parameters": {"classification": 2}}]}, "classification"),
])
def test_what_the_model_cannot_take_is_a_400_naming_it(request_body: dict, message: str) -> None:
    with pytest.raises(BadRequest, match=message) as refused:
        oip.parse_rest(json.dumps(request_body).encode(), None, False, "tickets", None)
    if "prediction_id" in message:
        assert "serve.keep_predictions_days" in refused.value.hint


def test_the_body_may_name_the_paths_model_as_the_kserve_sdk_does_but_no_other() -> None:
    body = {"model_name": "tickets", "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}]}
    assert oip.parse_rest(json.dumps(body).encode(), None, False, "tickets", None).examples == ["a"]
    assert oip.parse_rest(json.dumps(body | {"model_version": "2"}).encode(), None, False, "tickets", 2).examples == ["a"]
    for other, version in (({"model_name": "payroll"}, None), ({"model_version": "3"}, 2), ({"model_version": "3"}, None)):
        with pytest.raises(BadRequest, match="the body names"):
            oip.parse_rest(json.dumps(body | other).encode(), None, False, "tickets", version)


PICTURES = pixels.Pictures(4, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))  # an image model taking 4x4 pixels


def test_an_image_models_input_is_read_from_base64_raw_bytes_or_prepared_pixels() -> None:
    photo = pixels.encoded(np.full((6, 8, 3), 200, dtype=np.uint8))
    body = {"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES",
                        "data": [base64.b64encode(photo).decode()]}]}
    assert oip.parse_rest(json.dumps(body).encode(), None, False, "parts", None, PICTURES).examples == [photo]
    assert oip.examples_of("image", "BYTES", [2, 1], [photo, photo], PICTURES) == [photo, photo]  # gRPC contents
    values = np.arange(2 * 3 * 4 * 4, dtype=np.float32)
    from_raw = oip.examples_of("pixel_values", "FP32", [2, 3, 4, 4], values.tobytes(), PICTURES)
    from_json = oip.examples_of("pixel_values", "FP32", [2, 3, 4, 4], values.reshape(2, 3, 4, 4).tolist(), PICTURES)
    for prepared in (from_raw, from_json):
        assert len(prepared) == 2 and all(image.shape == (3, 4, 4) for image in prepared)
        np.testing.assert_array_equal(np.stack(prepared).ravel(), values)


def test_an_image_input_that_does_not_add_up_is_named() -> None:
    with pytest.raises(BadRequest, match="unknown input 'text'") as refused:
        oip.examples_of("text", "BYTES", [1], ["a"], PICTURES)
    assert "'image' (BYTES, [-1]), 'pixel_values' (FP32, [-1, 3, 4, 4])" in refused.value.hint
    with pytest.raises(BadRequest, match="instance 1 is not base64"):
        oip.examples_of("image", "BYTES", [2], ["aGk=", "not base64!"], PICTURES)
    with pytest.raises(BadRequest, match="has shape \\[1, 3, 8, 8\\], not \\[n, 3, 4, 4\\]"):
        oip.examples_of("pixel_values", "FP32", [1, 3, 8, 8], [0.0] * 192, PICTURES)
    with pytest.raises(BadRequest, match="has shape \\[2, 3, 4, 4\\] but holds 48 values"):
        oip.examples_of("pixel_values", "FP32", [2, 3, 4, 4], [0.0] * 48, PICTURES)
    with pytest.raises(BadRequest, match="holds something other than numbers"):
        oip.examples_of("pixel_values", "FP32", [1, 3, 4, 4], ["bright"] * 48, PICTURES)
    with pytest.raises(BadRequest, match="is 7 bytes, not whole FP32 values"):
        oip.examples_of("pixel_values", "FP32", [1, 3, 4, 4], b"\0" * 7, PICTURES)
    with pytest.raises(BadRequest, match="input 'image' is FP32, not BYTES"):
        oip.examples_of("image", "FP32", [1], [0.0], PICTURES)


def test_prepared_pixels_must_be_finite_and_of_the_models_shape() -> None:
    fine = np.zeros((3, 4, 4), dtype=np.float32)
    check_images([fine], PICTURES, 8)
    with pytest.raises(BadRequest, match="instance 1 holds a value that is not a finite number"):
        check_images([fine, np.full((3, 4, 4), np.nan, dtype=np.float32)], PICTURES, 8)
    with pytest.raises(BadRequest, match="instance 0 has shape \\[3, 8, 8\\], not \\[3, 4, 4\\]"):
        check_images([np.zeros((3, 8, 8), dtype=np.float32)], PICTURES, 8)

