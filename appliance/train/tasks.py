"""Task adapters: what differs between text and image classification (images.py has the image task).

The engine only sees a Task: it builds the model, cuts indices into batches, turns a
batch into tensors, and packs the trained model into a bundle that serving can load
without the training code. Metrics are shared by every task.

A text classifier reads a text the way its base model was trained to be read. A sentence
encoder such as the bundled all-MiniLM-L6-v2 was trained so that the mean of its token
states says what a text means (its sentence-transformers modules say so); its first
token's state, which a Hugging Face sequence classifier reads through BERT's pooler, was
never trained for that. Fine-tuned through the mean, it mostly ends higher and gets there
sooner (bench/train.py --pooling-peer): +3.3 points on the bundled sample, +2.1 on manual
pages, -0.5 and +1.6 on two splits of fortunes, and the Trainer's accuracy reached 1.5 times
sooner on the two real sets. Any other base is read the Hugging Face way.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
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

ATTENTION_DROPOUT = ("attention_probs_dropout_prob", "attention_dropout")  # BERT and its kin; DistilBERT, BART, ...
# Files of a Hugging Face model directory that travel with the model (weights excluded).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "merges.txt",
    "vocab.json",
    "sentencepiece.bpe.model",
)
MEAN_POOLED = "mean-pooled"  # a manifest's name for MeanPooledClassifier; none names a Hugging Face classifier


def autocast_dtype(precision: str) -> torch.dtype | None:
    """A plan's precision ("bf16", "fp16", "fp32") as autocast's dtype; None: no autocast, all in fp32."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def autocast(device: torch.device, dtype: torch.dtype | None) -> torch.autocast:
    """Mixed precision in dtype (the plan's bf16 or fp16) on device; None: none, all in fp32."""
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


def attention_kernel(device: torch.device, window: int) -> str:
    """The attention a text model trains with on device, as transformers names it. On a CPU, up to DEFAULT_WINDOW
    tokens, eager (matmuls and a softmax): a step of 32 texts took 614 ms against the fused kernel's 843 at 128
    tokens, 188 against 245 at 32 (2 cores, bf16, no attention dropout). Beyond it, and on a GPU, the fused kernel
    (scaled_dot_product_attention), which never holds the tokens x tokens scores: 842 ms against 1,795 at 8 x 512."""
    return "eager" if device.type == "cpu" and window <= DEFAULT_WINDOW else "sdpa"


def use_attention(model: nn.Module, kernel: str) -> None:
    """Switch a built model's attention kernel (attention_kernel's names); its weights and outputs stay as they are."""
    from transformers import PreTrainedModel

    next(module for module in model.modules() if isinstance(module, PreTrainedModel)).set_attn_implementation(kernel)


def adamw(params: Iterable[nn.Parameter] | list[dict[str, object]], learning_rate: float) -> torch.optim.AdamW:
    """AdamW as its fused kernel, on a CPU as on a GPU: one pass over each tensor for the whole update. On a 2-core
    CPU the default (one operation at a time over the list of tensors) took 157-229 ms a step to update MiniLM's 23M
    parameters, against 25-28 ms fused: a fifth of a training step's time."""
    return torch.optim.AdamW(params, lr=learning_rate, fused=True)


