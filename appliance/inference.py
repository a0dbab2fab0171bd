"""The inference kernel: a packed model compiled from memory, its reader, and examples in, logits out.

What serving, evaluation, the optimiser's guard and distillation share, with numpy,
`tokenizers`, Pillow and OpenVINO (or onnxruntime) only: this module imports neither torch
nor transformers, so the inference server never maps libtorch. A runner is anything that
answers feeds with logits: an OpenVINO CompiledModel, an onnxruntime session, or a torch
classifier wrapped by `train.bundle.TorchRunner`. A reader turns examples into feeds: a
text model's `words.Words`, or an image model's `pixels.Pictures`.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import openvino as ov

from appliance import pixels, words
from appliance.core import archive, hardware, scoring
from appliance.core.errors import ArtifactError, OptimizeError
from appliance.core.text import counted
from appliance.data.datasets import IMAGE

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")  # what words.Words.of reads
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
COMPARE_ROUNDS, COMPARE_SECONDS = 5, 0.1  # interleaved rounds of compare(), and each one's time per batch size
THROUGHPUT = {"PERFORMANCE_HINT": "THROUGHPUT"}  # as many streams as the device runs well at once, each its own threads
BATCHES_PER_STREAM = 2  # kept in flight on a throughput engine: one running, one read and waiting behind it
COMPARE_EXAMPLES = 64  # the examples compare() times on: enough for every length, few enough that a round is short
Runner = Any  # an openvino.CompiledModel, an onnxruntime.InferenceSession or a train.bundle.TorchRunner
Reader = words.Words | pixels.Pictures  # a text model's examples to feeds, or an image model's


@dataclass(frozen=True)
class Artifact:
    """An OpenVINO IR held in memory: the XML graph and its weights."""

    xml: bytes
    weights: bytes


@dataclass(frozen=True)
class Servable:
    """A compiled variant ready to answer: what the inference server holds per model version."""

    compiled: ov.CompiledModel
    reader: Reader
    labels: list[str]
    manifest: dict[str, Any]
    for_throughput: Callable[[], ov.CompiledModel] | None = None  # compiles the same model for throughput

    def compile_batched(self) -> ov.CompiledModel | None:
        """The same model compiled for throughput, as the server runs batches under load (serve.batching), or None:
        loaded without, or the device runs one stream anyway (the same as `compiled`). Compiled anew on each call:
        the server lets it go when quiet and compiles it again when the load comes back."""
        if self.for_throughput is None:
            return None
        try:
            batched = self.for_throughput()
        except RuntimeError as exc:
            raise ArtifactError(f"OpenVINO cannot compile the {self.manifest.get('variant')} artifact for throughput: "
                                f"{exc}") from exc
        return batched if batched.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS") >= 2 else None


# -- a model from bytes -------------------------------------------------------------------


def read_openvino(artifact: Artifact) -> ov.Model:
    """The IR as an ov.Model, read from bytes (weights as a uint8 tensor). Only an IR: given other bytes, OpenVINO
    reads ONNX and other formats from the same call, and an ONNX graph may name any file on this machine for its
    weights (read_onnx())."""
    if not artifact.xml.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"<"):
        raise ArtifactError("the graph is not an OpenVINO IR, which is XML")
    weights = ov.Tensor(np.frombuffer(artifact.weights, dtype=np.uint8))
    return _core().read_model(model=artifact.xml, weights=weights)


def read_onnx(graph: bytes) -> ov.Model:
    """An ONNX graph that holds its weights, as an ov.Model, read from bytes. A graph whose tensors name files for
    their data is refused before OpenVINO sees it: it would read those paths on this machine (the master key, a
    token) into the weights, for the model's answers to give away."""
    if outside := _external_tensors(graph):
        raise ArtifactError(f"the ONNX graph keeps the data of {counted(outside, 'tensor')} in files outside it,"
                            " which are not read")
    return _core().read_model(model=graph)


def _external_tensors(graph: bytes) -> int:
    """How many tensors of an ONNX graph name a file for their data, wherever they are (initializers, sparse ones,
    attributes, subgraphs, functions): every message of the graph is looked at."""
    import onnx
    from google.protobuf.message import DecodeError, Message

    try:
        pending: list[Any] = [onnx.load_model_from_string(graph)]
    except DecodeError as exc:
        raise ArtifactError(f"not a readable ONNX graph ({exc})") from exc
    found = 0
    while pending:
        message = pending.pop()
        if isinstance(message, onnx.TensorProto) and (message.data_location == onnx.TensorProto.EXTERNAL
                                                      or len(message.external_data)):
            found += 1
        for field, value in message.ListFields():
            if field.type == field.TYPE_MESSAGE:
                pending.extend([value] if isinstance(value, Message) else value)
    return found


def compile_openvino(
    model: Artifact | ov.Model, device: str = "CPU", config: dict[str, Any] | None = None
) -> ov.CompiledModel:
    """Compile for a device; the guard must use the config serving will use (CPU defaults to bf16 where fast)."""
    model = read_openvino(model) if isinstance(model, Artifact) else model
    return _core().compile_model(model, device, config or {})


