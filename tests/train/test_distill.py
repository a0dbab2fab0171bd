"""Distillation of a tiny 2-layer teacher into a 1-layer student, with real torch and real optimisation."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load as load_safetensors

from appliance import optimize
from appliance.core import archive, hardware
from appliance.core.errors import JobError, OptimizeError
from appliance.data import datasets
from appliance.train import distill
from appliance.train.bundle import load_text_classifier
from tests.conftest import Trained

MAX_LENGTH = 32
CHANCE = 1 / 3  # three balanced classes
FAST = distill.DistillParams(layers=1, epochs=3, learning_rate=2e-3, batch_size=16)  # a 32-wide model wants a high rate


@pytest.fixture(scope="module")
def teacher(trained: Trained) -> tuple[bytes, datasets.LoadedDataset]:
    return trained.bundle, trained.data


@pytest.fixture(scope="module")
def student(teacher: tuple[bytes, datasets.LoadedDataset]) -> distill.Student:
    return distill.distill(*teacher, FAST)


def test_a_one_layer_student_keeps_the_teachers_accuracy_and_is_smaller(
    teacher: tuple[bytes, datasets.LoadedDataset], student: distill.Student
) -> None:
    teacher_files, student_files = archive.unpack(teacher[0]), archive.unpack(student.bundle)
    assert student.teacher_metrics["accuracy"] > 0.9
    assert student.metrics["accuracy"] >= student.teacher_metrics["accuracy"] - 0.1, student
    assert set(student.metrics) == {"accuracy", "macro_f1"} and student.layers == 1 and student.seconds > 0
    assert set(student_files) == set(teacher_files)
    assert json.loads(student_files["config.json"])["num_hidden_layers"] == 1
    assert student_files["appliance.json"] == teacher_files["appliance.json"]

    def parameters(files: dict[str, bytes]) -> int:
        return sum(t.numel() for t in load_safetensors(files["model.safetensors"]).values())

    assert parameters(student_files) < parameters(teacher_files)
    assert len(student_files["model.safetensors"]) < len(teacher_files["model.safetensors"])
    assert not any(".layer.1." in name for name in load_safetensors(student_files["model.safetensors"]))


def test_the_student_bundle_loads_and_optimises_like_a_trained_one(
    teacher: tuple[bytes, datasets.LoadedDataset], student: distill.Student
) -> None:
    data = teacher[1]
    model, _, manifest = load_text_classifier(archive.unpack(student.bundle))
    assert len(model.base_model.encoder.layer) == 1 and manifest["labels"] == data.label_names
    machine = hardware.Hardware(cpu=hardware.Cpu(model="test CPU", physical_cores=2, logical_cores=2, flags=()),
                                ram_total_bytes=2**33, ram_available_bytes=2**32, gpus=(), openvino_devices=(), notes=())
    outcome = optimize.optimize(
        student.bundle,
        calibration=[data.texts[i] for i in data.train],
        examples=[data.texts[i] for i in data.validation],
        labels=[data.labels[i] for i in data.validation],
        hardware=machine,
        max_accuracy_drop=-1.0,  # impossible, so every INT8 variant is built and scored
        subset_size=64,
    )
    assert set(outcome.artifacts) == {"fp32", "int8", "int8-gentle"}
    assert len(outcome.artifacts["int8"].weights) < len(outcome.artifacts["fp32"].weights) / 2
    assert outcome.decision.scores["int8"]["accuracy"] > CHANCE + 0.3
    assert outcome.decision.scores["fp32"]["accuracy"] == pytest.approx(student.metrics["accuracy"], abs=0.05)


def test_the_student_learns_from_the_teachers_soft_labels(teacher: tuple[bytes, datasets.LoadedDataset]) -> None:
    bundle, data = teacher
    train = set(data.train)
    untrained = distill.distill(bundle, data, replace(FAST, epochs=1, learning_rate=0))
    # Every training label is wrong: only the teacher can show the student the classes.
    mislabelled = datasets.LoadedDataset(None, [data.label_names[0] if i in train else label  # type: ignore[arg-type]
                                                for i, label in enumerate(data.labels)],
                                         data.label_names, data.train, data.validation, data.texts)
    soft_only = distill.distill(bundle, mislabelled, replace(FAST, alpha=1.0))
    hard_only = distill.distill(bundle, mislabelled, replace(FAST, alpha=0.0))
    assert untrained.metrics["accuracy"] < soft_only.teacher_metrics["accuracy"] - 0.1  # so there was something to learn
    assert soft_only.metrics["accuracy"] >= soft_only.teacher_metrics["accuracy"] - 0.05, soft_only.metrics
    assert hard_only.metrics["accuracy"] < CHANCE + 0.1, hard_only.metrics  # and alpha weighs the two losses


def test_the_same_seed_gives_the_same_student(teacher: tuple[bytes, datasets.LoadedDataset]) -> None:
    short = distill.DistillParams(layers=1, epochs=1, learning_rate=2e-3, batch_size=16)
    first, again = distill.distill(*teacher, short), distill.distill(*teacher, short)
    other = distill.distill(*teacher, replace(short, seed=1))
    assert first.bundle == again.bundle
    assert other.bundle != first.bundle


def test_progress_is_reported_and_should_stop_stops(teacher: tuple[bytes, datasets.LoadedDataset]) -> None:
    seen: list[tuple[int, int]] = []
    with pytest.raises(JobError, match="stopped before it finished"):
        distill.distill(*teacher, FAST, progress=lambda step, total: seen.append((step, total)),
                        should_stop=lambda: len(seen) >= 3)
    steps_per_epoch = -(-len(teacher[1].train) // FAST.batch_size)
    assert seen == [(step, steps_per_epoch * FAST.epochs) for step in (1, 2, 3)]


@pytest.mark.parametrize("layers", [0, 2, 5])
def test_a_layer_count_out_of_range_is_refused(teacher: tuple[bytes, datasets.LoadedDataset], layers: int) -> None:
    with pytest.raises(OptimizeError, match=f"from 1 to 1 of the teacher's 2 encoder layers, not {layers}") as raised:
        distill.distill(*teacher, distill.DistillParams(layers=layers))
    assert "choose a layer count from 1 to 1" in raised.value.hint


def test_a_bundle_or_dataset_that_cannot_be_distilled_is_refused(
    teacher: tuple[bytes, datasets.LoadedDataset],
) -> None:
    bundle, data = teacher
    image = archive.pack([("appliance.json", b'{"task": "image-classification", "labels": ["a", "b"]}'),
                          ("model.safetensors", b"")])
    with pytest.raises(OptimizeError, match="cannot distil this model: only text-classification") as raised:
        distill.distill(image, data, FAST)
    assert "text-classification bundle" in raised.value.hint
    no_train = datasets.LoadedDataset(None, data.labels, data.label_names, [], data.validation, data.texts)  # type: ignore[arg-type]
    with pytest.raises(OptimizeError, match="needs training and validation examples; this dataset has 0 and"):
        distill.distill(bundle, no_train, FAST)
    renamed = datasets.LoadedDataset(None, ["other", *data.labels[1:]], data.label_names, data.train,  # type: ignore[arg-type]
                                     data.validation, data.texts)
    with pytest.raises(OptimizeError, match="labels the teacher was not trained on: other"):
        distill.distill(bundle, renamed, FAST)
    with pytest.raises(OptimizeError, match="at least one epoch and one example a batch, not 0 epochs of 16"):
        distill.distill(bundle, data, replace(FAST, epochs=0))


def test_a_model_without_an_encoder_layer_list_is_refused() -> None:
    model = torch.nn.Module()
    model.base_model, model.config = torch.nn.Linear(2, 2), type("Config", (), {"model_type": "mlp"})()
    with pytest.raises(OptimizeError, match="cannot distil a mlp model: it has no encoder layer list") as raised:
        distill._encoder_layers(model, 1)
    assert "BERT-like" in raised.value.hint
