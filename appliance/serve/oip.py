"""The Open Inference Protocol (KServe v2) as a classifier speaks it, whatever carries it.

A request gives a model one input: a text model's, or one of an image model's two:

    text           BYTES  [n] or [n, 1]  the texts, UTF-8
    image          BYTES  [n] or [n, 1]  image files as saved (JPEG, PNG, WebP, BMP, TIFF); in JSON, base64
    pixel_values   FP32   [n, 3, s, s]   images prepared by the caller: RGB, channels first, s the model's size,
                                         normalised with the mean and std its metadata gives

and gets up to four outputs:

    label          BYTES  [n]            the most likely label of each
    probabilities  FP32   [n, k]         every label's probability, in the order of the model's labels
    truncated      BOOL   [n]            whether the model's window cut the text short (it read the beginning);
                                         never true of an image
    prediction_id  BYTES  [n]            the id true labels are sent back under (only where predictions are kept)

A request names the outputs it wants (all of them when it names none); a name the model does not have, in inputs or
outputs, is a 400 naming it. Tensor data travels as JSON (`data`, flat or nested in the tensor's shape) or as raw
bytes: REST's binary tensor data extension and gRPC's raw contents carry the same encoding (`encode`, `examples_of`),
BYTES elements each after their length as a 4-byte little-endian integer, FP32 little-endian, BOOL one byte each.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, StrictFloat, StrictInt, StrictStr

from appliance import pixels
from appliance.core.errors import BadRequest
from appliance.core.text import whole_number
from appliance.serve.runtime import Answer, Route
from appliance.serve.web import Body, Text, parse_json

INPUT = "text"  # a text model's input
IMAGE_INPUT, PIXELS_INPUT = "image", pixels.INPUT  # an image model's: files, or pixels prepared by the caller
DATATYPES = {"label": "BYTES", "probabilities": "FP32", "truncated": "BOOL", "prediction_id": "BYTES"}
EXTENSIONS = ["binary_tensor_data", "model_configuration", "parameters"]  # the names Triton's clients know them by
BINARY_HEADER = "Inference-Header-Content-Length"  # the JSON's length, when binary tensor data follows it
BINARY_TYPE = "application/octet-stream"  # an answer with binary tensor data after its JSON
_LENGTH = struct.Struct("<I")


# -- the JSON forms (REST) ------------------------------------------------------------------------


class InferInput(Body):
    name: Text
    shape: list[Annotated[int, Field(ge=0)]]
    datatype: Literal["BYTES", "FP32"]
    data: list[StrictStr | StrictFloat | StrictInt | list[Any]] | None = Field(None, description=(
        "the texts (or base64 images, or pixel values), flat or nested in the shape; left out when"
        " parameters.binary_data_size says they follow the JSON as binary tensor data"))
    parameters: dict[str, Any] | None = None


class RequestedOutput(Body):
    name: Text
    parameters: dict[str, Any] | None = Field(None, description="binary_data: true sends this output as raw bytes")


class InferRequest(Body):
    """Open Inference Protocol request: one input, the texts (or the images)."""

    id: Text | None = None
    model_name: Text | None = Field(None, description="the path's model, when given (the KServe SDK sends it)")
    model_version: Text | None = Field(None, description="the path's version, when given")
    inputs: list[InferInput] = Field(min_length=1)
    outputs: list[RequestedOutput] | None = None
    parameters: dict[str, Any] | None = Field(None, description="binary_data_output: true sends every output as raw"
                                                                " bytes")


class OutputTensor(Body):
    name: str
    datatype: Literal["BYTES", "FP32", "BOOL"]
    shape: list[int]
    data: list[str | float | bool] | None = Field(None, description="the values, flat; left out when binary")
    parameters: dict[str, int] | None = Field(None, description="binary_data_size: the output's bytes after the JSON")


class InferResponse(Body):
    """Open Inference Protocol answer (documented; the routes build it as bytes)."""

    model_name: str
    model_version: str
    id: str | None = Field(None, description="the request's id, when it gave one")
    outputs: list[OutputTensor]


# -- what a request asks ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Ask:
    """An inference request, checked: its examples (texts, or images), the outputs wanted in order (name, as raw
    bytes?), its id."""

    examples: list[str] | list[bytes | np.ndarray]
    outputs: list[tuple[str, bool]]
    id: str | None = None


def outputs_of(keeps_ids: bool) -> list[str]:
    """The outputs a model serves: the prediction ids only where the server keeps predictions."""
    return [name for name in DATATYPES if keeps_ids or name != "prediction_id"]


def inputs_of(pictures: pixels.Pictures | None) -> dict[str, tuple[str, list[int]]]:
    """The inputs a model takes (name: datatype, shape): a text model's, or an image model's of `pictures`."""
    if pictures is None:
        return {INPUT: ("BYTES", [-1])}
    return {IMAGE_INPUT: ("BYTES", [-1]), PIXELS_INPUT: ("FP32", [-1, 3, pictures.size, pictures.size])}


def examples_of(name: str, datatype: str, shape: Sequence[int], data: bytes | Sequence[Any],
                pictures: pixels.Pictures | None) -> list[str] | list[bytes | np.ndarray]:
    """The examples an input tensor holds, from its raw bytes (binary tensor data, gRPC raw contents) or its
    elements (JSON data, flat or nested; gRPC contents); a 400 saying what is wrong with it otherwise."""
    inputs = inputs_of(pictures)
    takes = ", ".join(f"{known!r} ({kind}, {list(dims)})" for known, (kind, dims) in inputs.items())
    if name not in inputs:
        raise BadRequest(f"unknown input {name!r}", hint=f"the model takes one input of: {takes}")
    if datatype != inputs[name][0]:
        raise BadRequest(f"input {name!r} is {datatype}, not {inputs[name][0]}", hint=f"the model takes {takes}")
    if name == PIXELS_INPUT:
        return _prepared(name, shape, data, pictures)
    elements = _elements(name, data) if isinstance(data, bytes) else _flat(name, data)
    if list(shape) not in ([len(elements)], [len(elements), 1]):
        held = f"{len(elements)} {'texts' if name == INPUT else 'images'}"
        raise BadRequest(f"input {name!r} has shape {list(shape)} but holds {held}",
                         hint=f"give shape [{len(elements)}] or [{len(elements)}, 1]")
    if name == INPUT:
        return [_utf8(element, index) for index, element in enumerate(elements)]
    return [unbased(element, index) for index, element in enumerate(elements)]


def _prepared(name: str, shape: Sequence[int], values: bytes | Sequence[Any],
              pictures: pixels.Pictures) -> list[np.ndarray]:
    """A batch of prepared images, one float32 array each, from raw little-endian FP32 or JSON numbers."""
    size = pictures.size
    if len(shape) != 4 or list(shape[1:]) != [3, size, size]:
        raise BadRequest(f"input {name!r} has shape {list(shape)}, not [n, 3, {size}, {size}]",
                         hint=f"give each image as its {size}x{size} RGB pixels, channels first")
    if isinstance(values, bytes) and len(values) % 4:
        raise BadRequest(f"the binary data of input {name!r} is {len(values)} bytes, not whole FP32 values",
                         hint="send 4 bytes (little-endian) per value")
    try:
        flat = (np.frombuffer(values, "<f4") if isinstance(values, bytes) else np.asarray(values, dtype=np.float32)
                ).ravel()
    except (TypeError, ValueError):
        raise BadRequest(f"input {name!r} holds something other than numbers, or its rows differ in length",
                         hint="give the pixel values as numbers, flat or nested in the shape") from None
    if flat.size != math.prod(shape):
        raise BadRequest(f"input {name!r} has shape {list(shape)} but holds {flat.size} values",
                         hint=f"give {math.prod(shape)} values, or the shape they fill")
    return list(flat.reshape(shape))


def _utf8(element: str | bytes, index: int) -> str:
    if isinstance(element, str):
        return element
    try:
        return element.decode()
    except UnicodeDecodeError as exc:
        raise BadRequest(f"instance {index} is not UTF-8 text (byte {exc.start})",
                         hint="send the texts encoded as UTF-8") from None


def unbased(element: str | bytes, index: int) -> bytes:
    """An image element: raw bytes as they are, a JSON string from base64."""
    if isinstance(element, bytes):
        return element
    try:
        return base64.b64decode(element, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"instance {index} is not base64", hint="in JSON, give each image file base64-encoded, "
                         "or send it as binary tensor data") from None


def wanted(requested: Sequence[tuple[str, bool]] | None, keeps_ids: bool, binary: bool = False) -> list[tuple[str, bool]]:
    """The outputs a request asked for (name, as raw bytes), or every output the model serves when it named none;
    a 400 naming any the model does not serve."""
    served = outputs_of(keeps_ids)
    if not requested:
        return [(name, binary) for name in served]
    unknown = [name for name, _ in requested if name not in served]
    if unknown:
        absent = "prediction_id" in unknown and not keeps_ids
        raise BadRequest(f"unknown output{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))}",
                         hint=f"the model's outputs: {', '.join(served)}" + (
                             "; prediction ids are given where predictions are kept (serve.keep_predictions_days)"
                             if absent else ""))
    names = [name for name, _ in requested]
    if len(set(names)) < len(names):
        raise BadRequest("an output is asked for twice", hint="name each output once")
    return list(requested)


def parse_rest(raw: bytes, header_length: str | None, keeps_ids: bool, model: str, version: int | None,
               pictures: pixels.Pictures | None = None) -> Ask:
    """A REST request body for the model (and version) of its path, an image model's of `pictures`: JSON, then
    binary tensor data when `header_length` (the header of that name) says where the JSON ends."""
    head, tail = _split(raw, header_length)
    found = parse_json(head)
    body = InferRequest.model_validate(found)  # a ValidationError is the edge's to translate
    if body.model_name not in (None, model) or body.model_version not in (None, "", str(version or "")):
        named = body.model_name if body.model_name not in (None, model) else f"version {body.model_version}"
        raise BadRequest(f"the body names {named!r}, the path {model!r}{f' version {version}' if version else ''}",
                         hint="leave model_name and model_version out of the body, or give the path's")
    names = [tensor.name for tensor in body.inputs]
    if len(names) > 1:
        inputs = inputs_of(pictures)
        extra = [name for name in names if name not in inputs]
        raise BadRequest(f"unknown input{'s' * (len(extra) > 1)} {', '.join(map(repr, extra))}" if extra
                         else f"{len(names)} inputs ({', '.join(map(repr, names))})",
                         hint=f"the model takes one input, of: {', '.join(map(repr, inputs))}")
    tensor = body.inputs[0]
    size = (tensor.parameters or {}).get("binary_data_size")
    if size is None:
        if tensor.data is None:
            raise BadRequest(f"input {tensor.name!r} has no data", hint="give its values in data")
        data: bytes | list[Any] = tensor.data
        if tail:
            raise BadRequest(f"{len(tail)} bytes of binary tensor data follow the JSON, and no input says it is binary",
                             hint="give the input parameters.binary_data_size, or send JSON alone")
    else:
        if tensor.data is not None:
            raise BadRequest(f"input {tensor.name!r} has both data and binary_data_size", hint="send one of them")
        if header_length is None:
            raise BadRequest(f"input {tensor.name!r} is binary but the request has no {BINARY_HEADER} header",
                             hint=f"send {BINARY_HEADER}: the length of the JSON before the binary data")
        if not isinstance(size, int) or isinstance(size, bool) or size != len(tail):
            raise BadRequest(f"input {tensor.name!r} says binary_data_size {size!r}, but {len(tail)} bytes follow"
                             " the JSON", hint="give the exact byte length of the input's binary data")
        data = tail
    examples = examples_of(tensor.name, tensor.datatype, tensor.shape, data, pictures)
    binary = (body.parameters or {}).get("binary_data_output") is True
    requested = [(output.name, (output.parameters or {}).get("binary_data", binary) is True)
                 for output in body.outputs or ()]
    for output in body.outputs or ():
        if "classification" in (output.parameters or {}):
            raise BadRequest(f"output {output.name!r} asks for classification, which this server does not give",
                             hint="read the label and probabilities outputs: they are the classification")
    return Ask(examples, wanted(requested, keeps_ids, binary), body.id)


def _split(raw: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    if header_length is None:
        return raw, b""
    length = whole_number(header_length)
    if length is None or length > len(raw):
        raise BadRequest(f"{BINARY_HEADER} is {header_length[:20]!r}, not a length within the {len(raw)}-byte body",
                         hint="give the byte length of the JSON that begins the body")
    return raw[:length], raw[length:]


def _flat(name: str, data: Sequence[Any]) -> list[str | bytes]:
    """Tensor elements, flat or nested, in row-major order; every element a string (JSON) or bytes (gRPC)."""
    flat: list[str | bytes] = []
    pending = [iter(data)]
    while pending:  # iterative: a deep nesting is refused by json.loads's recursion limit, never here
        item = next(pending[-1], _END)
        if item is _END:
            pending.pop()
        elif isinstance(item, list):
            pending.append(iter(item))
        elif isinstance(item, str | bytes):
            flat.append(item)
        else:
            raise BadRequest(f"element {len(flat)} of input {name!r} is {type(item).__name__}, not a string",
                             hint="give each text (or base64 image) as a JSON string")
    return flat


_END = object()


def _elements(name: str, raw: bytes) -> list[bytes]:
    """BYTES elements in binary tensor data, each after its length (4 bytes, little-endian)."""
    elements, at = [], 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise BadRequest(f"the binary data of input {name!r} ends inside the length of element {len(elements)}",
                             hint="each element is its length (4 bytes, little-endian), then its bytes")
        (length,) = _LENGTH.unpack_from(raw, at)
        if at + 4 + length > len(raw):
            raise BadRequest(f"element {len(elements)} of input {name!r} says {length} bytes, past the end of its"
                             " data", hint="each element is its length (4 bytes, little-endian), then its bytes")
        elements.append(raw[at + 4:at + 4 + length])
        at += 4 + length
    return elements


# -- what the answer holds ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    """One output of an answer."""

    name: str
    datatype: str
    shape: list[int]
    values: np.ndarray | list[str]

    def data(self) -> list[Any]:
        """As JSON data, flat."""
        if isinstance(self.values, list):
            return self.values
        if self.datatype == "FP32":
            return self.values.ravel().round(6).tolist()
        return self.values.ravel().tolist()

    def encode(self) -> bytes:
        """As raw bytes."""
        if isinstance(self.values, list):
            return b"".join(_LENGTH.pack(len(item)) + item for item in (value.encode() for value in self.values))
        return self.values.astype("<f4" if self.datatype == "FP32" else bool).tobytes()


def tensors(answer: Answer, outputs: Sequence[str]) -> list[Tensor]:
    """The outputs asked for, in the order asked."""
    count = len(answer.truncated)
    made = {
        "label": lambda: Tensor("label", "BYTES", [count], answer.labels),
        "probabilities": lambda: Tensor("probabilities", "FP32", list(answer.probabilities.shape),
                                        answer.probabilities),
        "truncated": lambda: Tensor("truncated", "BOOL", [count], np.array(answer.truncated, dtype=bool)),
        "prediction_id": lambda: Tensor("prediction_id", "BYTES", [count], answer.prediction_ids),
    }
    return [made[name]() for name in outputs]


def answer_rest(model: str, answer: Answer, ask: Ask) -> tuple[bytes, int | None]:
    """The REST answer's body, and the length of its JSON when binary tensor data follows (else None)."""
    outputs, tail = [], []
    for tensor, (_, binary) in zip(tensors(answer, [name for name, _ in ask.outputs]), ask.outputs, strict=True):
        shown: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
        if binary:
            tail.append(tensor.encode())
            shown["parameters"] = {"binary_data_size": len(tail[-1])}
        else:
            shown["data"] = tensor.data()
        outputs.append(shown)
    head = json.dumps({"model_name": model, "model_version": str(answer.loaded.version), "outputs": outputs}
                      | ({"id": ask.id} if ask.id is not None else {}), separators=(",", ":")).encode()
    return (head + b"".join(tail), len(head)) if tail else (head, None)