def pack_ir(
    artifact: Artifact, bundle_files: Mapping[str, bytes], variant: str, reference: dict[str, Any] | None = None
) -> bytes:
    """One blob that serving can load without torch: the IR, the tokenizer (a text model's), the label map, the drift
    reference."""
    manifest = json.loads(bundle_files["appliance.json"]) | {"variant": variant, "format": "openvino-ir"}
    if reference is not None:
        manifest["reference"] = reference
    files = {"model.xml": artifact.xml, "model.bin": artifact.weights, "appliance.json": json.dumps(manifest).encode()}
    files |= {name: bundle_files[name] for name in TOKENIZER_FILES if name in bundle_files}
    return archive.pack(sorted(files.items()))


def load_ir(blob: bytes, device: str = "CPU", config: dict[str, Any] | None = None, *,
            throughput: bool = False) -> Servable:
    """Compile a packed IR from decrypted bytes: the weights go from memory to OpenVINO, never to a file.

    `throughput`: keep what compiles it for throughput too (`Servable.compile_batched`), as the server runs batches
    under load. The IR is read once and kept for that, at little cost: the compiled model holds its weights anyway.
    """
    files = archive.unpack(blob)
    manifest = json.loads(files["appliance.json"]) if "appliance.json" in files else {}
    images = manifest.get("task") == IMAGE
    missing = {"model.xml", "model.bin", "appliance.json", *(() if images else ("tokenizer.json",))} - set(files)
    if missing:
        raise ArtifactError(f"the OpenVINO artifact lacks {', '.join(sorted(missing))}")
    try:
        model = read_openvino(Artifact(files["model.xml"], files["model.bin"]))
        compiled = compile_openvino(model, device, config)
    except RuntimeError as exc:
        raise ArtifactError(f"OpenVINO cannot compile the {manifest.get('variant')} artifact: {exc}") from exc
    for_throughput = functools.partial(compile_openvino, model, device, (config or {}) | THROUGHPUT) if throughput else None
    return Servable(compiled, reader_of(files, manifest), manifest["labels"], manifest, for_throughput)


def reader_of(files: Mapping[str, bytes], manifest: Mapping[str, Any]) -> Reader:
    """What reads a packed model's examples: an image model's Pictures, or a text model's Words from files."""
    if manifest.get("task") == IMAGE:
        return pixels.Pictures.of(manifest)
    return words.Words.of(files, manifest)


def onnx_session(onnx: bytes) -> Any:
    """An onnxruntime session on the CPU, loaded from bytes."""
    import onnxruntime

    return onnxruntime.InferenceSession(onnx, providers=["CPUExecutionProvider"])


@functools.cache
def _core() -> ov.Core:
    """One OpenVINO runtime per process: each Core loads its device plugins again.

    The CPU plugin picks bf16 from the CPU's own flags even where hardware.ISA_CAP rules it out, and then cannot
    compile a model: under such a cap the default precision is f32.
    """
    core = ov.Core()
    cpu = hardware.detect_cpu()
    if cpu.isa_cap is not None and not cpu.fast_bf16:
        core.set_property("CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return core


# -- texts in, logits out -------------------------------------------------------------------


def encode(reader: Reader, examples: Sequence[Any], names: set[str] | Sequence[str]) -> dict[str, np.ndarray]:
    """A model's feeds for a batch of examples: texts tokenised, or images read as their pixels."""
    if isinstance(reader, pixels.Pictures):
        return reader.feeds(examples)
    read = reader.see(examples)
    return {name: read.feeds[name] for name in names}


def bind(runner: Runner) -> tuple[list[str], Callable[[dict[str, np.ndarray]], np.ndarray]]:
    """The input names of a runner, and a call from feeds to logits."""
    if hasattr(runner, "get_inputs"):  # an onnxruntime session, or a torch classifier dressed as one
        return [i.name for i in runner.get_inputs()], lambda feeds: runner.run(None, feeds)[0]
    return [port.get_any_name() for port in runner.inputs], lambda feeds: runner(feeds)[0]


def predict(runner: Runner, reader: Reader, examples: Sequence[Any], batch_size: int = 32) -> np.ndarray:
    """Logits for every example (a text, or an encoded image), with numpy only, in batches of similar length so a
    text batch's padding stays small."""
    names, infer = bind(runner)
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]))
    logits = np.empty((0, 0), dtype=np.float32)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        out = infer(encode(reader, [examples[i] for i in chunk], names))
        if not start:
            logits = np.empty((len(examples), out.shape[1]), dtype=np.float32)
        logits[chunk] = out
    return logits


