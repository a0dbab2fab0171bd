"""Fast mode: the encoder, tuned on pairs of texts, embeds each text once; only a linear head trains on the embeddings.

Full fine-tuning runs the encoder forward and backward over every example in every epoch;
on a CPU and a large set that takes hours. Here the encoder is first tuned on a few thousand
pairs of training texts, as SetFit does (Tunstall et al., 2022): the cosine of a text and
one of its label is drawn towards 1, of a text and one of another label towards 0, so that
the embeddings separate the labels a linear head must tell apart. Then it runs forward once per text,
compiled by OpenVINO (the fastest path a CPU has; torch on a GPU), and an epoch is a pass
of one linear layer over the cached vectors: seconds. Texts are read as the mean of the
encoder's token states, the way sentence encoders such as all-MiniLM-L6-v2 were trained
to be read (on one split of the bundled sample a linear head reached 0.97 accuracy on
mean-pooled vectors, 0.78 on BERT's pooler output). Its hyperparameters' defaults are
TrainParams.FAST_DEFAULTS.

The model it makes is the encoder, that mean and the head (tasks.MeanPooledClassifier, the
one full fine-tuning of a sentence encoder trains too), packed as a bundle, so it optimises,
serves, distils and is guarded like a fine-tuned one. A checkpoint holds the head and the tuned encoder; a resumed run
embeds again (minutes of work, and hundreds of MB that a checkpoint need not carry), and
tunes again only where it stopped before its first checkpoint. Where a budget cannot cover
the pairs or embedding every text, the encoder is tuned on the pairs it covers and the head
trains on the random share of texts it covers.

Measured on a 2-core AVX-512 CPU, all-MiniLM-L6-v2, bf16 autocast (head on 30 epochs):
the bundled sample (240 train, 60 validation): 91.7% untuned, 96.7% after 960 pairs at
6e-5 (26 s), 98.3% after 2,400 at 2e-5 (63 s), SetFit's own figure in two minutes; 2,475
quotations of Debian's fortunes: 80.6% untuned, 83.0% after 2,400 pairs at 2e-5, 84.6% at
6e-5 (157 s; texts paired by length: 240 s unpaired).
"""

from __future__ import annotations

import math
import random
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

CONTRAST_LEARNING_RATE = 6e-5  # the encoder's while pairs tune it (SetFit's 2e-5 needed 2.5 times the pairs)
PAIR_BATCH = 16  # pairs per step, SetFit's default: 32 texts, the batch full fine-tuning plans for
PAIR_GROUP = 50  # batches of pairs ordered by length together, so each pads little (TextClassification.batches)

Report = Callable[[int, int, float], bool]  # done, of how many, per second; False: stop there
Pair = tuple[int, int, float]  # two training examples, and the cosine their embeddings are drawn to: 1, same label


def pairs(targets: Sequence[int], order: Sequence[int], count: int, seed: int) -> list[Pair]:
    """SetFit's pairs: the texts of order in turn, round after round, each with a random text of its own label and
    one of another, until there are count of them (a set with one label has only the first kind)."""
    rng = random.Random(seed)
    by_label: dict[int, list[int]] = {}
    for index in order:
        by_label.setdefault(targets[index], []).append(index)
    others = {label: [other for other in by_label if other != label] for label in by_label}
    made: list[Pair] = []
    while order and len(made) < count:
        for index in order:
            label = targets[index]
            made.append((index, rng.choice(by_label[label]), 1.0))
            if others[label]:
                made.append((index, rng.choice(by_label[rng.choice(others[label])]), 0.0))
            if len(made) >= count:
                break
    return made[:count]


class Head(nn.Module):
    """What trains in fast mode: the classifier alone, on embeddings."""

    def __init__(self, hidden_size: int, num_labels: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, num_labels)

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> tasks.ModelOutput:
        return tasks.ModelOutput.of(self.linear(features), labels)


