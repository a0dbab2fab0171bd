"""How a classifier is scored: one definition for training, the optimiser's guard and distillation.

Plain Python over label indices, so the training loop, which runs on a Ray cluster too,
needs nothing more to judge an epoch than the inference kernel needs to judge a variant.
"""

from __future__ import annotations

from collections.abc import Sequence


def metrics(predictions: Sequence[int], targets: Sequence[int], num_labels: int) -> dict[str, float]:
    """Accuracy and macro-F1 (the mean F1 over every label, so rare classes count)."""
    total = len(targets)
    correct = sum(p == t for p, t in zip(predictions, targets))
    f1s = []
    for label in range(num_labels):
        tp = sum(p == label and t == label for p, t in zip(predictions, targets))
        fp = sum(p == label and t != label for p, t in zip(predictions, targets))
        fn = sum(p != label and t == label for p, t in zip(predictions, targets))
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0)
    return {"accuracy": correct / total if total else 0.0, "macro_f1": sum(f1s) / num_labels}
