"""Drift: live traffic compared with what the model was trained and validated on.

A reference is made when a version is optimised and travels inside its encrypted
artifact: the distribution of what the model is given, the training labels, and the model's
confidence on the validation split. What it is given is, for a text model, the input lengths
(tokens) and the token ids (hashed into buckets, so no word is kept); for an image model, the
shorter side each image was sent at and its mean brightness (so a new camera, or a dark
corner of the warehouse, shows). The server fills a window of the same statistics from live
traffic; each full window is scored with the population stability index (PSI) per feature.
PSI under 0.1 is usually read as stable, over 0.2 as a shift worth a look.

A window counts the batches it is given `CHUNK` examples at a time, all of them in a few
numpy calls: counted one by one as they came, about twenty calls per batch cost a lone
client's requests about 3% of their throughput.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from appliance import pixels, words

LENGTH_EDGES = (0, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 10**9)
SIDE_EDGES = (0, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 10**9)  # pixels
BRIGHTNESS_EDGES = tuple(range(0, 256, 16)) + (257,)  # 0..255 in sixteen steps
CONFIDENCE_EDGES = (0.0, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.01)
TOKEN_BUCKETS = 32
CHUNK = 64  # examples a window keeps aside before it counts them
Inputs = words.Read | pixels.Seen  # what a batch gave the model: texts read, or images seen


def psi(expected: Sequence[float], observed: Sequence[float]) -> float:
    """Population stability index of two histograms (counts or shares), empty bins smoothed."""
    e, o = np.asarray(expected, dtype=float), np.asarray(observed, dtype=float)
    e, o = np.clip(e / max(e.sum(), 1e-12), 1e-4, None), np.clip(o / max(o.sum(), 1e-12), 1e-4, None)
    return float(np.sum((o - e) * np.log(o / e)))


@dataclass
class Histograms:
    """Counts per bin for each feature; a reference and its live windows have the same features."""

    counts: dict[str, np.ndarray]
    examples: int = 0

    @classmethod
    def of(cls, images: bool) -> Histograms:
        """Empty histograms of a text model's features, or an image model's."""
        inputs = ({"side": len(SIDE_EDGES) - 1, "brightness": len(BRIGHTNESS_EDGES) - 1} if images
                  else {"length": len(LENGTH_EDGES) - 1, "tokens": TOKEN_BUCKETS})
        bins = inputs | {"label": 0, "confidence": len(CONFIDENCE_EDGES) - 1}
        return cls({name: np.zeros(size) for name, size in bins.items()})

    def fresh(self) -> Histograms:
        """An empty window with these features (and as many labels)."""
        return Histograms({name: np.zeros_like(counts) for name, counts in self.counts.items()})

    def add_inputs(self, batches: Sequence[Inputs]) -> None:
        """Count what batches of one kind (texts read, or images seen) gave the model, all in a few numpy calls."""
        if not batches:
            return
        if isinstance(batches[0], pixels.Seen):
            sides = np.concatenate([seen.sides for seen in batches])
            self.counts["side"] += _binned(sides, SIDE_EDGES)
            self.counts["brightness"] += _binned(np.concatenate([seen.brightness for seen in batches]),
                                                 BRIGHTNESS_EDGES)
            self.examples += len(sides)
            return
        masks = [read.feeds["attention_mask"] for read in batches]
        lengths = np.concatenate([mask.sum(axis=1) for mask in masks])
        ids = np.concatenate([read.feeds["input_ids"].ravel() for read in batches])  # the padding left out:
        ids = ids[np.concatenate([mask.ravel() for mask in masks]).astype(bool)]
        self.counts["length"] += _binned(lengths, LENGTH_EDGES)
        self.counts["tokens"] += np.bincount(ids % TOKEN_BUCKETS, minlength=TOKEN_BUCKETS)
        self.examples += len(lengths)

    def add_outputs(self, probabilities: np.ndarray) -> None:
        if not self.counts["label"].size:
            self.counts["label"] = np.zeros(probabilities.shape[1])
        self.counts["label"] += np.bincount(probabilities.argmax(axis=1), minlength=probabilities.shape[1])
        self.counts["confidence"] += _binned(probabilities.max(axis=1), CONFIDENCE_EDGES)

    def to_json(self) -> dict[str, list[float] | int]:
        return {name: counts.tolist() for name, counts in self.counts.items()} | {"examples": self.examples}

    @classmethod
    def from_json(cls, data: dict) -> Histograms:
        """Histograms as to_json wrote them (a reference made before images counted its examples as `texts`)."""
        examples = data.get("examples", data.get("texts", 0))
        return cls({name: np.asarray(counts, dtype=float) for name, counts in data.items()
                    if name not in ("examples", "texts")}, examples)

    def scores(self, reference: Histograms) -> dict[str, float]:
        """PSI of each feature of this window against the reference."""
        return {name: psi(expected, self.counts[name]) for name, expected in reference.counts.items()}


class Window:
    """Live traffic's histograms, filled until `size` examples and then scored against the reference."""

    def __init__(self, reference: Histograms, size: int) -> None:
        self.reference, self.size = reference, size
        self.counted = reference.fresh()
        self._inputs: list[Inputs] = []  # kept aside, not counted yet
        self._probabilities: list[np.ndarray] = []
        self._waiting = 0

    def add(self, inputs: Inputs, probabilities: np.ndarray) -> dict[str, float] | None:
        """Take one batch served (what it was given, what it answered); when the window is full, its PSI per feature
        (and a new window starts)."""
        if isinstance(inputs, pixels.Seen):  # an image's pixels take room: only what is counted of it is kept
            inputs = replace(inputs, feeds={})
        self._inputs.append(inputs)
        self._probabilities.append(probabilities)
        self._waiting += len(probabilities)
        if self._waiting < CHUNK and self.counted.examples + self._waiting < self.size:
            return None
        self.counted.add_inputs(self._inputs)
        self.counted.add_outputs(np.concatenate(self._probabilities))
        self._inputs, self._probabilities, self._waiting = [], [], 0
        if self.counted.examples < self.size:
            return None
        scores, self.counted = self.counted.scores(self.reference), self.reference.fresh()
        return scores


def reference(reader: words.Words | pixels.Pictures, train_examples: Sequence[str | bytes],
              train_labels: Sequence[int], validation_probabilities: np.ndarray) -> Histograms:
    """The reference of a version: inputs and labels from training, confidence from validation."""
    images = isinstance(reader, pixels.Pictures)
    made = Histograms.of(images)
    for start in range(0, len(train_examples), 64):  # a batch at a time: images' pixels take room
        chunk = list(train_examples[start:start + 64])
        made.add_inputs([reader.see(chunk)])
    made.counts["label"] = np.bincount(np.asarray(train_labels, dtype=np.int64),
                                       minlength=validation_probabilities.shape[1]).astype(float)
    made.counts["confidence"] += np.histogram(validation_probabilities.max(axis=1), bins=CONFIDENCE_EDGES)[0]
    return made


def _binned(values: np.ndarray, edges: Sequence[float]) -> np.ndarray:
    """np.histogram's counts for values inside the edges, for a fraction of its cost: bins are [low, high)."""
    return np.bincount(np.searchsorted(edges, values, side="right") - 1, minlength=len(edges) - 1)
