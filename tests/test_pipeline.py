"""After training: a run's model is registered, then optimised into a new version over the real store."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from appliance import inference, operations, optimize, registry
from appliance.core import archive
from appliance.core.errors import OptimizeError, RegistryError
from appliance.data import datasets
from appliance.operations import pipeline
from appliance.operations.jobspec import OptimizeJob
from appliance.store import Store, audit, blobs
from appliance.train import engine, runs
from appliance.train.params import TrainParams
from tests.conftest import run_cli, write_tickets

FAST = TrainParams(epochs=8, learning_rate=3e-3, batch_size=16, max_length=32, seed=3)
SPEED = ("latency_ms_p50", "throughput_b1", "throughput_b16", "speedup_b16", "latency_ms_p50_spread",
         "throughput_b1_spread", "throughput_b16_spread")


def fastest_within_a_point_of_fp32(version: registry.ModelVersion) -> str:
    """What should serve: of the variants within a point of FP32's accuracy and faster than it beyond the spread of
    the measurements, the one faster by most; FP32 when there is none."""
    fp32 = version.variants["fp32"].metrics
    faster = [v for name, v in version.variants.items() if name not in ("torch", "fp32")
              and fp32["accuracy"] - v.metrics["accuracy"] <= 0.01 and optimize.faster(v.metrics, fp32)]
    return max(faster, key=lambda v: optimize.speedup(v.metrics, fp32)).name if faster else "fp32"


@pytest.fixture
def registered(opened: Store, tickets: str, tiny_base: Path) -> registry.ModelVersion:
    result = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=FAST)
    return pipeline.register_run(opened, result.run_id, "tickets")


def test_a_finished_run_is_registered_with_its_bundle_and_scores(
    opened: Store, registered: registry.ModelVersion
) -> None:
    run = runs.get(opened, registered.run_id)
    assert registered.ref == "tickets:1" and registered.aliases == ()  # it serves nothing until deployed
    assert registered.chosen == "torch" and list(registered.variants) == ["torch"]
    torch_variant = registered.variants["torch"]
    assert torch_variant.blob_id == run.model_blob and torch_variant.bytes == len(blobs.read(opened, run.model_blob))
    assert torch_variant.metrics == {"accuracy": run.metrics["accuracy"], "macro_f1": run.metrics["macro_f1"]}


def test_a_run_that_has_not_finished_cannot_be_registered(opened: Store, tickets: str) -> None:
    version = datasets.get(opened, tickets)
    run_id = runs.create(opened, dataset_id=version.id, base_model="tiny", task=version.task, params={}, plan={})
    with pytest.raises(RegistryError, match="is running, so it has no model") as raised:
        pipeline.register_run(opened, run_id, "tickets")
    assert f"--resume {run_id}" in raised.value.hint
    assert registry.list_versions(opened) == []


def test_optimising_registers_measured_variants_and_serves_the_fastest_within_the_guard(
    opened: Store, registered: registry.ModelVersion
) -> None:
    steps = []
    assert pipeline.pace(opened) == pipeline.REFERENCE_PACE  # no optimisation has run on this box yet
    version = pipeline.optimize_version(opened, "tickets", progress=lambda done, total, label: steps.append(label))

    assert version.ref == "tickets:2" and version.run_id == registered.run_id
    assert version.aliases == ()
    assert version.variants["torch"] == registered.variants["torch"]  # the source travels along, not copied
    assert {"fp32", "int8"} <= set(version.variants) <= {"torch", "fp32", "int8", "int8-gentle"}
    built = {name: v for name, v in version.variants.items() if name != "torch"}
    for variant in built.values():
        assert variant.format == "openvino-ir" and set(variant.metrics) == {"accuracy", "macro_f1", *SPEED}
    assert built["fp32"].metrics["accuracy"] > 0.9
    assert built["int8"].bytes < built["fp32"].bytes / 2
    assert version.chosen == fastest_within_a_point_of_fp32(version)
    assert "Texts/s at batch 16: " in version.reason and steps[-1] == "registered tickets:2"
    assert [r["action"] for r in audit.rows(opened)].count("model.register") == 2
    measured = pipeline.pace(opened)  # what the next job with a time limit keeps for its optimisation
    assert measured.measured_at and min(measured.fixed_s, measured.quantised_s, measured.scored_s) > 0
    weights = 90_000_000  # MiniLM's FP32 weights
    assert 0 < measured.seconds(weights, 60, int8=True) < measured.seconds(weights, 6_000, int8=True)
    assert measured.seconds(weights, 6_000, int8=False) < measured.seconds(weights, 6_000, int8=True)
    assert measured.seconds(weights, 6_000, True) < measured.seconds(weights, 6_000, True, challenges=True)
    assert measured.seconds(weights, 60_000, int8=True) == measured.seconds(weights, pipeline.GUARD_SAMPLE, int8=True)


def test_a_stored_variant_serves_from_memory_with_its_tokenizer_and_labels(
    opened: Store, registered: registry.ModelVersion
) -> None:
    version = pipeline.optimize_version(opened, "tickets:1", pipeline.OptimizeOptions(int8=False))
    assert set(version.variants) == {"torch", "fp32"} and version.chosen == "fp32"
    assert "no INT8 variant was scored" in version.reason and "fp32 serves: no variant is faster" in version.reason
    # Nothing faster than fp32: a student is proposed, of the shape the optimiser would size it.
    assert version.reason.endswith("on this CPU: a 1-layer student would be the lever ('appliance optimize tickets:1 "
                                   "--distill', the Models screen's s; it takes several times as long as the training "
                                   "did and serves only if it keeps the accuracy).")

    packed = blobs.read(opened, version.variants["fp32"].blob_id)
    files = archive.unpack(packed)
    assert {"model.xml", "model.bin", "tokenizer.json", "appliance.json"} <= set(files)
    assert "model.safetensors" not in files  # serving needs no torch
    servable = inference.load_ir(packed)
    assert servable.labels == ["billing", "shipping", "technical"] == json.loads(files["appliance.json"])["labels"]
    logits = inference.predict(servable.compiled, servable.reader, ["refund for my invoice", "courier lost parcel"])
    assert [servable.labels[i] for i in np.argmax(logits, axis=1)] == ["billing", "shipping"]


def test_when_every_int8_loses_too_much_fp32_serves_and_the_reason_says_why(
    opened: Store, registered: registry.ModelVersion
) -> None:
    version = pipeline.optimize_version(opened, "tickets:1", pipeline.OptimizeOptions(max_accuracy_drop=-1.0))
    assert version.chosen == "fp32"
    assert set(version.variants) == {"torch", "fp32", "int8", "int8-gentle"}  # the gentler one was tried
    assert "INT8 guard: fp32 kept" in version.reason and "fp32 serves" in version.reason


def test_a_distilled_student_is_optimised_too_and_competes_on_speed(
    opened: Store, registered: registry.ModelVersion
) -> None:
    options = pipeline.OptimizeOptions(distill_width=32, calibration_size=64)  # of 64 units; the depth left open
    version = pipeline.optimize_version(opened, "tickets:1", options)
    assert {"torch", "fp32", "int8", "student-fp32", "student-int8"} <= set(version.variants)
    student, teacher = version.variants["student-int8"], version.variants["int8"]
    assert student.bytes < teacher.bytes and set(student.metrics) == {"accuracy", "macro_f1", *SPEED}
    assert student.metrics["accuracy"] > 0.6  # three classes: chance is a third
    assert "student INT8 guard" in version.reason and "student-int8" in version.reason.split("Texts/s")[1]
    assert version.reason.startswith("1-layer, 32-wide student, ") and "the best by validation macro-F1 after the first epoch (0.0003 " in version.reason
    assert " (shape: half the teacher's 2 layers). " in version.reason and "would be the lever" not in version.reason
    assert version.chosen == fastest_within_a_point_of_fp32(version)


def test_a_time_limit_leaves_the_student_what_the_teachers_variants_leave_and_the_reason_says_so(
    opened: Store, registered: registry.ModelVersion
) -> None:
    """A limit the teacher's export and quantisation already spent: the student learns one epoch of its planned
    ones, and is optimised, measured and guarded like any other."""
    options = pipeline.OptimizeOptions(distill_width=32, calibration_size=64, within_s=1.0)
    version = pipeline.optimize_version(opened, "tickets:1", options)
    assert {"student-fp32", "student-int8"} <= set(version.variants)
    assert version.reason.startswith("1-layer, 32-wide student, 1 epoch (of ")
    assert ": as many as its time limit held)" in version.reason and "student INT8 guard" in version.reason


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_box_with_a_gpu_the_student_is_distilled_there(opened: Store, registered: registry.ModelVersion) -> None:
    version = pipeline.optimize_version(opened, "tickets:1", pipeline.OptimizeOptions(distill=True, calibration_size=64))
    assert "student-fp32" in version.variants and " on cuda:0 at lr " in version.reason


@pytest.mark.parametrize(("options", "says"), [
    (pipeline.OptimizeOptions(distill_width=64), "can keep from 1 to 63 of the teacher's 64 units, not 64"),
    (pipeline.OptimizeOptions(distill_layers=2), "keep from 1 to 1 of the teacher's 2 encoder layers, not 2"),
])
def test_a_student_shape_the_teacher_cannot_give_is_refused_before_the_teacher_is_quantised(
    opened: Store, registered: registry.ModelVersion, options: pipeline.OptimizeOptions, says: str,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    def quantised(*args: object, **kwargs: object) -> None:
        raise AssertionError("the teacher was quantised before the student's shape was checked")

    monkeypatch.setattr(optimize, "optimize_ir", quantised)
    with pytest.raises(OptimizeError, match=says):
        pipeline.optimize_version(opened, "tickets:1", options)
    assert [version.ref for version in registry.list_versions(opened)] == ["tickets:1"]


class StoppingJob:
    """An operations.Context whose stop is asked for after a few progress reports, as a preempted job's is."""

    id, actor, max_threads, confined = "job-1", None, None, True

    def __init__(self, store: Store, reports_before_stop: int) -> None:
        self.store, self.state, self.reports, self.left = store, {}, [], reports_before_stop

    def stage(self, name: str) -> None: ...
    def save(self, **made: object) -> None: self.state.update(made)
    def log(self, line: str) -> None: ...
    def cancelled(self) -> bool: return False

    def report(self, data: dict[str, object], force: bool = False) -> None:
        self.reports.append(data)
        self.left -= 1

    def should_stop(self) -> bool:
        return self.left <= 0