def softmax(logits: np.ndarray) -> np.ndarray:
    """Each row of logits as the probabilities of the labels."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def evaluate(runner: Runner, reader: Reader, examples: Sequence[Any], labels: Sequence[int]) -> dict[str, float]:
    """Accuracy and macro-F1 of a runner, measured as training measures them."""
    return evaluated(runner, reader, examples, labels)[0]


def evaluated(runner: Runner, reader: Reader, examples: Sequence[Any],
              labels: Sequence[int]) -> tuple[dict[str, float], np.ndarray]:
    """evaluate's scores and the logits they came from, for a caller that reads them too (a variant's drift
    reference), so the examples are inferred once."""
    if not examples:
        raise OptimizeError("there are no validation examples to score the model on")
    logits = predict(runner, reader, examples)
    return scoring.metrics(logits.argmax(axis=1).tolist(), list(labels), logits.shape[1]), logits


def speed(
    infer: Callable[[dict[str, np.ndarray]], Any],
    names: Sequence[str],
    reader: Reader,
    examples: Sequence[Any],
    *,
    min_seconds: float = 1.0,
    batched: ov.CompiledModel | None = None,
) -> dict[str, float]:
    """p50 latency of one example, and examples/s at batch 1 and 16, reading included (tokenising, or decoding an
    image), as a client sees it. With `batched` (a Servable's compile_batched()), batches of 16 run as the server
    runs them under load: on that engine, every stream busy (crowd()).

    Examples are taken in the order given, cycling until min_seconds have passed (and each
    was seen once), so every variant is timed on the same inputs.
    """
    result = {}
    for batch_size in (1, 16):
        batches = [list(examples[i : i + batch_size]) for i in range(0, len(examples), batch_size)]
        if batch_size > 1 and batched is not None:
            result[f"throughput_b{batch_size}"] = crowd(batched, names, reader, batches, min_seconds)
            continue
        for batch in batches[:2]:  # warm up: first calls allocate and pick kernels
            infer(encode(reader, batch, names))
        timings, done, started = [], 0, time.perf_counter()
        while done < len(batches) or time.perf_counter() - started < min_seconds:
            batch = batches[done % len(batches)]
            tick = time.perf_counter()
            infer(encode(reader, batch, names))
            timings.append((time.perf_counter() - tick, len(batch)))
            done += 1
        result[f"throughput_b{batch_size}"] = sum(n for _, n in timings) / sum(t for t, _ in timings)
        if batch_size == 1:
            result["latency_ms_p50"] = float(np.median([t for t, _ in timings]) * 1000)
    return result


def crowd(
    batched: ov.CompiledModel, names: Sequence[str], reader: Reader, batches: Sequence[Sequence[Any]], min_seconds: float
) -> float:
    """Examples/s of batches kept in flight on a model compiled for throughput, BATCHES_PER_STREAM for each stream, each read
    while the others run: how the server runs batches under load (serve.batching's throughput engine)."""
    queue = ov.AsyncInferQueue(batched, BATCHES_PER_STREAM * batched.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
    for batch in batches:  # warm up: every stream meets each shape once
        queue.start_async(encode(reader, batch, names))
    queue.wait_all()
    rows, done, started = 0, 0, time.perf_counter()
    while done < len(batches) or time.perf_counter() - started < min_seconds:
        batch = batches[done % len(batches)]
        queue.start_async(encode(reader, batch, names))  # waits while every request is busy
        rows, done = rows + len(batch), done + 1
    queue.wait_all()
    return rows / (time.perf_counter() - started)


def compare(
    servables: Mapping[str, Servable],
    examples: Sequence[Any],
    *,
    rounds: int = COMPARE_ROUNDS,
    seconds: float = COMPARE_SECONDS,
) -> dict[str, dict[str, float]]:
    """speed() of several servables as they serve (batches of 16 on their throughput engine where they have one), in
    interleaved rounds (the order turning each round) on the same examples, so a slow spell of the machine falls on
    every one alike. Per servable, each figure is the median of its rounds, and `<figure>_spread` how far the rounds
    strayed from it: the largest relative distance (0.05: all within 5%). A difference between two smaller than their
    spreads added is noise, not evidence."""
    sample = list(examples[:COMPARE_EXAMPLES])
    bound = {name: bind(servable.compiled) for name, servable in servables.items()}
    batched = {name: servable.compile_batched() for name, servable in servables.items()}
    order = list(servables)
    measured: dict[str, list[dict[str, float]]] = {name: [] for name in order}
    for index in range(rounds):
        turn = index % len(order)
        for name in order[turn:] + order[:turn]:
            names, infer = bound[name]
            measured[name].append(speed(infer, names, servables[name].reader, sample, min_seconds=seconds,
                                        batched=batched[name]))
    return {name: _median_and_spread(rows) for name, rows in measured.items()}


def _median_and_spread(rows: list[dict[str, float]]) -> dict[str, float]:
    summary = {}
    for key in rows[0]:
        values = np.asarray([row[key] for row in rows])
        middle = float(np.median(values))
        summary[key] = middle
        summary[f"{key}_spread"] = float(np.abs(values - middle).max() / middle) if middle else 0.0
    return summary
