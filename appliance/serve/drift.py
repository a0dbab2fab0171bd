"""Drift: live traffic compared with what the model was trained and validated on.

A reference is made when a version is optimised and travels inside its encrypted
artifact: the distribution of input lengths (tokens) and of token ids (hashed into
buckets, so no word is kept), the training labels, and the model's confidence on the
validation split. The server fills a window of the same statistics from live traffic;
each full window is scored with the population stability index (PSI) per feature.
PSI under 0.1 is usually read as stable, over 0.2 as a shift worth a look.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import tokenizers

LENGTH_EDGES = (0, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 10**9)
CONFIDENCE_EDGES = (0.0, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.01)
TOKEN_BUCKETS = 32
FEATURES = ("length", "tokens", "label", "confidence")


def psi(expected: Sequence[float], observed: Sequence[float]) -> float:
    """Population stability index of two histograms (counts or shares), empty bins smoothed."""
    e, o = np.asarray(expected, dtype=float), np.asarray(observed, dtype=float)
    e, o = np.clip(e / max(e.sum(), 1e-12), 1e-4, None), np.clip(o / max(o.sum(), 1e-12), 1e-4, None)
    return float(np.sum((o - e) * np.log(o / e)))


@dataclass
class Histograms:
    """Counts per bin for each feature; a reference and a live window have the same shape."""

    length: np.ndarray = field(default_factory=lambda: np.zeros(len(LENGTH_EDGES) - 1))
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(TOKEN_BUCKETS))
    label: np.ndarray = field(default_factory=lambda: np.zeros(0))
    confidence: np.ndarray = field(default_factory=lambda: np.zeros(len(CONFIDENCE_EDGES) - 1))
    texts: int = 0

    def add_inputs(self, encodings: Sequence[tokenizers.Encoding]) -> None:
        """Count the lengths and tokens of one padded batch (the padding left out). It runs on every batch served,
        so it is kept to a few numpy calls: ~10 us for one text."""
        if not encodings:
            return
        mask = np.asarray([e.attention_mask for e in encodings], dtype=bool)
        ids = np.asarray([e.ids for e in encodings], dtype=np.int64)[mask]
        self.length += _binned(mask.sum(axis=1), LENGTH_EDGES)
        self.tokens += np.bincount(ids % TOKEN_BUCKETS, minlength=TOKEN_BUCKETS)
        self.texts += len(encodings)

    def add_outputs(self, probabilities: np.ndarray) -> None:
        if not self.label.size:
            self.label = np.zeros(probabilities.shape[1])
        self.label += np.bincount(probabilities.argmax(axis=1), minlength=probabilities.shape[1])
        self.confidence += _binned(probabilities.max(axis=1), CONFIDENCE_EDGES)

    def to_json(self) -> dict[str, list[float] | int]:
        return {name: getattr(self, name).tolist() for name in FEATURES} | {"texts": self.texts}

    @classmethod
    def from_json(cls, data: dict) -> Histograms:
        return cls(**{name: np.asarray(data[name], dtype=float) for name in FEATURES}, texts=data["texts"])

    def scores(self, reference: Histograms) -> dict[str, float]:
        """PSI of each feature of this window against the reference."""
        return {name: psi(getattr(reference, name), getattr(self, name)) for name in FEATURES}


def reference(
    tokenizer: tokenizers.Tokenizer, train_texts: Sequence[str], train_labels: Sequence[int],
    validation_probabilities: np.ndarray,
) -> Histograms:
    """The reference of a version: inputs and labels from training, confidence from validation."""
    made = Histograms()
    made.add_inputs(tokenizer.encode_batch(list(train_texts)))
    made.label = np.bincount(np.asarray(train_labels, dtype=np.int64), minlength=validation_probabilities.shape[1])
    made.label = made.label.astype(float)
    made.confidence += np.histogram(validation_probabilities.max(axis=1), bins=CONFIDENCE_EDGES)[0]
    return made


def _binned(values: np.ndarray, edges: Sequence[float]) -> np.ndarray:
    """np.histogram's counts for values inside the edges, for a fraction of its cost: bins are [low, high)."""
    return np.bincount(np.searchsorted(edges, values, side="right") - 1, minlength=len(edges) - 1)


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)