class FastTextClassification(tasks.TextClassification):
    """Text classification whose examples are the encoder's embeddings (contrast() tunes it, embed() makes them)."""

    def __init__(self, data: LoadedDataset, base_dir: Path, max_length: int, truncation: words.Truncation) -> None:
        from transformers import AutoModel

        super().__init__(data, base_dir, max_length, None, truncation)
        self.architecture = tasks.MEAN_POOLED  # whatever the base: an encoder's mean is what a head reads best
        self.encoder = self.pretrained(AutoModel, **self.encoder_settings()).eval()
        self.features: torch.Tensor | None = None

    def contrast(self, device: torch.device, tuning: Sequence[Pair], dtype: torch.dtype | None, seed: int,
                 seconds: Callable[[float], float] | None, progress: Report) -> int:
        """Tune the encoder in place on pairs (cosine similarity regressed on 1 or 0, AdamW, a linear warm-up and
        decay), in batches of similar lengths, until they are done, the time allowed has passed, or progress says
        stop. `seconds` gives the time allowed at a pace (pairs/s: what comes after may depend on it); the schedule
        is fitted, step by step, to the pairs the time left can hold at the pace so far (the first steps, slower,
        do not hold it down for good), so its rate decays to nothing at the last step it takes, and progress is
        told of that many. How many pairs it was tuned on."""
        tasks.use_attention(self.encoder, self.attention)  # as full fine-tuning trains (the engine set it)
        embedder = tasks.MeanPooledClassifier(self.encoder, 1)
        embedder.classifier = nn.Identity()  # its "logits" are the embeddings
        embedder.to(device).train()
        steps = self._pair_batches(tuning, seed)
        planned = len(steps)  # steps the schedule decays over: fewer where the time left is seen not to hold them
        warmup = max(1, planned // 10)
        optimizer = tasks.adamw([p for p in embedder.parameters() if p.requires_grad], CONTRAST_LEARNING_RATE)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min((step + 1) / warmup, max(0.0, (planned - step) / max(1, planned - warmup))))
        scaler = torch.amp.GradScaler(device.type, enabled=dtype is torch.float16)
        started, done = time.monotonic(), 0
        for taken, batch in enumerate(steps, start=1):
            left = super().collate([a for a, _, _ in batch])
            right = super().collate([b for _, b, _ in batch])
            with tasks.autocast(device, dtype):
                first = embedder(left["input_ids"].to(device), left["attention_mask"].to(device)).logits
                second = embedder(right["input_ids"].to(device), right["attention_mask"].to(device)).logits
            similarity = nn.functional.cosine_similarity(first.float(), second.float())
            wanted = torch.tensor([target for _, _, target in batch], device=device)
            scaler.scale(nn.functional.mse_loss(similarity, wanted)).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            done += len(batch)
            elapsed = time.monotonic() - started
            pace = done / max(elapsed, 1e-9)
            if seconds is not None:
                planned = max(taken, min(len(steps), taken + math.floor((seconds(pace) - elapsed) / (elapsed / taken))))
            total = min(len(tuning), done + (planned - taken) * PAIR_BATCH)
            if not progress(done, total, pace) or taken >= planned:
                break
        embedder.eval()
        tasks.use_attention(self.encoder, "sdpa")  # embedding, in inference, is faster fused from 128 tokens on
        return done

    def _pair_batches(self, tuning: Sequence[Pair], seed: int) -> list[list[Pair]]:
        """PAIR_BATCH pairs a step, each group of PAIR_GROUP steps ordered by the longer text of each pair, the
        steps then shuffled (seeded): both sides of a step pad to about the same width."""
        width = {index: len(self.input_ids[index]) for pair in tuning for index in pair[:2]}
        group = PAIR_BATCH * PAIR_GROUP
        steps: list[list[Pair]] = []
        for start in range(0, len(tuning), group):
            chunk = sorted(tuning[start : start + group], key=lambda pair: max(width[pair[0]], width[pair[1]]))
            steps += [chunk[i : i + PAIR_BATCH] for i in range(0, len(chunk), PAIR_BATCH)]
        random.Random(seed).shuffle(steps)
        return steps

    def embed(self, device: torch.device, order: Sequence[int], progress: Report, dtype: torch.dtype | None) -> int:
        """The embeddings of texts in the order given, OpenVINO on a CPU, torch in the plan's dtype on a GPU, until
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
                with tasks.autocast(device, dtype):
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

    def cost(self, indices: Sequence[int]) -> int:
        return len(indices)  # embeddings, of one size

    def collate(self, indices: Sequence[int], augment_seed: int | None = None) -> dict[str, torch.Tensor]:
        assert self.features is not None, "embed() before training"
        return {"features": self.features[list(indices)], "labels": self.targets[list(indices)]}

    def bundle(self, model: nn.Module) -> bytes:
        """The encoder with the trained head, packed as any text classifier is."""
        whole = tasks.MeanPooledClassifier(self.encoder, len(self.label_names))
        whole.classifier.load_state_dict(model.linear.state_dict())
        return super().bundle(whole)
