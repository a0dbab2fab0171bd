"""Training hyperparameters, kept apart from the engine so the CLI can show them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainParams:
    """Hyperparameters; the defaults suit fine-tuning a small encoder on a few thousand rows."""

    epochs: int = 5
    learning_rate: float = 1e-4
    batch_size: int = 32
    warmup_ratio: float = 0.1
    schedule: str = "linear"  # or "cosine"
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    max_length: int = 128
    lora: bool = False
    lora_rank: int = 8
    patience: int = 2
    metric: str = "macro_f1"
    checkpoint_every: int = 50
    seed: int = 13
    max_minutes: float | None = None
