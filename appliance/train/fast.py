"""Fast mode: a frozen encoder embeds each text once, and only a linear head trains on the embeddings.

Full fine-tuning runs the encoder forward and backward over every example in every epoch;
on a CPU and a large set that takes hours. Here the encoder runs forward once per text,
compiled by OpenVINO (the fastest path a CPU has; torch on a GPU), and an epoch is a pass
of one linear layer over the cached vectors: seconds. Texts are read as the mean of the
encoder's token states, the way sentence encoders such as all-MiniLM-L6-v2 were trained
to be read (on one split of the bundled sample a linear head reached 0.97 accuracy on
mean-pooled vectors, 0.78 on BERT's pooler output). Its hyperparameters' defaults are
TrainParams.FAST_DEFAULTS.

The model it makes is the encoder, that mean and the head (tasks.MeanPooledClassifier, the
one full fine-tuning of a sentence encoder trains too), packed as a bundle, so it optimises,
serves, distils and is guarded like a fine-tuned one. A resumed run embeds its texts again: they are minutes of
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

EMBED_BATCH = 64  # texts per inference call: large enough to keep a CPU's cores busy, small enough to pad little
EMBED_WINDOW = 4096  # texts embedded between two progress reports (and chances to stop), shortest first

EmbedProgress = Callable[[int, int, float], bool]  # texts embedded, of how many, texts/s; False: stop there


class Head(nn.Module):
    """What trains in fast mode: the classifier alone, on embeddings."""

    def __init__(self, hidden_size: int, num_labels: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, num_labels)

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> tasks.ModelOutput:
        return tasks.ModelOutput.of(self.linear(features), labels)


class FastTextClassification(tasks.TextClassification):
    """Text classification whose examples are the frozen encoder's embeddings (embed() makes them)."""

    def __init__(self, data: LoadedDataset, base_dir: Path, max_length: int, truncation: words.Truncation) -> None:
        from transformers import AutoModel

        super().__init__(data, base_dir, max_length, None, truncation)
        self.architecture = tasks.MEAN_POOLED  # whatever the base: a frozen encoder's mean is what a head reads best
        self.encoder = self.pretrained(AutoModel).eval()
        self.features: torch.Tensor | None = None

    def embed(self, device: torch.device, order: Sequence[int], progress: EmbedProgress) -> int:
        """The embeddings of texts in the order given, OpenVINO on a CPU, torch under autocast on a GPU, until
        progress says stop: how many were embedded, always a prefix of order (examples outside it have none).
        Each window of EMBED_WINDOW texts runs shortest first, so batches pad little."""
        model = tasks.MeanPooledClassifier(self.encoder, len(self.label_names))
        model.classifier = nn.Identity()  # its "logits" are the embeddings
        if device.type == "cpu":
            from appliance import inference
            from appliance.train import bundle

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
        whole = tasks.MeanPooledClassifier(self.encoder, len(self.label_names))
        whole.classifier.load_state_dict(model.linear.state_dict())
        return super().bundle(whole)
