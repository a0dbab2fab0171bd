"""Training hyperparameters, kept apart from the engine so the CLI can show them without importing torch.

One schema for every way they come in: a job's params, the CLI's options (their ranges are read from
here), a search space's values, and the JSON a run or a search stored.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Self

from pydantic import Field, model_validator

from appliance.core.schema import Strict, refusal
from appliance.data.datasets import DEFAULT_WINDOW, Truncation

Metric = Literal["macro_f1", "accuracy"]


class TrainParams(Strict):
    """Hyperparameters; the defaults suit fine-tuning a small encoder on a few thousand rows."""

    noun: ClassVar[str] = "the training"
    # Where a fast run names none: a linear head on fixed vectors needs steps a hundred times larger than
    # fine-tuning's, and more passes, each a fraction of a second; the encoder is first tuned on 2,000 pairs of
    # texts (train/fast.py, where the measurements are).
    FAST_DEFAULTS: ClassVar[dict[str, Any]] = {"learning_rate": 3e-3, "epochs": 30, "patience": 5,
                                               "contrastive_pairs": 2000}
    # Where an image run names none: a pretrained CNN, its head fitted first (train/images.py), takes a larger rate
    # than a transformer, and more epochs and patience, since augmented epochs score noisily. On 1,600 Fashion-MNIST
    # photos in 8 minutes, 2e-4 reached 88.0% validation accuracy, 1e-4 87.25%, and 5e-4 fell from the fitted head's
    # 83.5% to 69% in its first epoch, distorting the pretrained features. With the stem and the first half of the
    # blocks frozen, a step took half the time, the budget held 9 epochs instead of 5, and validation reached 89.5%.
    IMAGE_DEFAULTS: ClassVar[dict[str, Any]] = {"learning_rate": 2e-4, "epochs": 10, "patience": 3,
                                                "schedule": "cosine", "freeze": 0.5}
    # What a run stored before a field existed did, where that is not the field's default now (see stored()).
    EARLIER: ClassVar[dict[str, Any]] = {"truncation": "head"}
    EARLIER_FAST: ClassVar[dict[str, Any]] = {"contrastive_pairs": 0}  # and what a fast run did, where fast mode's is not

    epochs: int = Field(5, ge=1, le=1000)
    learning_rate: float = Field(1e-4, gt=0, le=1)
    batch_size: int = Field(32, ge=1, le=4096, description="effective batch; the plan splits it into micro-batches")
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    schedule: Literal["linear", "cosine"] = "linear"
    weight_decay: float = Field(0.01, ge=0, le=1)
    max_grad_norm: float = Field(1.0, gt=0, le=1e4)
    max_length: int = Field(DEFAULT_WINDOW, ge=8, le=8192, description="tokens of a text the model reads, special ones included;"
                            " where none is named, a run on a budget whose texts are often longer reads more, up to"
                            " what the base model takes, where its budget holds it")
    truncation: Truncation = Field("head+tail", description="how a text longer than max_length is read: head, its"
                                   " first tokens; head+tail, its first quarter-window and its last three quarters")
    lora: bool = Field(False, description="train LoRA adapters instead of every weight")
    lora_rank: int = Field(8, ge=1, le=1024)
    freeze: float = Field(0.0, ge=0, lt=1, description="share of a pretrained image backbone's blocks, from the"
                          " input on, kept as they are while the rest fine-tunes: general features stay and a step"
                          " costs less (image runs; 0.5 unless given)")
    mode: Literal["auto", "full", "fast"] = Field(
        "auto", description="full: fine-tune every weight; fast: tune the encoder on pairs of texts, embed each "
                            "text once and train a linear head on the embeddings (minutes where full fine-tuning "
                            "takes hours); "
                            "auto: full, unless max_minutes is set and one epoch of it, at the speed measured on "
                            "this machine, would not fit: then fast. A run records the mode it chose.")
    contrastive_pairs: int = Field(0, ge=0, le=1_000_000, description="fast mode: pairs of training texts the"
                                   " encoder is tuned on first, as SetFit does (a text and one of its label drawn"
                                   " together, a text and one of another label apart), so that its embeddings"
                                   " separate the labels; 0 embeds with the encoder as it is (fast mode: 2000)")
    workers: int | None = Field(None, ge=1, le=64, description="processes training data-parallel, each on its share"
                                " of every batch: by default one per GPU, one on a CPU")
    patience: int = Field(2, ge=1, le=1000, description="epochs without a better validation metric before stopping")
    metric: Metric = "macro_f1"
    checkpoint_minutes: float = Field(10.0, gt=0, le=24 * 60, description="minutes of training between checkpoints,"
                                      " written in the background; a run that is stopped checkpoints at once")
    checkpoint_every: int | None = Field(None, ge=1, le=1_000_000, description="also checkpoint every this many"
                                         " optimizer steps")
    seed: int = Field(13, ge=0, le=2**32 - 1)
    max_minutes: float | None = Field(None, gt=0, le=7 * 24 * 60,
                                      description="stop after this long (at most a week) with the best so far")

    @model_validator(mode="before")
    @classmethod
    def _fast_defaults(cls, values: Any) -> Any:
        if isinstance(values, dict) and values.get("mode") == "fast":
            return {**cls.FAST_DEFAULTS, **values}
        return values

    @classmethod
    def stored(cls, values: dict[str, Any]) -> Self:
        """Parameters as a run or a search stored them: a field added since reads as what such a run did before it
        existed (truncation: head, where the default is now head+tail; a fast run: no pairs, where 2,000 are now)."""
        earlier = {**cls.EARLIER, **(cls.EARLIER_FAST if values.get("mode") == "fast" else {})}
        return cls.parse({**earlier, **values})

    def full(self) -> Self:
        """These parameters as mode auto settles them when it fine-tunes every weight: pairs given for fast mode
        are left out, as full fine-tuning trains the encoder on the labels themselves."""
        return self.changed(mode="full", contrastive_pairs=0)

    def for_images(self) -> Self:
        """These parameters with IMAGE_DEFAULTS where none was given."""
        return self.parse({**self.IMAGE_DEFAULTS, **self.model_dump(exclude_unset=True)})

    @model_validator(mode="after")
    def _one_mode(self) -> Self:
        if self.mode == "fast" and self.lora:
            raise refusal("lora: fast mode trains only the classifier head, so there are no adapters to train; "
                          "use one of the two")
        if self.mode == "full" and self.contrastive_pairs:
            raise refusal("contrastive_pairs: fast mode tunes the encoder on pairs before embedding; full"
                          " fine-tuning trains it on the labels themselves; use --mode fast or auto")
        if self.mode == "fast" and (self.workers or 1) > 1:
            raise refusal("workers: fast mode trains a linear head in seconds, in one process; leave workers out")
        return self