def test_a_student_learning_reports_its_steps_and_a_stop_ends_the_job_stage_with_nothing_registered(
    opened: Store, registered: registry.ModelVersion
) -> None:
    job = StoppingJob(opened, reports_before_stop=5)
    with pytest.raises(operations.Stopped):
        operations.optimise(job, OptimizeJob.parse({"version": "tickets:1", "distill_layers": 1}), "tickets:1")
    learning = [(report["step"], report["total_steps"]) for report in job.reports
                if report["what"] == "distil a 1-layer student"]
    steps = learning[-1][1]  # the pipeline's step 1 of 5, then the student's own steps: its heartbeat
    assert learning == [(1, 5), (1, steps), (2, steps), (3, steps)] and steps > 5, job.reports
    assert [version.ref for version in registry.list_versions(opened)] == ["tickets:1"]
    assert "optimized" not in job.state  # a resume starts the stage again


def test_an_optimisation_stopped_part_way_resumes_with_what_was_left_of_its_time_limit(
    opened: Store, registered: registry.ModelVersion, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A preempted optimize job that resumes does not give its student the whole limit again."""
    job, spec = StoppingJob(opened, reports_before_stop=5), OptimizeJob.parse(
        {"version": "tickets:1", "distill_layers": 1, "max_minutes": 10})
    with pytest.raises(operations.Stopped):
        operations.optimise(job, spec, "tickets:1")
    spent_s = job.state["optimize_spent_s"]
    assert spent_s > 0

    resumed: list[pipeline.OptimizeOptions] = []

    def optimize_version(store: Store, ref: str, options: pipeline.OptimizeOptions, **kwargs: object):
        resumed.append(options)
        return registered

    monkeypatch.setattr(pipeline, "optimize_version", optimize_version)
    job.left = 1_000
    operations.optimise(job, spec, "tickets:1")
    assert resumed[0].within_s == pytest.approx(600 - spent_s)


def test_an_optimisation_that_crashed_part_way_resumes_with_about_what_was_left_of_its_time_limit(
    opened: Store, registered: registry.ModelVersion, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker dies (a power cut, the OOM killer) while a student learns: the time it had spent was recorded as it
    went (here after every report; every SPENT_SAVED_EVERY_S in a job)."""
    class CrashingJob(StoppingJob):
        def report(self, data: dict[str, object], force: bool = False) -> None:
            super().report(data, force)
            if self.left <= 0:
                raise MemoryError("killed")

    monkeypatch.setattr(operations, "SPENT_SAVED_EVERY_S", 0.0)
    job, spec = CrashingJob(opened, reports_before_stop=5), OptimizeJob.parse(
        {"version": "tickets:1", "distill_layers": 1, "max_minutes": 10})
    with pytest.raises(MemoryError):
        operations.optimise(job, spec, "tickets:1")
    assert job.state["optimize_spent_s"] > 0 and "optimized" not in job.state


def test_a_version_with_neither_torch_bundle_nor_fp32_ir_cannot_be_optimised(
        opened: Store, registered: registry.ModelVersion) -> None:
    int8_only = registry.Variant("int8", "openvino-ir", registered.variants["torch"].blob_id, 1, {})
    exported = registry.register(opened, "exported", run_id=registered.run_id, task=registered.task,
                                 variants=[int8_only], chosen="int8", reason="quantised elsewhere")
    with pytest.raises(RegistryError, match="exported:1 has neither a torch bundle nor an FP32 IR"):
        pipeline.optimize_version(opened, exported.ref)


@pytest.mark.slow
def test_train_then_optimize_from_the_command_line(tiny_base: Path, tmp_path: Path) -> None:
    run_cli("keys", "init", check=True)
    run_cli("data", "import", str(write_tickets(tmp_path / "tickets.csv")), "--name", "tickets", check=True)
    refused = run_cli("train", "--data", "tickets", "--base", str(tiny_base), "--name", "no spaces")
    assert refused.returncode == 1 and '"no spaces" is not a usable model name' in refused.stderr
    assert "Traceback" not in refused.stderr
    assert run_cli("runs", "list").stdout.startswith("no training runs yet")  # refused before training started

    trained = run_cli("train", "--data", "tickets", "--base", str(tiny_base), "--epochs", "8", "--lr", "3e-3",
                      "--batch-size", "16", "--max-length", "32", "--seed", "3", "--name", "support", check=True)
    assert "registered as support:1; optimise it with 'appliance optimize support:1'" in trained.stdout

    optimized = run_cli("optimize", "support:1", "--calibration-size", "64", check=True)
    assert optimized.stdout.startswith("support:2  (not deployed)")
    assert optimized.stdout.strip().endswith("'appliance deploy support:2 --canary 20'")
    assert "chosen: " in optimized.stdout and "int8" in optimized.stdout and "Texts/s at batch 16" in optimized.stdout
    shown = json.loads(run_cli("models", "show", "support:2", "--json", check=True).stdout)
    assert shown["lineage"]["params"]["learning_rate"] == 0.003 and shown["chosen"] in shown["variants"]

    missing = run_cli("optimize", "support:7")
    assert missing.returncode == 1 and "model support has no version 7" in missing.stderr
    assert "Traceback" not in missing.stderr
    bad = run_cli("optimize", "support", "--max-accuracy-drop", "-3")
    assert bad.returncode == 2 and "--max-accuracy-drop" in bad.stderr
