"""The steps after training, over the store: register a run's model, then optimise a version.

Each step reads what the one before it stored (a run's bundle, a version's torch
variant), works in memory, and writes encrypted blobs plus one registry version, so an
interrupted step leaves nothing half-registered. The guard's choice is the fastest
variant measured on this box that keeps the accuracy within the allowed drop.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from appliance import registry
from appliance.core import archive, clock, hardware
from appliance.core.errors import OptimizeError, PlanError, RegistryError
from appliance.data import datasets
from appliance.store import Store, blobs
from appliance.store.db import transaction
from appliance.train import runs

if TYPE_CHECKING:
    import numpy as np

    from appliance.inference import Artifact, Reader, Servable
    from appliance.optimize import Outcome

TORCH = "torch"  # the training bundle: safetensors + config + tokenizer, the source of every other variant
FP32 = "fp32"  # the IR exported from it, or the one an import brought (optimize.FP32)
STUDENT = "student-"
Progress = Callable[[int, int, str], None]  # (done, total, what is happening now)
# A version optimised without a student proposes one when what it serves is less than this many times as fast as fp32
# at batch 16: where INT8 buys little (a CPU without VNNI or AMX), a student of half the layers is the lever (README,
# bench/infer: 3.2x torch eager within a point of the teacher on such a CPU).
PROPOSE_STUDENT_BELOW = 1.5


@dataclass(frozen=True)
class OptimizeOptions:
    """What `appliance optimize` may change; the defaults are what quickstart uses."""

    int8: bool = True
    distill: bool = False  # also distil a student: of the shape below, or where left open, one sized for this CPU
    distill_layers: int | None = None
    distill_width: int | None = None  # the student's feed-forward units a layer (None: the teacher's, or the plan's)
    max_accuracy_drop: float = 1.0  # accuracy points
    # The whole optimisation's time limit, in seconds: a student learns for as long as the rest leaves (the teacher's
    # variants first, then as long again for the student's and the speed measurement), in fewer epochs if need be.
    within_s: float | None = None
    calibration_size: int = 300
    metric: str = "accuracy"
    seed: int = 0

    @property
    def distills(self) -> bool:
        return self.distill or self.distill_layers is not None or self.distill_width is not None


def register_run(store: Store, run_id: str, model: str, actor: str | None = None) -> registry.ModelVersion:
    """A finished run's model as a new version whose only variant is the torch bundle."""
    run = runs.get(store, run_id)
    if run.status != "finished" or run.model_blob is None:
        raise RegistryError(
            f"run {run.id} is {run.status}, so it has no model to register",
            hint=f"finish it first: 'appliance train --resume {run.id}'",
        )
    metrics = {name: value for name, value in (run.metrics or {}).items() if name in ("accuracy", "macro_f1")}
    variant = registry.Variant(TORCH, "torch-bundle", run.model_blob, blobs.size(store, run.model_blob), metrics)
    return registry.register(store, model, run_id=run.id, task=run.task, variants=[variant], chosen=TORCH,
                             reason="fine-tuned, not optimised yet", actor=actor)


GUARD_SAMPLE = 10_000  # validation examples each variant is scored on; a larger split is sampled, stratified


@dataclass(frozen=True)
class HeldOut:
    """What a model is measured on here: the validation split of its dataset (a stratified sample of GUARD_SAMPLE
    where it is larger: each variant's score costs a pass over it, and on that many the standard error of the
    difference between two variants' accuracies is at most a fifth of a point while they disagree on at most 4% of
    the examples), and a sample of the training split for INT8 calibration and the drift reference (never scored
    on, so the guard judges on unseen examples). An example is a text, or an image file's bytes."""

    examples: list[Any]
    labels: list[str]
    calibration: list[Any]
    calibration_labels: list[str]
    validation_size: int  # the whole split's

    @property
    def sampled(self) -> bool:
        return len(self.examples) < self.validation_size

    @property
    def scored(self) -> str:
        """What the scores were taken on, in words."""
        if not self.sampled:
            return f"the {self.validation_size:,} validation examples"
        return f"a stratified sample of {len(self.examples):,} of the {self.validation_size:,} validation examples"


def held_out(data: datasets.LoadedDataset, calibration_size: int = 300, seed: int = 0) -> HeldOut:
    train = list(data.train)
    random.Random(seed).shuffle(train)
    examples, scored = data.examples, data.validation_sample(GUARD_SAMPLE, seed)
    return HeldOut([examples[i] for i in scored], [data.labels[i] for i in scored],
                   [examples[i] for i in train[:calibration_size]], [data.labels[i] for i in train[:calibration_size]],
                   len(data.validation))


PACE_KEY = "optimisation_pace"  # in the store's meta table: the last optimisation's Pace, as JSON


