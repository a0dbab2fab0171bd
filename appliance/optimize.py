"""Optimisation: a trained model bundle becomes an OpenVINO IR, INT8 variants of it, and a guarded choice.

Everything happens in memory, because no plaintext weight may reach a disk. The bundle is
unpacked from bytes and the model rebuilt from its config and safetensors bytes. The IR is
written into memfd files (anonymous RAM) that OpenVINO reaches through two symlinks in a
private temporary directory: its serialiser wants paths ending in .xml and .bin, and a
symlink holds only the /proc path of its memfd, never a weight. optimum-intel is not used
here: its exporters start from a model directory on disk. ONNX goes through io.BytesIO.

Rebuilding the torch model and converting it to OpenVINO is train/bundle.py's job,
compiling and scoring the inference kernel's (inference.py); this module keeps
serialising, quantisation and the guard.

The accuracy guard is a pure function over scores: INT8 is served when it loses no more
than the allowed accuracy points on the validation split; otherwise a gentler INT8 (the
classifier head left in FP32) is tried; otherwise FP32 stays.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import openvino as ov
import torch

from appliance import inference
from appliance.core import archive, scratch
from appliance.core.errors import OptimizeError
from appliance.core.hardware import Hardware
from appliance.data.datasets import IMAGE
from appliance.inference import Artifact, Reader
from appliance.pixels import Pictures
from appliance.train.bundle import convert_openvino, load_text_classifier, onnx_bytes, traceable
from appliance.words import Words

# node names of the head in the traced graph: BERT, DistilBERT, RoBERTa; EfficientNet-Lite's _fc, the small CNN's head
HEAD_PATTERNS = [r".*(pooler|classifier|_fc|\.head\.).*"]
FP32, INT8, INT8_GENTLE = "fp32", "int8", "int8-gentle"


@dataclass(frozen=True)
class Decision:
    """What the accuracy guard chose, every score it saw, and why, in words an operator can check."""

    variant: str
    scores: dict[str, dict[str, float]]
    reason: str


@dataclass(frozen=True)
class Outcome:
    """Every variant built, its IR, its logits on the examples it was scored on, and the guard's decision; timings in
    seconds for the report."""

    decision: Decision
    artifacts: dict[str, Artifact]
    logits: dict[str, np.ndarray] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


# -- export ------------------------------------------------------------------------------


def export_openvino(model: torch.nn.Module, max_length: int) -> Artifact:
    """Convert to OpenVINO with dynamic batch and sequence dimensions, serialised in memory."""
    return serialize(convert_openvino(model, max_length))


def serialize(model: ov.Model) -> Artifact:
    """An IR as bytes: ov.serialize writes into memfds, reached through symlinks named .xml and .bin."""
    xml_fd, bin_fd = os.memfd_create("ir.xml", os.MFD_CLOEXEC), os.memfd_create("ir.bin", os.MFD_CLOEXEC)
    try:
        with scratch.folder("appliance-ir-") as links:
            xml_path, bin_path = links / "model.xml", links / "model.bin"
            xml_path.symlink_to(f"/proc/self/fd/{xml_fd}")
            bin_path.symlink_to(f"/proc/self/fd/{bin_fd}")
            ov.serialize(model, str(xml_path), str(bin_path))
        return Artifact(_read_fd(xml_fd), _read_fd(bin_fd))
    except (OSError, RuntimeError) as exc:  # no /proc, or a graph OpenVINO cannot write
        raise OptimizeError(f"cannot serialise the OpenVINO model in memory: {exc}") from exc
    finally:
        os.close(xml_fd)
        os.close(bin_fd)


def _read_fd(fd: int) -> bytes:
    with open(os.dup(fd), "rb") as f:
        f.seek(0)
        return f.read()


def export_onnx(model: torch.nn.Module, max_length: int = 128) -> bytes:
    """A text classifier as ONNX: the tokenizer's int64 inputs (any batch and length) to logits."""
    wrapper, example = traceable(model, max_length)
    dynamic = {name: {0: "batch", 1: "sequence"} for name in wrapper.names} | {"logits": {0: "batch"}}
    return onnx_bytes(wrapper, example, wrapper.names, dynamic)


