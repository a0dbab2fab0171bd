"""Fast mode: a linear head on the frozen encoder's embeddings, trained in seconds, that optimises, serves and distils
like a fine-tuned model; and mode auto, which picks it only where full fine-tuning would not fit the budget."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from appliance import inference, optimize
from appliance.core import archive
from appliance.core.errors import JobError
from appliance.data import datasets
from appliance.operations import pipeline
from appliance.store import Store, blobs
from appliance.train import engine, fast, runs, tasks
from appliance.train.bundle import TorchRunner, load_text_classifier
from appliance.train.params import TrainParams
from tests.conftest import run_cli, write_tickets

FAST = TrainParams(mode="fast", batch_size=16, max_length=32, seed=3)


@pytest.fixture
def fast_run(opened: Store, tickets: str, tiny_base: Path) -> tuple[engine.RunResult, list[engine.Progress], list[str]]:
    reports: list[engine.Progress] = []
    lines: list[str] = []
    result = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=FAST, progress=reports.append,
                          log=lines.append)
    return result, reports, lines


def _validation(opened: Store, tickets: str) -> tuple[list[str], list[int]]:
    data = datasets.load(opened, datasets.get(opened, tickets))
    return ([data.texts[i] for i in data.validation],
            [data.label_names.index(data.labels[i]) for i in data.validation])


def test_fast_mode_embeds_each_text_once_then_trains_only_a_head(
    opened: Store, tickets: str, fast_run: tuple[engine.RunResult, list[engine.Progress], list[str]]
) -> None:
    result, reports, lines = fast_run
    assert result.status == "finished"
    assert result.metrics["accuracy"] > 0.6, result.metrics  # three classes, a random tiny encoder: chance is 1/3
    embedded = [report for report in reports if report.phase == "embed"]
    assert embedded[-1].step == embedded[-1].total_steps == 120  # every text of the set, once
    assert reports.index(embedded[-1]) < min(i for i, report in enumerate(reports) if report.phase == "train")
    assert any(line.startswith("fast mode: embedded 120 texts") for line in lines)

    run = runs.get(opened, result.run_id)
    assert run.params["mode"] == "fast"
    assert run.params["learning_rate"] == TrainParams.FAST_DEFAULTS["learning_rate"]  # the head's own default
    assert run.plan["precision"] == "fp32" and any("only the linear head trains" in note for note in run.plan["notes"])


def test_a_fast_model_scores_as_it_trained_in_torch_and_compiled_by_openvino(
    opened: Store, tickets: str, fast_run: tuple[engine.RunResult, list[engine.Progress], list[str]]
) -> None:
    result, _, _ = fast_run
    files = archive.unpack(blobs.read(opened, result.model_blob))
    assert json.loads(files["appliance.json"])["architecture"] == tasks.MEAN_POOLED
    model, tokenizer, manifest = load_text_classifier(files)
    assert isinstance(model, tasks.MeanPooledClassifier)
    texts, targets = _validation(opened, tickets)

    in_torch = inference.predict(TorchRunner(model), tokenizer, texts)
    assert inference.evaluate(TorchRunner(model), tokenizer, texts, targets)["accuracy"] == pytest.approx(
        result.metrics["accuracy"], abs=1 / len(texts))  # the whole model sees what the head was trained on
    compiled = inference.compile_openvino(optimize.export_openvino(model, manifest["max_length"]),
                                          config={"INFERENCE_PRECISION_HINT": "f32"})
    np.testing.assert_allclose(inference.predict(compiled, tokenizer, texts), in_torch, rtol=1e-3, atol=1e-4)


def test_a_fast_model_is_optimised_guarded_and_distilled_like_any_other(
    opened: Store, fast_run: tuple[engine.RunResult, list[engine.Progress], list[str]]
) -> None:
    result, _, _ = fast_run
    pipeline.register_run(opened, result.run_id, "tickets")
    version = pipeline.optimize_version(opened, "tickets:1",
                                        pipeline.OptimizeOptions(distill_layers=1, calibration_size=64))
    assert {"fp32", "int8", "student-fp32"} <= set(version.variants)
    assert version.variants["fp32"].metrics["accuracy"] == pytest.approx(result.metrics["accuracy"], abs=0.05)
    servable = inference.load_ir(blobs.read(opened, version.variants[version.chosen].blob_id))
    logits = inference.predict(servable.compiled, servable.reader, ["refund for my invoice", "courier lost parcel"])
    assert logits.shape == (2, 3)
    student = json.loads(archive.unpack(blobs.read(opened, version.variants["student-fp32"].blob_id))["appliance.json"])
    assert student["labels"] == ["billing", "shipping", "technical"]


def test_a_stop_while_embedding_interrupts_and_resume_finishes(opened: Store, tickets: str, tiny_base: Path) -> None:
    asked = iter([False, True])  # the first batch of texts embeds, then a stop arrives
    stopped = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=FAST,
                           should_stop=lambda: next(asked, True))
    assert stopped.status == "interrupted" and runs.get(opened, stopped.run_id).status == "interrupted"
    resumed = engine.resume(opened, stopped.run_id)
    assert resumed.status == "finished" and resumed.metrics["accuracy"] > 0.6


def test_a_budget_too_short_to_embed_every_text_trains_the_head_on_a_random_share(
    opened: Store, tmp_path: Path, tiny_base: Path
) -> None:
    datasets.import_file(opened, write_tickets(tmp_path / "many.csv", per_class=4000), name="many")
    lines: list[str] = []
    reports: list[engine.Progress] = []
    params = TrainParams(mode="fast", max_length=32, max_minutes=0.001)
    result = engine.start(opened, dataset="many", base_dir=tiny_base, log=lines.append, progress=reports.append,
                          params=params)
    assert result.status == "finished" and result.outcome.stopped == "budget"
    [said] = [line for line in lines if line.startswith("fast mode: embedded")]
    # The 2,400 validation texts come first, then training texts, a window at a time until the budget's share ends.
    share = fast.EMBED_WINDOW - 2400
    assert f"embedded {fast.EMBED_WINDOW:,} texts" in said
    assert f"the budget covered {share:,} of the 9,600 training texts, a random share" in said
    trained = next(report for report in reports if report.phase == "train")
    assert trained.total_steps == params.epochs * -(-share // params.batch_size)  # over the share only


def test_auto_fine_tunes_fully_unless_one_epoch_would_not_fit_the_budget(
    opened: Store, tickets: str, tiny_base: Path
) -> None:
    def settled(params: TrainParams) -> tuple[dict, list[str]]:
        lines: list[str] = []
        run_id = engine.create(opened, dataset=tickets, base_dir=tiny_base, params=params, log=lines.append)
        return runs.get(opened, run_id).params, lines

    unbounded, said = settled(TrainParams())  # before the run starts, its length is measured and said
    assert unbounded["mode"] == "full" and unbounded["learning_rate"] == TrainParams().learning_rate
    assert "examples/s here" in said[0] and "5 epochs about" in said[0] and "--max-minutes bounds it" in said[0]
    roomy, said = settled(TrainParams(max_minutes=30))
    assert roomy["mode"] == "full"
    assert "examples/s here" in said[0] and "within the 30m 00s budget" in said[0] and "--mode fast" in said[0]
    tight, said = settled(TrainParams.parse({"max_minutes": 1e-4, "epochs": 4}))
    assert tight["mode"] == "fast" and "more than the" in said[0] and "--mode full" in said[0]
    # What the caller named stays; what it left out takes fast mode's defaults.
    assert tight["epochs"] == 4 and tight["learning_rate"] == TrainParams.FAST_DEFAULTS["learning_rate"]


def test_fast_mode_refuses_what_it_cannot_do(opened: Store, tmp_path: Path, tiny_base: Path) -> None:
    with pytest.raises(JobError, match="fast mode trains only the classifier head"):
        TrainParams.parse({"mode": "fast", "lora": True})
    folder = tmp_path / "images"
    from PIL import Image

    for label in ("cat", "dog"):
        (folder / label).mkdir(parents=True)
        for n in range(4):
            Image.new("RGB", (8, 8), (n * 40, 0, 200 * (label == "dog"))).save(folder / label / f"{n}.png")
    datasets.import_file(opened, folder, name="pets", task="image-classification")
    with pytest.raises(JobError, match="fast mode is for text"):
        engine.start(opened, dataset="pets", base_dir=tiny_base, params=FAST)


def test_train_mode_fast_from_the_command_line_deploys_and_predicts(tiny_base: Path, tmp_path: Path) -> None:
    run_cli("keys", "init", check=True)
    run_cli("data", "import", str(write_tickets(tmp_path / "tickets.csv")), "--name", "tickets", check=True)
    trained = run_cli("train", "--data", "tickets", "--base", str(tiny_base), "--mode", "fast", "--max-length", "32",
                      "--deploy", "now", check=True)
    assert "fast mode: embedded 120 texts" in trained.stderr  # the run's log, above the bar
    assert "tickets:2 serves in production" in trained.stdout
    shown = json.loads(run_cli("runs", "list", "--json", check=True).stdout)[0]
    assert shown["params"]["mode"] == "fast" and shown["params"]["epochs"] == TrainParams.FAST_DEFAULTS["epochs"]
    predicted = json.loads(run_cli("predict", "tickets", "refund for my invoice", "--json", check=True).stdout)
    assert predicted["model"] == "tickets:2" and predicted["predictions"][0]["label"] in ("billing", "shipping", "technical")
    assert "fast mode" in run_cli("train", "--help", check=True).stdout