@dataclass(frozen=True)
class Pace:
    """How long optimising a model without a student takes on this box, per GB of its FP32 weights: a fixed part
    (reading the data, the export, packing, the speed measurement), each INT8 quantisation (calibration), and each
    validation example the guard scores, once a variant. A job whose time limit holds an optimisation keeps this
    much of it for that. The last optimisation without a student here measured it; before one, REFERENCE_PACE."""

    fixed_s: float
    quantised_s: float
    scored_s: float
    measured_at: str | None = None  # None: the reference machine's

    def seconds(self, weight_bytes: int, validation_size: int, int8: bool, challenges: bool = False) -> float:
        """An optimisation's longest: FP32, and where INT8 is asked, the gentler INT8 too (tried only when the first
        loses too much, but a limit must hold either way), each scored on GUARD_SAMPLE examples at most; where the
        new version then challenges production (operations.challenge), both scored once more."""
        quantisations = 2 if int8 else 0
        scored = min(validation_size, GUARD_SAMPLE) * (1 + quantisations + 2 * challenges)
        return weight_bytes / 1e9 * (self.fixed_s + self.quantised_s * quantisations + self.scored_s * scored)

    def said(self) -> str:
        return (f"at the pace the last one on this box took on {self.measured_at[:10]}, for this model's size and data"
                if self.measured_at else "at the reference machine's pace: none has run on this box yet")


# MiniLM (91 MB of FP32 weights) on the 60 validation texts of the bundled sample on an AMD EPYC VM (family 25, model
# 17, 2 cores, AVX-512 VNNI): 11.9 s besides quantising (9.2 s) and scoring; ticket-like texts score at 2.3 ms a pass.
REFERENCE_PACE = Pace(fixed_s=131.0, quantised_s=101.0, scored_s=0.026)


def share_before(limit_s: float, optimising_s: float) -> float:
    """The part of a job's time limit that the training (or search) before an optimisation has: what the
    optimisation leaves, and at least half, so that a limit too short for both still trains."""
    return max(limit_s / 2, limit_s - optimising_s)


def pace(store: Store) -> Pace:
    """This box's optimisation pace: the last one measured here, else the reference machine's."""
    row = store.db.execute("SELECT value FROM meta WHERE key = ?", (PACE_KEY,)).fetchone()
    return Pace(**json.loads(row[0])) if row else REFERENCE_PACE


def _record_pace(store: Store, seconds: float, laps: dict[str, float], weight_bytes: int,
                 speeds: dict[str, dict[str, float]]) -> None:
    """Keep what an optimisation without a student took, as a Pace: laps are the quantisations' and scoring passes'
    seconds (optimize.Outcome.seconds); a scored example's cost is taken from the speed measured at batch 16 (the
    mean over the variants), as a pass over a few examples times more compiling than scoring. Without INT8 the last
    quantisation's pace stays."""
    gb = weight_bytes / 1e9
    quantising = [lap for name, lap in laps.items() if name.startswith("quantize_")]
    scoring = sum(lap for name, lap in laps.items() if name.startswith("evaluate_"))
    measured = Pace(fixed_s=(seconds - sum(quantising) - scoring) / gb,
                    quantised_s=sum(quantising) / len(quantising) / gb if quantising else pace(store).quantised_s,
                    scored_s=sum(1 / speed["throughput_b16"] for speed in speeds.values()) / len(speeds) / gb,
                    measured_at=clock.now().isoformat())
    with transaction(store.db):
        store.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                         (PACE_KEY, json.dumps(asdict(measured))))


def weight_bytes(base: Path) -> int:
    """A base model's FP32 weights, as its IR will hold them: a text encoder's parameters, or an image backbone's
    weights file (0 for a folder that holds neither: the training refuses it, saying why)."""
    try:
        return 4 * hardware.model_shape(base).parameters
    except PlanError:  # no encoder's config.json: an image backbone
        return sum(path.stat().st_size for path in base.glob("*") if path.suffix in (".pth", ".pt", ".safetensors"))


@dataclass(frozen=True)
class ServableIr:
    """An IR packed as the server loads it (tokenizer, labels, drift reference), compiled as the server compiles it,
    with its scores (and, once measured beside the others, its speed) on this box, ready to store as a variant."""

    name: str
    packed: bytes
    metrics: dict[str, float]
    servable: Servable

    def stored(self, store: Store, speed: dict[str, float]) -> registry.Variant:
        return registry.Variant(self.name, "openvino-ir", blobs.put(store, self.packed), len(self.packed),
                                self.metrics | speed)


