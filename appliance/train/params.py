"""Training hyperparameters, kept apart from the engine so the CLI can show them without importing torch.

One schema for every way they come in: a job's params, the CLI's options (their ranges are read from
here), a search space's values, and the JSON a run or a search stored.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from appliance.core.schema import Strict

Metric = Literal["macro_f1", "accuracy"]


class TrainParams(Strict):
    """Hyperparameters; the defaults suit fine-tuning a small encoder on a few thousand rows."""

    noun: ClassVar[str] = "the training"

    epochs: int = Field(5, ge=1, le=1000)
    learning_rate: float = Field(1e-4, gt=0, le=1)
    batch_size: int = Field(32, ge=1, le=4096, description="effective batch; the plan splits it into micro-batches")
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    schedule: Literal["linear", "cosine"] = "linear"
    weight_decay: float = Field(0.01, ge=0, le=1)
    max_grad_norm: float = Field(1.0, gt=0, le=1e4)
    max_length: int = Field(128, ge=8, le=8192, description="tokens a text is cut to")
    lora: bool = Field(False, description="train LoRA adapters instead of every weight")
    lora_rank: int = Field(8, ge=1, le=1024)
    patience: int = Field(2, ge=1, le=1000, description="epochs without a better validation metric before stopping")
    metric: Metric = "macro_f1"
    checkpoint_every: int = Field(50, ge=1, le=1_000_000, description="optimizer steps between checkpoints")
    seed: int = Field(13, ge=0, le=2**32 - 1)
    max_minutes: float | None = Field(None, gt=0, description="stop after this long with the best so far")