class Task(Protocol):
    """What the engine needs from a task."""

    kind: str
    label_names: list[str]

    def build_model(self) -> nn.Module: ...
    def batches(self, indices: Sequence[int], size: int, generator: torch.Generator) -> list[list[int]]: ...
    def collate(self, indices: Sequence[int], augment_seed: int | None = None) -> dict[str, torch.Tensor]:
        """A batch's tensors; a training batch's augmentation (where the task has one) drawn from augment_seed."""
        ...
    def cost(self, indices: Sequence[int]) -> int:
        """What a batch takes to train, in a unit its time grows with: a text batch's padded tokens, an image
        batch's images. Batches of one run can differ tenfold in it (a batch of long texts against one of short)."""
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

    def __init__(self, data: LoadedDataset, base_dir: Path, max_length: int, lora: LoraSettings | None,
                 truncation: words.Truncation = "head+tail") -> None:
        from transformers import AutoTokenizer
        from transformers.utils import logging as transformers_logging

        # Its load reports ("classifier newly initialised") are expected here and only alarm operators.
        transformers_logging.set_verbosity_error()
        transformers_logging.disable_progress_bar()

        self.base_dir = base_dir
        self.label_names = data.label_names
        self.architecture = MEAN_POOLED if reads_mean(base_dir) else None
        self.max_length = max_length
        self.lora = lora
        self.pad_to = 1  # a batch's width is rounded up to a multiple of this (the engine sets it for a GPU)
        self.attention = "sdpa"  # the attention kernel the model trains with (the engine sets it: attention_kernel)
        if not Path(base_dir).is_dir():  # else the loader reads it as a name on the Hugging Face hub, and says so
            raise JobError(f"the base model folder {base_dir} {'is a file' if Path(base_dir).exists() else 'does not exist'}",
                           hint="--base (or train.base_model) must be a local Hugging Face model directory"
                                " (config.json, tokenizer files, weights)")
        if not (Path(base_dir) / "config.json").is_file():  # else the tokenizer's loader tells of sentencepiece
            raise JobError(f"{base_dir} has no config.json, so it is not a Hugging Face model directory",
                           hint="--base (or train.base_model) must be a local Hugging Face model directory"
                                " (config.json, tokenizer files, weights)")
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
        """The base model with a new classification head, which reads the mean of the token states where the base
        is a sentence encoder trained to be read so, its attention kernel as `attention` says.

        A sentence encoder's attention probabilities are not dropped out while it fine-tunes (its hidden states still
        are). On a CPU, drawing that dropout's masks took a third of a step (all-MiniLM-L6-v2, 32 x 128 tokens: 1.03 s
        a step with it, 0.70 s without, in eager attention), and bench/train.py's runs without it reached the
        Trainer's final accuracy 3.64-3.96 times sooner than the Trainer on three real splits (2.60-4.08 with it),
        ending within three texts of where they ended with it. A base read the Hugging Face way keeps its dropout
        (not measured so), but for a window longer than DEFAULT_WINDOW, where it would keep attention off the fused
        kernel, which never holds a batch's tokens x tokens scores (a step took 5.5 times as long at 512 tokens)."""
        from transformers import AutoModel, AutoModelForSequenceClassification

        settings = self.encoder_settings()
        if self.architecture == MEAN_POOLED:
            model: nn.Module = MeanPooledClassifier(self.pretrained(AutoModel, **settings), len(self.label_names))
        else:
            model = self.pretrained(AutoModelForSequenceClassification, **settings, num_labels=len(self.label_names))
        if self.lora is None:
            return model
        from peft import LoraConfig, TaskType, get_peft_model

        if self.architecture == MEAN_POOLED:  # not a Hugging Face classifier: peft's generic wrapper, head trained
            config = LoraConfig(r=self.lora.rank, lora_alpha=self.lora.alpha, lora_dropout=self.lora.dropout,
                                modules_to_save=["classifier"])
        else:
            config = LoraConfig(task_type=TaskType.SEQ_CLS, r=self.lora.rank, lora_alpha=self.lora.alpha,
                                lora_dropout=self.lora.dropout)
        return get_peft_model(model, config)

    def encoder_settings(self) -> dict[str, object]:
        """How the base model is loaded to be trained (build_model says why): its attention kernel, and no attention
        dropout for a sentence encoder or a window longer than DEFAULT_WINDOW."""
        from transformers import AutoConfig

        settings: dict[str, object] = {"attn_implementation": self.attention}
        if self.architecture == MEAN_POOLED or self.max_length > DEFAULT_WINDOW:
            base_config = AutoConfig.from_pretrained(self.base_dir, local_files_only=True)
            settings |= {name: 0.0 for name in ATTENTION_DROPOUT if hasattr(base_config, name)}
        return settings

    def pretrained(self, auto_class: type, **settings: object) -> nn.Module:
        """The base model's weights in one of transformers' Auto classes, labelled with this task's labels, in FP32
        (master weights stay FP32 even when the base model was saved in half precision)."""
        return auto_class.from_pretrained(
            self.base_dir,
            **settings,
            id2label=dict(enumerate(self.label_names)),
            label2id={name: i for i, name in enumerate(self.label_names)},
            local_files_only=True,
            dtype=torch.float32,
        )

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
        width = self._width(rows)
        pad = self.words.pad_id
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for n, row in enumerate(rows):
            ids[n, : len(row)] = torch.tensor(row)
            mask[n, : len(row)] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": self.targets[list(indices)]}

    def cost(self, indices: Sequence[int]) -> int:
        """The batch's padded tokens: on a 2-core CPU, MiniLM's step took 0.11 s at 8 tokens and 1.0 s at 109, about
        linear in them."""
        return len(indices) * self._width([self.input_ids[i] for i in indices])

    def _width(self, rows: Sequence[Sequence[int]]) -> int:
        return -(-max(len(row) for row in rows) // self.pad_to) * self.pad_to

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


def reads_mean(base_dir: Path) -> bool:
    """Whether a base model is a sentence encoder read as the mean of its token states: its sentence-transformers
    modules (modules.json) pool them so. Anything unreadable there reads as no."""
    try:
        modules = json.loads((base_dir / "modules.json").read_text())
        pooling = next(module["path"] for module in modules if module["type"].endswith(".Pooling"))
        return bool(json.loads((base_dir / pooling / "config.json").read_text()).get("pooling_mode_mean_tokens"))
    except (OSError, ValueError, TypeError, KeyError, StopIteration):
        return False


# -- the mean-pooled classifier ------------------------------------------------------------


def additive_mask(mask: torch.Tensor) -> torch.Tensor:
    """A padding mask as the 4-D additive one BERT-like encoders take as given, eager, SDPA and traced alike
    (transformers 5.5 cannot trace building its own: transformers#45735)."""
    keep = mask[:, None, None, :].to(torch.float32)
    return (1.0 - keep) * torch.finfo(torch.float32).min


class MeanPooledClassifier(nn.Module):
    """An encoder, the mean of its token states over the text (padding left out), and a linear classifier."""

    def __init__(self, encoder: nn.Module, num_labels: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.classifier: nn.Module = nn.Linear(encoder.config.hidden_size, num_labels)
        self.config = encoder.config
        pooler = getattr(encoder, "pooler", None)
        if pooler is not None:  # BERT's pooler reads the first token, which is not read here: left as it is
            pooler.requires_grad_(False)

    @property
    def base_model(self) -> nn.Module:
        """The encoder, where a Hugging Face classifier keeps it too (distillation cuts its layers)."""
        return self.encoder

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> ModelOutput:
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        states = self.encoder(input_ids=input_ids, attention_mask=additive_mask(attention_mask), **extra)[0]
        keep = attention_mask[:, :, None].to(states.dtype)
        return ModelOutput.of(self.classifier((states * keep).sum(1) / keep.sum(1).clamp(min=1)), labels)


def classifier(config: object, num_labels: int) -> MeanPooledClassifier:
    """An untrained MeanPooledClassifier of a config's shape, for a bundle's weights to be loaded into."""
    from transformers import AutoModel

    return MeanPooledClassifier(AutoModel.from_config(config), num_labels)
