"""Distillation: a fine-tuned text classifier teaches a copy of itself cut to its first k encoder layers.

A student of k layers spends about k/n of the teacher's encoder time, and starting it from the
teacher's own embeddings, lower layers and head keeps most of what the teacher knows
before any training. It then learns from the teacher's softened logits (which carry how
alike the classes are, not just which one is right) and from the hard labels. The result
is a bundle of the teacher's form, so optimize.optimize exports and quantises it as is.
Everything stays in memory: no plaintext weight reaches a disk.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from safetensors.torch import save as save_safetensors
from torch import nn

from appliance import inference
from appliance.core import archive
from appliance.core.errors import JobError, OptimizeError
from appliance.data.datasets import LoadedDataset
from appliance.train.bundle import TorchRunner, load_text_classifier

LAYER_PATHS = ("encoder.layer", "transformer.layer")  # BERT, MiniLM, RoBERTa, ELECTRA; DistilBERT


@dataclass(frozen=True)
class DistillParams:
    """How to distil: the student's depth and the training settings."""

    layers: int  # keep the teacher's first `layers` encoder layers (1 <= layers < teacher's)
    epochs: int = 4
    # The cut student feeds its head a lower layer's output than the head was trained on, so it has far to move:
    # on all-MiniLM-L6-v2 cut to 2 or 3 layers (240 training rows, 32 steps) 1e-4 left it at chance, 5e-4 reached
    # 0.80-0.87 and 1e-3 0.85-0.88 against teachers of 0.82-0.90; with clipping and decay 1e-3 stayed stable to 128 steps.
    learning_rate: float = 1e-3
    batch_size: int = 32
    temperature: float = 2.0
    alpha: float = 0.5  # weight of the soft (KL) loss; 1 - alpha on the hard cross-entropy
    seed: int = 0


@dataclass(frozen=True)
class Student:
    """The distilled bundle, its validation scores beside the teacher's, and how long it took."""

    bundle: bytes  # same files as a training bundle: config.json, model.safetensors, tokenizer files, appliance.json
    metrics: dict[str, float]
    teacher_metrics: dict[str, float]
    layers: int
    seconds: float


def distill(
    teacher_bundle: bytes,
    data: LoadedDataset,
    params: DistillParams,
    *,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Student:
    """Train a k-layer student on the teacher's soft labels and the hard labels; keep its best epoch."""
    started = time.monotonic()
    files = archive.unpack(teacher_bundle)
    try:
        model, reader, manifest = load_text_classifier(files)
    except OptimizeError as exc:
        raise OptimizeError(f"cannot distil this model: {exc.message}", hint=exc.hint or (
            "distillation takes a fine-tuned text-classification bundle, as 'appliance train' makes")) from exc
    layers = _encoder_layers(model, params.layers)
    _check(data, manifest["labels"], params)
    targets = torch.tensor([manifest["labels"].index(label) for label in data.labels])
    validation = [data.texts[i] for i in data.validation], targets[data.validation].tolist()

    runner = TorchRunner(model)
    teacher_metrics = inference.evaluate(runner, reader, *validation)
    soft = torch.zeros(len(data.texts), len(manifest["labels"]))
    soft[data.train] = torch.from_numpy(inference.predict(runner, reader, [data.texts[i] for i in data.train]))
    del layers[params.layers :]  # the teacher is not needed any more: it becomes the student in place
    model.config.num_hidden_layers = params.layers

    torch.manual_seed(params.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=params.learning_rate)
    total = math.ceil(len(data.train) / params.batch_size) * params.epochs
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.0, total_iters=total)
    best, best_state, step = None, None, 0
    for epoch in range(params.epochs):
        model.train()
        generator = torch.Generator().manual_seed(params.seed * 1009 + epoch)
        for batch in _batches(data.texts, data.train, params.batch_size, generator):
            if should_stop and should_stop():
                raise JobError("distillation stopped before it finished", hint="nothing was kept; start it again")
            feeds = inference.encode(reader, [data.texts[i] for i in batch], runner.names)
            logits = model(**{name: torch.from_numpy(array) for name, array in feeds.items()}).logits
            _loss(logits, soft[batch], targets[batch], params).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if progress:
                progress(step, total)
        model.eval()
        metrics = inference.evaluate(runner, reader, *validation)
        if best is None or metrics["macro_f1"] > best["macro_f1"]:
            best, best_state = metrics, copy.deepcopy(model.state_dict())
    model.load_state_dict(best_state)
    files["config.json"] = model.config.to_json_string().encode()
    files["model.safetensors"] = save_safetensors({k: v.contiguous() for k, v in model.state_dict().items()})
    return Student(archive.pack(sorted(files.items())), best, teacher_metrics, params.layers,
                   time.monotonic() - started)