# -- quantisation -------------------------------------------------------------------------


def overflow_fix_for(hardware: Hardware) -> str:
    """Without VNNI, int8 products are summed in saturating int16, so NNCF must keep weights to 7 bits."""
    return "disable" if hardware.cpu.fast_int8 else "enable"


def quantize_int8(
    model: ov.Model,
    calibration: Sequence[Any],
    reader: Reader,
    *,
    overflow_fix: str,
    subset_size: int = 300,
    keep_head_fp32: bool = False,
) -> ov.Model:
    """Post-training INT8 with NNCF, calibrated on examples (texts, or encoded images) as reader feeds them;
    keep_head_fp32 is the gentler retry, leaving the classifier head exact.

    The head is where rounding moves logits directly, it is small (so little speed is
    lost) and skipping it costs one more calibration, not the dozens of evaluations of
    accuracy-controlled quantisation, which would also tune on the guard's own data.
    A text model is quantised as a transformer (NNCF keeps its softmax and norms exact);
    an image model as the CNN it is.
    """
    import logging

    import nncf

    nncf.set_log_level(logging.WARNING)  # its INFO lines list every node it skips
    if not calibration:
        raise OptimizeError("INT8 quantisation needs calibration examples, and none were given")
    names = {port.get_any_name() for port in model.inputs}
    dataset = nncf.Dataset(list(calibration), lambda example: inference.encode(reader, [example], names))
    text = isinstance(reader, Words)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its rich progress bars would garble the caller's own
            return nncf.quantize(
                model.clone(),
                dataset,
                model_type=nncf.ModelType.TRANSFORMER if text else None,
                subset_size=min(subset_size, len(calibration)),
                ignored_scope=nncf.IgnoredScope(patterns=HEAD_PATTERNS, validate=False) if keep_head_fp32 else None,
                advanced_parameters=nncf.AdvancedQuantizationParameters(overflow_fix=nncf.OverflowFix(overflow_fix)),
            )
    except Exception as exc:  # NNCF and OpenVINO raise many types
        raise OptimizeError(f"INT8 quantisation failed: {exc}") from exc


# -- the guard ----------------------------------------------------------------------------


def guard(
    fp32: Mapping[str, float],
    candidates: Mapping[str, Mapping[str, float]],
    max_accuracy_drop: float = 1.0,
    metric: str = "accuracy",
) -> Decision:
    """Choose the first candidate (in order) that loses at most max_accuracy_drop points, else FP32."""
    scores = {FP32: dict(fp32), **{name: dict(score) for name, score in candidates.items()}}
    tried = []
    for name, score in candidates.items():
        drop = round((fp32[metric] - score[metric]) * 100, 6)  # 0.90 - 0.89 is 1.0000000000000009 points
        tried.append(f"{name} {score[metric]:.3f} ({0.0 - drop:+.1f} points)")
        if drop <= max_accuracy_drop:
            reason = f"{name} kept: {metric} {'; '.join(tried)} against fp32 {fp32[metric]:.3f}"
            return Decision(name, scores, f"{reason}, within the allowed {max_accuracy_drop:g} points")
    against = f"against fp32 {fp32[metric]:.3f}: more than the allowed {max_accuracy_drop:g} points"
    reason = f"fp32 kept: {metric} {'; '.join(tried)} {against}" if tried else "fp32 kept: no INT8 variant was scored"
    return Decision(FP32, scores, reason)


def faster(candidate: Mapping[str, float], baseline: Mapping[str, float]) -> bool:
    """Whether a variant is faster than another beyond the noise of both measurements (inference.compare's spreads):
    quicker at batch 1 (p50 latency) or at batch 16 (throughput) by more than the two spreads added, and slower at
    neither by as much. A model serves one client at a time for much of a day and a crowd for the rest, so a variant
    that wins one and loses the other is not faster."""
    verdicts = [_beyond_noise(baseline["latency_ms_p50"] / candidate["latency_ms_p50"] - 1,
                              candidate, baseline, "latency_ms_p50"),
                _beyond_noise(candidate["throughput_b16"] / baseline["throughput_b16"] - 1,
                              candidate, baseline, "throughput_b16")]
    return 1 in verdicts and -1 not in verdicts