# -- metadata -----------------------------------------------------------------------------------------------


def model_metadata(model: str, route: Route, keeps_ids: bool, version: int | None = None) -> dict[str, Any]:
    """The model's metadata: its versions serving (or the one asked for), its input and outputs, its labels."""
    labels, pictures = route.production.labels, route.production.pictures
    shapes = {"label": [-1], "probabilities": [-1, len(labels)], "truncated": [-1], "prediction_id": [-1]}
    return {
        "name": model,
        "versions": [str(loaded.version) for loaded in route.versions() if version in (None, loaded.version)],
        "platform": "openvino",
        "inputs": [{"name": name, "datatype": datatype, "shape": shape}
                   for name, (datatype, shape) in inputs_of(pictures).items()],
        "outputs": [{"name": name, "datatype": DATATYPES[name], "shape": shapes[name]}
                    for name in outputs_of(keeps_ids)],
        "parameters": {"labels": labels, "canary_percent": route.canary_percent} | _preparing(pictures),
    }


def _preparing(pictures: pixels.Pictures | None) -> dict[str, Any]:
    """What a caller needs to prepare an image model's pixel_values itself."""
    if pictures is None:
        return {}
    return {"image_size": pictures.size, "mean": list(pictures.mean), "std": list(pictures.std)}