def _check(data: LoadedDataset, labels: Sequence[str], params: DistillParams) -> None:
    """Refuse, before any work, a dataset or settings that cannot give a student worth keeping."""
    if not data.train or not data.validation:
        raise OptimizeError(f"distillation needs training and validation examples; this dataset has "
                            f"{len(data.train)} and {len(data.validation)}",
                            hint="import more examples, or a smaller validation fraction, so both splits hold some")
    unknown = sorted(set(data.labels) - set(labels))
    if unknown:
        raise OptimizeError(f"the dataset has labels the teacher was not trained on: {', '.join(unknown)}",
                            hint="distil on the dataset version the teacher was trained on")
    if params.epochs < 1 or params.batch_size < 1:
        raise OptimizeError(f"distillation needs at least one epoch and one example a batch, not "
                            f"{params.epochs} epochs of {params.batch_size}", hint="set epochs and batch_size to 1 or more")


def _encoder_layers(model: nn.Module, keep: int) -> nn.ModuleList:
    """The encoder's list of layers, once it is known that `keep` of them can be kept and some dropped."""
    for path in LAYER_PATHS:
        layers = model.base_model
        for name in path.split("."):
            layers = getattr(layers, name, None)
        if isinstance(layers, nn.ModuleList):
            break
    else:
        raise OptimizeError(f"cannot distil a {model.config.model_type} model: it has no encoder layer list "
                            f"({' or '.join(LAYER_PATHS)})",
                            hint="distillation supports BERT-like encoders (BERT, MiniLM, RoBERTa, DistilBERT); "
                            "optimise the teacher without distilling")
    if not 1 <= keep < len(layers):
        raise OptimizeError(f"a student must keep from 1 to {len(layers) - 1} of the teacher's {len(layers)} "
                            f"encoder layers, not {keep}",
                            hint=f"choose a layer count from 1 to {len(layers) - 1}: fewer is faster, more is closer")
    return layers


def _batches(texts: Sequence[str], indices: Sequence[int], size: int, generator: torch.Generator) -> list[list[int]]:
    """Batches of similar length in random order; lengths are jittered so the batches differ each epoch."""
    jitter = (0.8 + 0.4 * torch.rand(len(indices), generator=generator)).tolist()
    order = [i for _, i in sorted(zip((len(texts[i]) * j for i, j in zip(indices, jitter)), indices))]
    batches = [order[start : start + size] for start in range(0, len(order), size)]
    return [batches[b] for b in torch.randperm(len(batches), generator=generator).tolist()]


def _loss(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, params: DistillParams) -> torch.Tensor:
    """alpha * T^2 * KL(teacher || student) at temperature T, plus (1 - alpha) * cross-entropy on the labels."""
    t = params.temperature
    soft = nn.functional.kl_div(nn.functional.log_softmax(student / t, dim=-1),
                                nn.functional.log_softmax(teacher / t, dim=-1), log_target=True, reduction="batchmean")
    return params.alpha * t * t * soft + (1 - params.alpha) * nn.functional.cross_entropy(student, labels)
