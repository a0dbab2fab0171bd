"""Task adapters: what differs between text and image classification (images.py has the image task).

The engine only sees a Task: it builds the model, cuts indices into batches, turns a
batch into tensors, and packs the trained model into a bundle that serving can load
without the training code. Metrics are shared by every task.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from safetensors.torch import save as save_safetensors
from torch import nn

from appliance import words
from appliance.core import archive
from appliance.core.errors import JobError
from appliance.data.datasets import DEFAULT_WINDOW, LoadedDataset

# Files of a Hugging Face model directory that travel with the model (weights excluded).
ATTENTION_DROPOUT = ("attention_probs_dropout_prob", "attention_dropout")  # BERT and its kin; DistilBERT, BART, ...
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "merges.txt",
    "vocab.json",
    "sentencepiece.bpe.model",
)


class Task(Protocol):
    """What the engine needs from a task."""

    kind: str
    label_names: list[str]

    def build_model(self) -> nn.Module: ...
    def batches(self, indices: Sequence[int], size: int, generator: torch.Generator) -> list[list[int]]: ...
    def collate(self, indices: Sequence[int], augment_seed: int | None = None) -> dict[str, torch.Tensor]:
        """A batch's tensors; a training batch's augmentation (where the task has one) drawn from augment_seed."""
        ...
    def bundle(self, model: nn.Module) -> bytes: ...


@dataclass(frozen=True)
class LoraSettings:
    rank: int = 8
    alpha: int = 16
    dropout: float = 0.1


class TextClassification:
    """Sequence classification on a local Hugging Face model directory."""

    kind = "text-classification"
    architecture: str | None = None  # the manifest names any but a Hugging Face sequence classifier (fast.py)

    def __init__(self, data: LoadedDataset, base_dir: Path, max_length: int, lora: LoraSettings | None,
                 truncation: words.Truncation = "head+tail") -> None:
        from transformers import AutoTokenizer
        from transformers.utils import logging as transformers_logging

        # Its load reports ("classifier newly initialised") are expected here and only alarm operators.
        transformers_logging.set_verbosity_error()
        transformers_logging.disable_progress_bar()

        self.base_dir = base_dir
        self.label_names = data.label_names
        self.max_length = max_length
        self.lora = lora
        self.pad_to = 1  # a batch's width is rounded up to a multiple of this (the engine sets it for a GPU)
        try:
            tokenizer = AutoTokenizer.from_pretrained(base_dir, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise JobError(
                f"cannot load a tokenizer from {base_dir}: {exc}",
                hint="--base must be a local Hugging Face model directory (config.json, tokenizer files, weights)",
            ) from exc
        if not getattr(tokenizer, "is_fast", False):
            raise JobError(f"{base_dir} has no fast tokenizer (tokenizer.json), which serving reads with",
                           hint="save the base model with a fast tokenizer: AutoTokenizer(..., use_fast=True)"
                                ".save_pretrained(DIR)")
        self.words = words.Words(tokenizer.backend_tokenizer, tokenizer.pad_token_id or 0, max_length, truncation)
        self.input_ids, _, truncated = self.words.encode(data.texts)
        self.texts_cut = sum(truncated)  # texts longer than the window
        index = {name: i for i, name in enumerate(self.label_names)}
        self.targets = torch.tensor([index[label] for label in data.labels])

    def build_model(self) -> nn.Module:
        """The base model with a new classification head. With a window longer than DEFAULT_WINDOW, its attention
        probabilities are not dropped out while it fine-tunes (its hidden states still are): dropout there keeps
        attention off the fused kernel, which never holds a batch's tokens x tokens scores, and on a 2-core CPU a
        step took 5.5 times as long at 512 tokens. On short texts the fused kernel is the slower one (0.75 times
        the speed at 48 tokens), so shorter windows keep the base model's dropout."""
        from transformers import AutoConfig, AutoModelForSequenceClassification

        fused = {}
        if self.max_length > DEFAULT_WINDOW:
            config = AutoConfig.from_pretrained(self.base_dir, local_files_only=True)
            fused = {name: 0.0 for name in ATTENTION_DROPOUT if hasattr(config, name)}
        model = AutoModelForSequenceClassification.from_pretrained(
            self.base_dir,
            **fused,
            num_labels=len(self.label_names),
            id2label=dict(enumerate(self.label_names)),
            label2id={name: i for i, name in enumerate(self.label_names)},
            local_files_only=True,
            dtype=torch.float32,  # master weights stay FP32 even when the base model was saved in half precision
        )
        if self.lora is None:
            return model
        from peft import LoraConfig, TaskType, get_peft_model

        config = LoraConfig(
            task_type=TaskType.SEQ_CLS, r=self.lora.rank, lora_alpha=self.lora.alpha, lora_dropout=self.lora.dropout
        )
        return get_peft_model(model, config)

    def batches(self, indices: Sequence[int], size: int, generator: torch.Generator) -> list[list[int]]:
        """Length-grouped batches: similar lengths together, so padding stays small, in random order."""
        order = [indices[i] for i in torch.randperm(len(indices), generator=generator).tolist()]
        group = size * 50
        batches = []
        for start in range(0, len(order), group):
            chunk = sorted(order[start : start + group], key=lambda i: len(self.input_ids[i]), reverse=True)
            batches += [chunk[i : i + size] for i in range(0, len(chunk), size)]
        return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]

    def collate(self, indices: Sequence[int], augment_seed: int | None = None) -> dict[str, torch.Tensor]:
        """Pad to the longest example of this batch only (rounded up to pad_to); text is not augmented."""
        rows = [self.input_ids[i] for i in indices]
        width = -(-max(len(row) for row in rows) // self.pad_to) * self.pad_to
        pad = self.words.pad_id
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for n, row in enumerate(rows):
            ids[n, : len(row)] = torch.tensor(row)
            mask[n, : len(row)] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": self.targets[list(indices)]}

    def bundle(self, model: nn.Module) -> bytes:
        """config.json + model.safetensors + tokenizer files + appliance.json, as a tar in memory."""
        if hasattr(model, "merge_and_unload"):  # LoRA: fold the adapters into the weights
            import copy

            model = copy.deepcopy(model).merge_and_unload()
        files = {
            "config.json": model.config.to_json_string().encode(),
            "model.safetensors": save_safetensors({k: v.contiguous() for k, v in model.state_dict().items()}),
            "appliance.json": manifest(self.kind, self.label_names, max_length=self.max_length,
                                        truncation=self.words.truncation,
                                        **({"architecture": self.architecture} if self.architecture else {})),
        }
        for name in TOKENIZER_FILES:
            if (self.base_dir / name).is_file():
                files[name] = (self.base_dir / name).read_bytes()
        files.setdefault("tokenizer.json", self.words.tokenizer_json.encode())  # a base that saved only a vocabulary
        return archive.pack(sorted(files.items()))


@dataclass
class ModelOutput:
    """The two fields the engine reads from any model's output."""

    loss: torch.Tensor | None
    logits: torch.Tensor

    @classmethod
    def of(cls, logits: torch.Tensor, labels: torch.Tensor | None) -> ModelOutput:
        """Logits, with their cross-entropy loss where labels are given (training and evaluation)."""
        return cls(nn.functional.cross_entropy(logits, labels) if labels is not None else None, logits)


def manifest(kind: str, label_names: list[str], **extra: object) -> bytes:
    return json.dumps({"task": kind, "labels": label_names, **extra}, indent=2).encode()