def servable_ir(artifact: Artifact, files: dict[str, bytes], name: str, held: HeldOut, scores: dict[str, float],
                logits: np.ndarray) -> ServableIr:
    """Pack an IR with its drift reference (from held's calibration sample, and its confidence on held's validation
    examples: the logits it was scored by)."""
    from appliance import inference
    from appliance.serve import drift

    servable = inference.load_ir(inference.pack_ir(artifact, files, name), throughput=True)  # timed as served
    reference = drift.reference(servable.reader, held.calibration,
                                [servable.labels.index(label) for label in held.calibration_labels],
                                inference.softmax(logits)).to_json()
    return ServableIr(name, inference.pack_ir(artifact, files, name, reference), scores, servable)


def optimize_version(
    store: Store,
    ref: str,
    options: OptimizeOptions = OptimizeOptions(),
    *,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    actor: str | None = None,
) -> registry.ModelVersion:
    """Quantise and (if asked) distil a version into a new version, starting from its FP32 IR: exported from its
    torch bundle where it has one, else the one it was imported with. The distillation, the long part, reports its
    own steps (done of total) and stops when should_stop says so (JobInterrupted; nothing is kept).

    Calibration uses a sample of the training split and every score the validation split,
    so the guard judges on texts the quantiser never saw.
    """
    from appliance import inference, optimize  # openvino, nncf and torch load only for this step
    from appliance.train import distill

    started = time.monotonic()
    report = progress or (lambda done, total, label: None)
    source = registry.get(store, ref)
    if options.distills and source.task == datasets.IMAGE:
        raise RegistryError(f"{source.ref} is an image model: distillation keeps some layers of a text encoder",
                            hint="optimise it without distilling; INT8 is the lever for an image model")
    if TORCH not in source.variants and FP32 not in source.variants:
        raise RegistryError(f"{source.ref} has neither a torch bundle nor an FP32 IR to optimise",
                            hint="optimise the version that training or an import registered")
    if options.distills and TORCH not in source.variants:
        raise RegistryError(f"{source.ref} was imported without its torch weights, so it cannot be distilled",
                            hint="import the model as a Hugging Face folder (safetensors) to distil it")
    data = datasets.load(store, datasets.get(store, runs.get(store, source.run_id).dataset_id))  # read once
    held = held_out(data, options.calibration_size, options.seed)
    machine = hardware.detect()
    steps = 3 + (2 if options.distills else 0)

    def step(done: int, label: str) -> None:
        report(done, steps, label)

    def optimise(start: Start) -> Outcome:
        return optimize.optimize_ir(start.fp32, start.reader, start.labels, calibration=held.calibration,
                                    examples=held.examples, labels=held.labels, hardware=machine,
                                    max_accuracy_drop=options.max_accuracy_drop, metric=options.metric,
                                    subset_size=options.calibration_size, int8=options.int8)

    step(0, "export to OpenVINO" + (" and quantise to INT8" if options.int8 else ""))
    starts, taught = {"": _starting_point(store, source)}, ""
    planned = (distill.sized_for(json.loads(starts[""].files["config.json"]), machine.cpu, options.distill_layers,
                                 options.distill_width)  # a shape the teacher cannot give is refused before the work
               if options.distills else None)
    outcomes = {"": optimise(starts[""])}
    if planned is not None:
        params, sized = planned
        step(1, f"distil a {params.shape} student")
        teacher = blobs.read(store, source.variants[TORCH].blob_id)
        device, precision = distill.placed(machine)
        student = distill.distill(
            teacher, data, params, device=device, precision=precision, should_stop=should_stop,
            progress=lambda done, total: report(done, total, f"distil a {params.shape} student"),
            within_s=None if options.within_s is None else options.within_s - 2 * (time.monotonic() - started))
        taught = f"{student.describe()}{f' (shape: {sized})' if sized else ''}. "
        starts[STUDENT] = Start.exported(archive.unpack(student.bundle))
        step(2, "export and quantise the student")
        outcomes[STUDENT] = optimise(starts[STUDENT])
    step(steps - 2, "measure speed on this box")
    built = [servable_ir(artifact, starts[prefix].files, prefix + own_name, held, outcome.decision.scores[own_name],
                         outcome.logits[own_name])
             for prefix, outcome in outcomes.items() for own_name, artifact in outcome.artifacts.items()]
    speeds = inference.compare({ir.name: ir.servable for ir in built}, held.examples)
    for speed in speeds.values():
        speed["speedup_b16"] = speed["throughput_b16"] / speeds[FP32]["throughput_b16"]
    variants = [variant for name, variant in source.variants.items() if name == TORCH]
    variants += [ir.stored(store, speeds[ir.name]) for ir in built]
    metrics = {variant.name: variant.metrics for variant in variants if variant.name != TORCH}
    step(steps - 1, "choose and register")
    if not options.distills:
        _record_pace(store, time.monotonic() - started, outcomes[""].seconds, len(starts[""].fp32.weights), speeds)
    chosen, reason = _choose(outcomes, metrics, options, "Images" if source.task == datasets.IMAGE else "Texts")
    if not options.distills and metrics[chosen]["speedup_b16"] < PROPOSE_STUDENT_BELOW:
        reason += _student_proposed(source, starts[""], machine)
    version = registry.register(store, source.model, run_id=source.run_id, task=source.task, variants=variants,
                                chosen=chosen, reason=taught + (f"Scored on {held.scored}. " if held.sampled else "") + reason,
                                actor=actor)
    step(steps, f"registered {version.ref}")
    return version


