"""The steps after training, over the store: register a run's model, then optimise a version.

Each step reads what the one before it stored (a run's bundle, a version's torch
variant), works in memory, and writes encrypted blobs plus one registry version, so an
interrupted step leaves nothing half-registered. The guard's choice is the fastest
variant measured on this box that keeps the accuracy within the allowed drop.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from appliance import registry
from appliance.core import archive, hardware
from appliance.core.errors import RegistryError
from appliance.data import datasets
from appliance.store import Store, blobs
from appliance.train import runs

if TYPE_CHECKING:
    from appliance.optimize import Outcome

TORCH = "torch"  # the training bundle: safetensors + config + tokenizer, the source of every other variant
STUDENT = "student-"
Progress = Callable[[int, int, str], None]  # (done, total, what is happening now)


@dataclass(frozen=True)
class OptimizeOptions:
    """What `appliance optimize` may change; the defaults are what quickstart uses."""

    int8: bool = True
    distill_layers: int | None = None
    max_accuracy_drop: float = 1.0  # accuracy points
    calibration_size: int = 300
    metric: str = "accuracy"
    seed: int = 0


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


def optimize_version(
    store: Store,
    ref: str,
    options: OptimizeOptions = OptimizeOptions(),
    *,
    progress: Progress | None = None,
    actor: str | None = None,
) -> registry.ModelVersion:
    """Export, quantise and (if asked) distil a version's torch bundle into a new version.

    Calibration uses a sample of the training split and every score the validation split,
    so the guard judges on texts the quantiser never saw.
    """
    from appliance import inference, optimize  # openvino, nncf and torch load only for this step
    from appliance.serve import drift

    report = progress or (lambda done, total, label: None)
    source = registry.get(store, ref)
    if TORCH not in source.variants:
        raise RegistryError(f"{source.ref} has no torch bundle to optimise",
                            hint="optimise the version that training registered")
    if source.task != "text-classification":
        raise RegistryError(f"{source.ref} is an {source.task} model; only text classifiers can be optimised yet")
    data = datasets.load(store, datasets.get(store, runs.get(store, source.run_id).dataset_id))
    texts, labels = [data.texts[i] for i in data.validation], [data.labels[i] for i in data.validation]
    train = list(data.train)
    random.Random(options.seed).shuffle(train)
    calibration = [data.texts[i] for i in train[: options.calibration_size]]
    calibration_labels = [data.label_names.index(data.labels[i]) for i in train[: options.calibration_size]]
    machine = hardware.detect()
    bundle = blobs.read(store, source.variants[TORCH].blob_id)
    steps = 3 + (2 if options.distill_layers else 0)

    def step(done: int, label: str) -> None:
        report(done, steps, label)

    def optimise(model_bundle: bytes) -> Outcome:
        return optimize.optimize(model_bundle, calibration_texts=calibration, texts=texts, labels=labels,
                                 hardware=machine, max_accuracy_drop=options.max_accuracy_drop,
                                 metric=options.metric, subset_size=options.calibration_size, int8=options.int8)

    step(0, "export to OpenVINO" + (" and quantise to INT8" if options.int8 else ""))
    bundles, outcomes = {"": bundle}, {"": optimise(bundle)}
    if options.distill_layers:
        from appliance.train import distill

        step(1, f"distil a {options.distill_layers}-layer student")
        bundles[STUDENT] = distill.distill(bundle, data, distill.DistillParams(layers=options.distill_layers)).bundle
        step(2, "export and quantise the student")
        outcomes[STUDENT] = optimise(bundles[STUDENT])
    step(steps - 2, "measure speed on this box")
    variants, metrics = [source.variants[TORCH]], {}
    for prefix, outcome in outcomes.items():
        files = archive.unpack(bundles[prefix])
        for own_name, artifact in outcome.artifacts.items():
            name = prefix + own_name
            servable = inference.load_ir(inference.pack_ir(artifact, files, name))
            baseline = drift.reference(servable.tokenizer, calibration, calibration_labels,
                                       drift.softmax(inference.predict(servable.compiled, servable.tokenizer, texts)))
            packed = inference.pack_ir(artifact, files, name, baseline.to_json())
            names, infer = inference.bind(servable.compiled)
            speed = inference.speed(infer, names, servable.tokenizer, texts, min_seconds=0.5)
            metrics[name] = outcome.decision.scores[own_name] | speed
            variants.append(registry.Variant(name, "openvino-ir", blobs.put(store, packed), len(packed), metrics[name]))
    for values in metrics.values():
        values["speedup_b16"] = values["throughput_b16"] / metrics["fp32"]["throughput_b16"]
    step(steps - 1, "choose and register")
    chosen, reason = _choose(outcomes, metrics, options)
    version = registry.register(store, source.model, run_id=source.run_id, task=source.task, variants=variants,
                                chosen=chosen, reason=reason, actor=actor)
    step(steps, f"registered {version.ref}")
    return version


def _choose(outcomes: dict[str, Outcome], metrics: dict[str, dict[str, float]], options: OptimizeOptions) -> tuple[str, str]:
    """The fastest variant on this box that loses at most the allowed drop against the teacher's FP32."""
    from appliance import optimize

    by_speed = sorted(metrics, key=lambda name: metrics[name]["throughput_b16"], reverse=True)
    faster = by_speed[: by_speed.index("fp32")]
    final = optimize.guard(metrics["fp32"], {name: metrics[name] for name in faster},
                           options.max_accuracy_drop, options.metric)
    guards = "; ".join(f"{'student ' if prefix else ''}INT8 guard: {outcome.decision.reason}"
                       for prefix, outcome in outcomes.items())
    speed = ", ".join(f"{name} {metrics[name]['throughput_b16']:.0f}" for name in by_speed)
    within = f"within {options.max_accuracy_drop:g} {options.metric} points of fp32"
    if final.variant != "fp32":
        why = f"{final.variant} is the fastest {within}"
    else:
        why = f"fp32 serves: {'no faster variant is ' + within if faster else 'no variant is faster'}"
    return final.variant, f"{guards}. Texts/s at batch 16: {speed}; {why}"