def model_config(model: str, route: Route, keeps_ids: bool, max_batch_size: int, max_delay_ms: float
                 ) -> dict[str, Any]:
    """The model as Triton's model configuration describes one (the model_configuration extension): batched on
    the first dimension, each example one element, so `dims` are per example."""
    config_types = {"BYTES": "TYPE_STRING", "FP32": "TYPE_FP32", "BOOL": "TYPE_BOOL"}
    per_text = {"label": [1], "probabilities": [len(route.production.labels)], "truncated": [1],
                "prediction_id": [1]}
    return {
        "name": model,
        "platform": "openvino",
        "backend": "openvino",
        "max_batch_size": max_batch_size,
        "input": [{"name": name, "data_type": config_types[datatype], "dims": shape[1:] or [1]}
                  | ({"reshape": {"shape": []}} if datatype == "BYTES" else {})
                  for name, (datatype, shape) in inputs_of(route.production.pictures).items()],
        "output": [{"name": name, "data_type": config_types[DATATYPES[name]], "dims": per_text[name]}
                   | ({"reshape": {"shape": []}} if per_text[name] == [1] else {})
                   for name in outputs_of(keeps_ids)],
        "dynamic_batching": {"max_queue_delay_microseconds": math.ceil(max_delay_ms * 1000)},
        "version_policy": {"specific": {"versions": [loaded.version for loaded in route.versions()]}},
        "parameters": {"labels": {"string_value": json.dumps(route.production.labels)}},
    }