def _student_proposed(source: registry.ModelVersion, start: Start, machine: hardware.Hardware) -> str:
    """A student proposed, in words for the reason of a version that serves nothing much faster than fp32, where one
    can be distilled from it ('' where none can: an image model, no torch weights, a teacher too shallow)."""
    from appliance.train import distill

    if source.task != datasets.TEXT or TORCH not in source.variants:
        return ""
    try:
        params, _ = distill.sized_for(json.loads(start.files["config.json"]), machine.cpu)
    except OptimizeError:  # a teacher too shallow to halve
        return ""
    return (f" Nothing here serves {PROPOSE_STUDENT_BELOW:g}x as fast as fp32 on this CPU: a {params.shape} student "
            f"would be the lever ('appliance optimize {source.ref} --distill', the Models screen's s; it takes "
            "several times as long as the training did and serves only if it keeps the accuracy).")


@dataclass(frozen=True)
class Start:
    """Where optimising a model starts: its FP32 IR, its tokenizer, its labels in logit order, and the files
    (tokenizer's, appliance.json) its variants are packed with."""

    fp32: Artifact
    reader: Reader
    labels: list[str]
    files: dict[str, bytes]

    @classmethod
    def exported(cls, bundle: dict[str, bytes]) -> Start:
        """From a torch bundle's files: its IR exported here."""
        from appliance import optimize

        fp32, reader, manifest = optimize.export_bundle(bundle)
        return cls(fp32, reader, manifest["labels"], bundle)

    @classmethod
    def packed(cls, files: dict[str, bytes]) -> Start:
        """From a packed IR's files (an imported version's FP32 variant)."""
        from appliance import inference

        manifest = json.loads(files["appliance.json"])
        return cls(inference.Artifact(files["model.xml"], files["model.bin"]), inference.reader_of(files, manifest),
                   manifest["labels"], files)


def _starting_point(store: Store, source: registry.ModelVersion) -> Start:
    """A version's torch bundle, exported, or where it has none (an import), its FP32 IR."""
    if TORCH in source.variants:
        return Start.exported(archive.unpack(blobs.read(store, source.variants[TORCH].blob_id)))
    return Start.packed(archive.unpack(blobs.read(store, source.variants[FP32].blob_id)))


def _choose(outcomes: dict[str, Outcome], metrics: dict[str, dict[str, float]], options: OptimizeOptions,
            examples: str) -> tuple[str, str]:
    """The variant faster than the teacher's FP32 by the most, beyond the spread of the measurements (optimize.faster),
    that loses at most the allowed drop; else FP32. The reason holds every score and speed behind the choice."""
    from appliance import inference, optimize

    fp32 = metrics[FP32]
    faster = sorted((name for name in metrics if name != FP32 and optimize.faster(metrics[name], fp32)),
                    key=lambda name: optimize.speedup(metrics[name], fp32), reverse=True)
    final = optimize.guard(fp32, {name: metrics[name] for name in faster}, options.max_accuracy_drop, options.metric)
    guards = "; ".join(f"{'student ' if prefix else ''}INT8 guard: {outcome.decision.reason}"
                       for prefix, outcome in outcomes.items())
    by_speed = sorted(metrics, key=lambda name: metrics[name]["throughput_b16"], reverse=True)
    throughput = ", ".join(f"{name} {metrics[name]['throughput_b16']:.0f} (±{metrics[name]['throughput_b16_spread']:.0%})"
                           for name in by_speed)
    latency = ", ".join(f"{name} {metrics[name]['latency_ms_p50']:.2f} (±{metrics[name]['latency_ms_p50_spread']:.0%})"
                        for name in by_speed)
    evidence = f"beyond the spread of {inference.COMPARE_ROUNDS} interleaved rounds"
    within = f"within {options.max_accuracy_drop:g} {options.metric} points of fp32"
    if final.variant != FP32:
        why = f"{final.variant} is the fastest {within}, faster at batch 1 or 16 {evidence} and slower at neither"
    elif faster:
        why = f"fp32 serves: {', '.join(faster)} {'is' if len(faster) == 1 else 'are'} faster {evidence}, not {within}"
    else:
        why = f"fp32 serves: no variant is faster {evidence} without being slower at the other batch size"
    return final.variant, f"{guards}. {examples}/s at batch 16: {throughput}; p50 ms at batch 1: {latency}; {why}."
