"""The training engine on real data, a real (tiny) model and the real store."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import torch

from appliance.store import Store, audit, blobs
from appliance.train import engine, runs
from appliance.train.params import TrainParams

FAST = dict(epochs=8, learning_rate=3e-3, batch_size=16, checkpoint_every=5, seed=3)


def _bundle_files(opened: Store, blob_id: str) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(blobs.read(opened, blob_id))) as tar:
        return {member.name: tar.extractfile(member).read() for member in tar.getmembers()}


def test_a_run_learns_and_leaves_a_self_contained_model(opened: Store, tickets: str, tiny_base: Path) -> None:
    reports: list[engine.Progress] = []
    result = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=TrainParams(**FAST),
                          progress=reports.append)

    assert result.status == "finished"
    assert result.metrics["accuracy"] > 0.9, result.metrics
    assert reports and reports[-1].step == result.steps and reports[0].samples_per_s > 0

    files = _bundle_files(opened, result.model_blob)
    assert {"config.json", "model.safetensors", "tokenizer.json", "appliance.json"} <= set(files)
    manifest = json.loads(files["appliance.json"])
    assert manifest["labels"] == ["billing", "shipping", "technical"]

    run = runs.get(opened, result.run_id)
    assert run.status == "finished" and run.plan["device"] == "cpu" and run.params["seed"] == 3
    history = runs.epochs(opened, result.run_id)
    assert [row.epoch for row in history] == list(range(1, len(history) + 1))
    assert all(later.elapsed_s > earlier.elapsed_s for earlier, later in zip(history, history[1:]))
    assert {"train.start", "train.epoch", "checkpoint.save", "train.finished"} <= {
        row["action"] for row in audit.rows(opened)
    }
    # A finished run keeps its model, not its checkpoint.
    assert opened.db.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0] == 0


def test_early_stopping_ends_a_run_that_stopped_improving(opened: Store, tickets: str, tiny_base: Path) -> None:
    params = TrainParams(**{**FAST, "epochs": 30, "patience": 1})
    result = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=params)
    assert result.stopped_early
    assert len(runs.epochs(opened, result.run_id)) < 30


def test_a_stop_request_checkpoints_and_resume_ends_like_an_uninterrupted_run(
    opened: Store, tickets: str, tiny_base: Path
) -> None:
    params = TrainParams(**FAST)
    straight = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=params)

    steps = iter(range(1000))
    stopped = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=params,
                           should_stop=lambda: next(steps) == 7)
    assert stopped.status == "interrupted" and stopped.steps == 8
    assert runs.get(opened, stopped.run_id).status == "interrupted"

    resumed = engine.resume(opened, stopped.run_id)
    assert resumed.status == "finished" and resumed.steps == straight.steps
    for name, value in straight.metrics.items():
        assert resumed.metrics[name] == pytest.approx(value, abs=1e-5), name


def test_lora_trains_adapters_only(opened: Store, tickets: str, tiny_base: Path) -> None:
    params = TrainParams(**{**FAST, "lora": True, "learning_rate": 1e-2})
    result = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=params)
    assert result.status == "finished"
    files = _bundle_files(opened, result.model_blob)
    assert not any("lora" in key for key in json.loads(files["config.json"]))  # merged into plain weights


def test_a_finished_run_cannot_be_resumed(opened: Store, tickets: str, tiny_base: Path) -> None:
    from appliance.core.errors import JobError

    result = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=TrainParams(**{**FAST, "epochs": 1}))
    with pytest.raises(JobError, match="already finished"):
        engine.resume(opened, result.run_id)


def test_a_base_model_saved_in_half_precision_trains_with_fp32_weights(
    opened: Store, tickets: str, tiny_base: Path, tmp_path: Path
) -> None:
    """Many published checkpoints are FP16; AdamW on FP16 weights loses its updates to rounding."""
    import shutil

    from transformers import AutoModel

    half = tmp_path / "half"
    shutil.copytree(tiny_base, half)
    AutoModel.from_pretrained(tiny_base, dtype=torch.float16).save_pretrained(half)
    result = engine.start(opened, dataset=tickets, base_dir=half, params=TrainParams(**FAST))
    assert result.metrics["accuracy"] > 0.9
    weights = _bundle_files(opened, result.model_blob)["model.safetensors"]
    from safetensors.torch import load

    assert {tensor.dtype for tensor in load(weights).values()} == {torch.float32}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_cuda_path_fine_tunes_the_bundled_model_with_mixed_precision(opened: Store) -> None:
    """The quickstart's own job on a GPU: the default base model, the sample data, default parameters."""
    from importlib import resources

    from appliance.data import datasets

    with resources.as_file(resources.files("appliance.samples") / "support_tickets.csv") as sample:
        datasets.import_file(opened, sample, name="sample")
    result = engine.start(opened, dataset="sample", base_dir=opened.settings.base_model, params=TrainParams(),
                          device="cuda")
    run = runs.get(opened, result.run_id)
    assert run.plan["device"].startswith("cuda")
    assert run.plan["precision"] in ("bf16", "fp16")
    assert result.metrics["accuracy"] > 0.85


def test_an_image_classifier_trains_on_an_image_folder(opened: Store, tmp_path: Path) -> None:
    from PIL import Image

    from appliance.data import datasets

    colours = {"red": (220, 30, 30), "blue": (30, 30, 220)}
    for label, colour in colours.items():
        (tmp_path / "photos" / label).mkdir(parents=True)
        for n in range(12):
            shade = tuple(max(0, min(255, c + (n * 7) % 40 - 20)) for c in colour)
            Image.new("RGB", (24 + n, 24), shade).save(tmp_path / "photos" / label / f"{n}.png")
    datasets.import_file(opened, tmp_path / "photos", name="photos", task="image-classification")

    params = TrainParams(epochs=6, learning_rate=3e-3, batch_size=8, seed=1)
    result = engine.start(opened, dataset="photos", base_dir=Path("."), params=params)
    assert result.status == "finished"
    assert result.metrics["accuracy"] == 1.0
    manifest = json.loads(_bundle_files(opened, result.model_blob)["appliance.json"])
    assert manifest == {"task": "image-classification", "labels": ["blue", "red"], "image_size": 64}
