"""Fast mode: a frozen encoder embeds each text once, and only a linear head trains on the embeddings.

Full fine-tuning runs the encoder forward and backward over every example in every epoch;
on a CPU and a large set that takes hours. Here the encoder runs forward once per text,
compiled by OpenVINO (the fastest path a CPU has; torch on a GPU), and an epoch is a pass
of one linear layer over the cached vectors: seconds. Texts are read as the mean of the
encoder's token states, the way sentence encoders such as all-MiniLM-L6-v2 were trained
to be read (on one split of the bundled sample a linear head reached 0.97 accuracy on
mean-pooled vectors, 0.78 on BERT's pooler output). Its hyperparameters' defaults are
TrainParams.FAST_DEFAULTS.

The model it makes is the encoder, that mean and the head (MeanPooledClassifier), packed
as a bundle whose manifest names the architecture, so it optimises, serves, distils and is
guarded like a fine-tuned one. A resumed run embeds its texts again: they are minutes of
work, and hundreds of MB that a checkpoint need not carry. Where a budget cannot cover
embedding every text, the head trains on the random share of them that it covers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from appliance import words
from appliance.data.datasets import LoadedDataset
from appliance.train import tasks

ARCHITECTURE = "mean-pooled"  # the manifest's name for MeanPooledClassifier
EMBED_BATCH = 64  # texts per inference call: large enough to keep a CPU's cores busy, small enough to pad little
EMBED_WINDOW = 4096  # texts embedded between two progress reports (and chances to stop), shortest first

EmbedProgress = Callable[[int, int, float], bool]  # texts embedded, of how many, texts/s; False: stop there


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
    ) -> tasks.ModelOutput:
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        states = self.encoder(input_ids=input_ids, attention_mask=additive_mask(attention_mask), **extra)[0]
        keep = attention_mask[:, :, None].to(states.dtype)
        return tasks.ModelOutput.of(self.classifier((states * keep).sum(1) / keep.sum(1).clamp(min=1)), labels)


def classifier(config: object, num_labels: int) -> MeanPooledClassifier:
    """An untrained MeanPooledClassifier of a config's shape, for a bundle's weights to be loaded into."""
    from transformers import AutoModel

    return MeanPooledClassifier(AutoModel.from_config(config), num_labels)


class Head(nn.Module):
    """What trains in fast mode: the classifier alone, on embeddings."""

    def __init__(self, hidden_size: int, num_labels: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, num_labels)

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> tasks.ModelOutput:
        return tasks.ModelOutput.of(self.linear(features), labels)


class FastTextClassification(tasks.TextClassification):
    """Text classification whose examples are the frozen encoder's embeddings (embed() makes them)."""

    architecture = ARCHITECTURE

    def __init__(self, data: LoadedDataset, base_dir: Path, max_length: int, truncation: words.Truncation) -> None:
        from transformers import AutoModel

        super().__init__(data, base_dir, max_length, None, truncation)
        self.encoder = AutoModel.from_pretrained(
            base_dir, local_files_only=True, dtype=torch.float32, id2label=dict(enumerate(self.label_names)),
            label2id={name: i for i, name in enumerate(self.label_names)},
        ).eval()
        self.features: torch.Tensor | None = None

    def embed(self, device: torch.device, order: Sequence[int], progress: EmbedProgress) -> int:
        """The embeddings of texts in the order given, OpenVINO on a CPU, torch under autocast on a GPU, until
        progress says stop: how many were embedded, always a prefix of order (examples outside it have none).
        Each window of EMBED_WINDOW texts runs shortest first, so batches pad little."""
        model = MeanPooledClassifier(self.encoder, len(self.label_names))
        model.classifier = nn.Identity()  # its "logits" are the embeddings
        if device.type == "cpu":
            from appliance import inference
            from appliance.train import bundle  # which imports this module

            compiled = inference.compile_openvino(bundle.convert_openvino(model, self.max_length))
            names = [port.get_any_name() for port in compiled.inputs]

            def run(batch: dict[str, torch.Tensor]) -> torch.Tensor:
                feeds = {name: batch.get(name, torch.zeros_like(batch["input_ids"])).numpy() for name in names}
                return torch.from_numpy(compiled(feeds)[0])
        else:
            model.to(device)

            @torch.no_grad()
            def run(batch: dict[str, torch.Tensor]) -> torch.Tensor:
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    return model(batch["input_ids"].to(device), batch["attention_mask"].to(device)).logits.float().cpu()

        self.features = torch.zeros(len(self.input_ids), self.encoder.config.hidden_size)
        started, done = time.monotonic(), 0
        try:
            for window in range(0, len(order), EMBED_WINDOW):
                ranked = sorted(order[window : window + EMBED_WINDOW], key=lambda i: len(self.input_ids[i]))
                for start in range(0, len(ranked), EMBED_BATCH):
                    chunk = ranked[start : start + EMBED_BATCH]
                    self.features[chunk] = run(super().collate(chunk))
                done = window + len(ranked)
                if not progress(done, len(order), done / max(time.monotonic() - started, 1e-9)):
                    break
        finally:
            self.encoder.cpu()  # bundles are packed from host memory
        return done

    def build_model(self) -> nn.Module:
        return Head(self.encoder.config.hidden_size, len(self.label_names))

    def batches(self, indices: Sequence[int], size: int, generator: torch.Generator) -> list[list[int]]:
        order = [indices[i] for i in torch.randperm(len(indices), generator=generator).tolist()]
        return [order[i : i + size] for i in range(0, len(order), size)]

    def collate(self, indices: Sequence[int], augment_seed: int | None = None) -> dict[str, torch.Tensor]:
        assert self.features is not None, "embed() before training"
        return {"features": self.features[list(indices)], "labels": self.targets[list(indices)]}

    def bundle(self, model: nn.Module) -> bytes:
        """The encoder with the trained head, packed as any text classifier is."""
        whole = MeanPooledClassifier(self.encoder, len(self.label_names))
        whole.classifier.load_state_dict(model.linear.state_dict())
        return super().bundle(whole)