def speedup(candidate: Mapping[str, float], baseline: Mapping[str, float]) -> float:
    """How much faster, both ways of serving weighed alike: the geometric mean of the batch-1 and batch-16 gains."""
    return math.sqrt(baseline["latency_ms_p50"] / candidate["latency_ms_p50"]
                     * candidate["throughput_b16"] / baseline["throughput_b16"])


def _beyond_noise(gain: float, candidate: Mapping[str, float], baseline: Mapping[str, float], key: str) -> int:
    noise = candidate.get(f"{key}_spread", 0.0) + baseline.get(f"{key}_spread", 0.0)
    return 1 if gain > noise else -1 if gain < -noise else 0


# -- the whole step ------------------------------------------------------------------------


def export_bundle(files: Mapping[str, bytes]) -> tuple[Artifact, Reader, dict[str, Any]]:
    """A trained bundle's FP32 IR, with its reader (a text model's Words, an image model's Pictures) and its
    manifest (labels in logit order; max_length, or the image size and normalisation)."""
    if json.loads(files.get("appliance.json", b"{}")).get("task") == IMAGE:
        from appliance.train import images

        model, manifest = images.load_image_classifier(files)
        return serialize(images.convert_openvino(model, manifest["image_size"])), Pictures.of(manifest), manifest
    model, reader, manifest = load_text_classifier(files)
    return export_openvino(model, manifest["max_length"]), reader, manifest


def optimize(bundle: bytes, **options: Any) -> Outcome:
    """optimize_ir on the FP32 IR of a trained bundle (the export is timed as `export`)."""
    started = time.monotonic()
    fp32, reader, manifest = export_bundle(archive.unpack(bundle))
    exported = time.monotonic() - started
    outcome = optimize_ir(fp32, reader, manifest["labels"], **options)
    return replace(outcome, seconds={"export": exported, **outcome.seconds})


def optimize_ir(
    fp32: Artifact,
    reader: Reader,
    label_names: Sequence[str],
    *,
    calibration: Sequence[Any],
    examples: Sequence[Any],
    labels: Sequence[str],
    hardware: Hardware,
    max_accuracy_drop: float = 1.0,
    metric: str = "accuracy",
    subset_size: int = 300,
    int8: bool = True,
    config: dict[str, Any] | None = None,
) -> Outcome:
    """Score FP32, then INT8 and (only if needed) the gentler INT8, and let the guard choose.

    Calibrate on training examples (texts, or encoded images) and score on the validation
    split, so the guard judges on data the quantiser never saw. Each variant is scored from its serialised IR, as served.
    An FP32 IR from elsewhere (an imported model) starts here; its logits follow label_names.
    """
    clock, seconds = time.monotonic(), {}

    def lap(name: str) -> None:
        nonlocal clock
        seconds[name], clock = time.monotonic() - clock, time.monotonic()

    index = {name: i for i, name in enumerate(label_names)}
    targets = [index[label] for label in labels]
    artifacts, logits = {FP32: fp32}, {}

    def scored_as_served(name: str) -> dict[str, float]:
        scores, logits[name] = inference.evaluated(inference.compile_openvino(artifacts[name], config=config),
                                                   reader, examples, targets)
        return scores

    fp32_scores = scored_as_served(FP32)
    lap("evaluate_fp32")
    fix, scored = overflow_fix_for(hardware), {}
    decision = guard(fp32_scores, {}, max_accuracy_drop, metric)
    for name, gentle in ((INT8, False), (INT8_GENTLE, True)) if int8 else ():
        quantized = quantize_int8(inference.read_openvino(fp32), calibration, reader,
                                  overflow_fix=fix, subset_size=subset_size, keep_head_fp32=gentle)
        artifacts[name] = serialize(quantized)
        lap(f"quantize_{name}")
        scored[name] = scored_as_served(name)
        lap(f"evaluate_{name}")
        decision = guard(fp32_scores, scored, max_accuracy_drop, metric)
        if decision.variant != FP32:
            break
    return Outcome(decision, artifacts, logits, seconds)
