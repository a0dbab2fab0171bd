"""The training loop: one function from a dataset version and a base model to a model blob.

It follows the hardware plan (device, precision, threads, micro-batch and gradient
accumulation), uses AdamW with warm-up and linear or cosine decay, clips gradients,
evaluates every epoch and stops early when the validation metric stops improving. The
best weights are kept in host memory and stored once, as the run ends.

A checkpoint is taken every checkpoint_minutes of training (and every checkpoint_every
steps, if set) and whenever the run is told to stop (SIGTERM, Ctrl-C, a cancel): training
waits only for its state to be copied to host memory, and a thread stores it
(checkpoint.Writer). A run cut short continues from its checkpoint with the same data
order and random state, so it ends where an uninterrupted run would have. On a GPU the
loop never waits for the device between progress reports: batches go from pinned memory
without blocking, the loss is summed on the device. AdamW is the fused kernel, on a GPU
and a CPU alike.

A large validation split is sampled after each epoch (EVAL_SAMPLE examples, stratified,
fixed), and the kept model is evaluated on all of it once at the end when the budget
allows. max_minutes bounds the whole run: training stops early enough for its last
evaluation, measured as the run goes. Each epoch's
figures and the run's end (which epoch it kept, why it stopped, what its figures are on)
go to the run's log and its record (runs.Outcome).

Before a new run starts in mode auto (the default), a few steps of full fine-tuning are
timed on random training texts: the log says how long the run will take, and where a
budget cannot hold one epoch, fast mode trains instead (train/fast.py). A run on a budget
whose texts are often longer than the default window gets a longer one, up to what the base
model takes, where the budget holds the run at the speed measured at that length.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from appliance.core import hardware, scoring
from appliance.core.ahead import one_ahead
from appliance.core.errors import JobError
from appliance.core.text import duration
from appliance.data import datasets
from appliance.store import Store, blobs
from appliance.train import checkpoint, fast, images, parallel, runs, tasks
from appliance.train.params import TrainParams


@dataclass(frozen=True)
class Progress:
    """What a progress bar or the TUI shows while a run trains."""

    phase: str  # contrast, then embed (fast mode) | fit-head (an image run's first) | train | evaluate
    epoch: int
    epochs: int
    step: int
    total_steps: int
    loss: float
    samples_per_s: float
    eta_s: float | None


@dataclass(frozen=True)
class RunResult:
    run_id: str
    status: str  # finished | interrupted
    metrics: dict[str, float]
    model_blob: str | None
    steps: int
    outcome: runs.Outcome | None = None  # once finished

    @property
    def stopped_early(self) -> bool:
        """Ended before its last epoch because it converged or a search pruned it (not by its budget)."""
        return self.outcome is not None and self.outcome.stopped in ("converged", "asked")

    @classmethod
    def of(cls, store: Store, run_id: str) -> RunResult:
        """A run as its records tell it: one trained earlier, or on the Ray cluster."""
        run, history = runs.get(store, run_id), runs.epochs(store, run_id)
        return cls(run_id, run.status, run.metrics or {}, run.model_blob, history[-1].step if history else 0,
                   run.outcome)


@dataclass
class _Position:
    """Where a run is; saved in every checkpoint."""

    epoch: int = 0
    batch: int = 0
    step: int = 0
    loss_sum: float = 0.0
    seen: int = 0
    best: float | None = None
    best_metrics: dict[str, float] = field(default_factory=dict)
    best_blob: str | None = None  # once stored: at the run's end (earlier versions stored each better epoch's)
    bad_epochs: int = 0  # since the best epoch trained (trained_best)
    trained_best: float | None = None  # the best metric an epoch of training reached: an image run's fitted head
    # (epoch 0) may be the best model, but fine-tuning dips below it at first, so patience counts from this
    elapsed_s: float = 0.0
    best_epoch: int = 0
    eval_s_per_example: float | None = None  # measured at the last evaluation
    schedule_steps: int | None = None  # where the learning rate's schedule ends, when a budget ends the run first
    checkpoint_s: float | None = None  # what training waited for at the last checkpoint

    @classmethod
    def of(cls, saved: dict[str, Any]) -> _Position:
        """A checkpoint's position; one stored by an earlier version may name fields no longer kept."""
        return cls(**{name: value for name, value in saved.items() if name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Checkpointed:
    """A checkpoint just stored, as the lead tells on_checkpoint: what a run resumed elsewhere needs of it."""

    run_id: str
    saved: bytes  # checkpoint.latest()'s bytes: the best weights so far are in it


ProgressFn = Callable[[Progress], None]
CheckpointFn = Callable[[Checkpointed | None], None]  # after each checkpoint, on every rank: None on a helper
LogFn = Callable[[str], None]  # a line for the run's log: each epoch's validation figures, how the run ended
EVAL_SAMPLE = 2000  # validation examples evaluated after each epoch; a larger split is sampled (validation_sample)
PROBE_S = 10.0  # training measured before the run's length is estimated (or the first epoch, when shorter)
PROBE_BATCHES = 3  # micro-batches of full fine-tuning timed (after one more to warm up) when mode auto decides
WIDEN_SHARE = 0.1  # of the texts longer than the default window, from which a budgeted run considers a longer one
WINDOW_COVERS = 0.9  # of the texts a longer window holds whole, where the base model and the budget allow
WINDOW_STEP = 64  # tokens: a longer window is a multiple of this
FIT_SHARE = 0.75  # of the budget that a longer window's run may take by the estimate (the rest: evaluation, storing)
WIDE_PROBE_BATCH = 8  # texts per step when the speed at a longer window is measured
GPU_PAD_TO = 32  # on a GPU, text batches are padded to a multiple of this many tokens: its first batch of each
# new shape costs a choice and load of kernels (seconds over an epoch of every length), padding costs next to nothing
IMAGE_LAYERS = 20  # an image model's depth as the planner counts it (_image_shape)
PROGRESS_EVERY_S = 0.5  # between progress reports while training: each reads the loss, which waits for a GPU
HEAD_FIT_SHARE = 0.25  # of an image run's budget that fitting the new head on frozen features may take
CONTRAST_SHARE = 0.25  # of a fast run's budget that tuning the encoder on pairs may always take; more where the
# embedding, as estimated from the tuning's pace, leaves more before EMBED_SHARE (see _contrast)
EMBED_PACE = 10.0  # texts/s the embedding reads, at the least, for each pair/s the tuning took: measured 13 (the
# sample's short texts) to 24 (fortunes, 300k synthetic texts) on a 2-core AVX-512 CPU, so the estimate errs long
EMBED_SETUP_S = 5.0  # converting and compiling the tuned encoder before it embeds (3-4 s for MiniLM there)
EMBED_SHARE = 0.8  # of a fast run's budget that tuning and embedding may take; the rest trains and evaluates the head
DEFAULTS = TrainParams()  # frozen: one instance is every call's default
EpochFn = Callable[[runs.Epoch], bool]  # after each epoch's evaluation; True ends the run there (a pruned trial)


def create(
    store: Store,
    *,
    dataset: str,
    base_dir: Path,
    params: TrainParams = DEFAULTS,
    device: str | None = None,
    log: LogFn | None = None,
    group: parallel.Group | None = None,
) -> str:
    """Plan a new run on a dataset version and record it, untrained: a job keeps the id before the first step.

    Mode auto and a budgeted text run's window are settled here, by measuring (_settle). The data it loaded and
    tokenised to plan is kept for the run's first session in this process (_Prepared). A group already joined (Ray
    Train's) is planned for as it is: its size is the run's workers.
    """
    global _prepared
    began = time.monotonic()
    version = datasets.get(store, dataset)
    data = datasets.load(store, version)
    if version.task == datasets.IMAGE:
        params = params.for_images()
    if params.mode == "auto" or _may_widen(version.task, params, base_dir):
        params = _settle(version.task, data, base_dir, params, device, log or (lambda _line: None))
    task = _task(version.task, data, base_dir, params)
    placed = group if group is not None and group.size > 1 and params.mode != "fast" else None
    plan = hardware.plan(hardware.detect(), _request(task, data, base_dir, params, device, placed))
    if isinstance(task, fast.FastTextClassification):
        plan = replace(plan, notes=(*plan.notes, "fast mode: " + (
            f"the encoder is tuned on {params.contrastive_pairs:,} pairs of texts in that precision, then embeds"
            if params.contrastive_pairs else "the encoder embeds") + " each text once; the linear head trains in fp32"))
    run_id = runs.create(
        store,
        dataset_id=version.id,
        base_model=str(base_dir),
        task=version.task,
        params=params.model_dump(),
        plan=asdict(plan),
    )
    _prepared = _Prepared(run_id, data, task, began)
    return run_id


@dataclass(frozen=True)
class _Prepared:
    """A run's data and task as create() loaded and tokenised them, so its first session does not again (a large
    set takes a while), and that session's budget counts from when preparing began."""

    run_id: str
    data: datasets.LoadedDataset
    task: tasks.Task
    began: float  # time.monotonic()


_prepared: _Prepared | None = None  # the last run created in this process, until its first session takes it


def start(
    store: Store,
    *,
    dataset: str,
    base_dir: Path,
    params: TrainParams = DEFAULTS,
    device: str | None = None,
    progress: ProgressFn | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    on_epoch: EpochFn | None = None,
    log: LogFn | None = None,
    group: parallel.Group | None = None,
    on_checkpoint: CheckpointFn | None = None,
) -> RunResult:
    """Plan and run a new fine-tuning job on a dataset version; as the lead of group, when one is given (Ray Train
    started its ranks: the others call assist())."""
    run_id = create(store, dataset=dataset, base_dir=base_dir, params=params, device=device, log=log, group=group)
    return _continue(store, runs.get(store, run_id), progress, should_stop, on_epoch=on_epoch, log=log, group=group,
                     on_checkpoint=on_checkpoint)


def resume(
    store: Store,
    run_id: str,
    *,
    progress: ProgressFn | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    max_threads: int | None = None,
    on_epoch: EpochFn | None = None,
    log: LogFn | None = None,
    group: parallel.Group | None = None,
    on_checkpoint: CheckpointFn | None = None,
) -> RunResult:
    """Continue a run from its last checkpoint (or its start, if it has none) with the plan it started with.

    max_threads caps the plan's CPU threads for this session, so serving keeps cores on a shared box.
    """
    run = runs.get(store, run_id)
    if run.status in ("finished", "discarded"):
        raise JobError(f"run {run.id} has already {'finished' if run.status == 'finished' else 'been discarded'}",
                       hint="start a new run with 'appliance train'")
    runs.set_status(store, run.id, "running", resumed=True)
    return _continue(store, run, progress, should_stop, max_threads, on_epoch, log, group, on_checkpoint)


def adopt_checkpoint(store: Store, run_id: str, saved: bytes) -> int:
    """Make a checkpoint taken by a run elsewhere (a Ray worker that died, on its scratch store) this new run's:
    resume() then continues where that run was. Its step."""
    state = checkpoint.state(saved)
    checkpoint.save(store, run_id, state["position"]["step"], state)
    return int(state["position"]["step"])


def _continue(
    store: Store, run: runs.Run, progress: ProgressFn | None, should_stop: Callable[[], bool],
    max_threads: int | None = None, on_epoch: EpochFn | None = None, log: LogFn | None = None,
    group: parallel.Group | None = None, on_checkpoint: CheckpointFn | None = None,
) -> RunResult:
    global _prepared
    params = TrainParams.stored(run.params)
    if _prepared is not None and _prepared.run_id == run.id:
        data, task, began = _prepared.data, _prepared.task, _prepared.began
    else:
        began = time.monotonic()  # the budget counts this session's loading and tokenising too
        data = datasets.load(store, datasets.get(store, run.dataset_id))
        task = _task(run.task, data, Path(run.base_model), params)
    _prepared = None
    plan = hardware.TrainingPlan(**{**run.plan, "notes": tuple(run.plan["notes"])})
    if max_threads is not None:
        plan = replace(plan, threads=max(1, min(plan.threads, max_threads // plan.workers)))
    saved = checkpoint.latest(store, run.id)
    state = checkpoint.state(saved) if saved else None

    def lead(group: parallel.Group) -> RunResult:
        group.share((run.task, params, plan, saved) if plan.workers > 1 else None)  # bytes: each rank's copy
        return _train(store, run.id, task, data, params, plan, state, progress, should_stop, on_epoch, log, began,
                      group if plan.workers > 1 else parallel.SOLO, on_checkpoint)

    if group is not None:
        return lead(group)
    if plan.workers == 1:
        return lead(parallel.SOLO)
    with parallel.helpers(plan.workers, plan.device, assist, (data, Path(run.base_model))) as spawned:
        return lead(spawned)


def assist(group: parallel.Group, data: datasets.LoadedDataset, base_dir: Path,
           on_checkpoint: CheckpointFn | None = None) -> None:
    """A helper rank of a data-parallel run: the lead's plan, then the same loop on its share of each batch, with
    no store. Nothing, when the lead trains alone after all (fast mode)."""
    shared = group.share(None)
    if shared is None:
        return
    kind, params, plan, saved = shared
    _train(None, "", _task(kind, data, base_dir, params), data, params, plan, checkpoint.state(saved) if saved else None,
           None, lambda: False, group=group, on_checkpoint=on_checkpoint)


def _may_widen(kind: str, params: TrainParams, base_dir: Path) -> bool:
    """Whether the plan may choose a longer window than the default: for a text run on a budget that names none,
    where the base model takes a longer one."""
    return (kind == datasets.TEXT and params.mode != "fast" and not params.lora and params.max_minutes is not None
            and "max_length" not in params.model_fields_set and hardware.max_positions(base_dir) > params.max_length)


def _settle(kind: str, data: datasets.LoadedDataset, base_dir: Path, params: TrainParams, device: str | None,
            say: LogFn) -> TrainParams:
    """Mode auto made full or fast, and the window made longer where long texts need it: both decided on the speed
    of full fine-tuning measured here, on a random sample of the training texts. The log says how long the run will
    take before it starts, what was chosen and why."""
    if kind != datasets.TEXT or params.lora or not data.train:
        return params.full() if params.mode == "auto" else params
    sample = _probe_sample(data, params)
    task = tasks.TextClassification(sample, base_dir, params.max_length, None, params.truncation)
    wanted = _wanted_window(task, sample.texts) if _may_widen(kind, params, base_dir) else None
    if params.mode != "auto" and wanted is None:
        return params
    rate = _full_rate(task, sample, params, device)
    if params.mode == "auto":
        params = _settle_mode(len(data.train), params, rate, say)
    if params.mode == "full" and wanted is not None:
        def rate_at(width: int) -> float:  # a few steps of a smaller batch: a long window's step takes seconds
            small = params.changed(batch_size=WIDE_PROBE_BATCH, max_length=width)
            wide = _probe_sample(data, small)
            return _full_rate(tasks.TextClassification(wide, base_dir, width, None, params.truncation), wide, small,
                              device)

        params = _settle_window(len(data.train), params, rate, *wanted, rate_at, say)
    return params


def _settle_mode(train_size: int, params: TrainParams, rate: float, say: LogFn) -> TrainParams:
    """Mode auto made full or fast: fast where a budget is set and one epoch of full fine-tuning, at rate (examples/s
    measured here), would not fit in it."""
    epoch_s = train_size / rate
    measured = (f"full fine-tuning measured {rate:,.1f} examples/s here: an epoch of {train_size:,} texts takes"
                f" about {duration(epoch_s)}")
    if params.max_minutes is None:
        say(f"{measured}, {params.epochs} epochs about {duration(params.epochs * epoch_s)} with no budget"
            " (--max-minutes bounds it; --mode fast tunes the encoder on pairs of texts and trains a linear head on"
            " its embeddings in a fraction of the time)")
        return params.full()
    budget_s = params.max_minutes * 60
    if epoch_s <= budget_s:
        say(f"{measured}, within the {duration(budget_s)} budget: fine-tuning every weight (--mode fast tunes the"
            " encoder on pairs of texts and trains a linear head on its embeddings in a fraction of the time)")
        return params.full()
    say(f"{measured}, more than the {duration(budget_s)} budget: fast mode instead, the encoder tuned on pairs of"
        " texts and a linear head on its embeddings, in one process (--mode full fine-tunes regardless, over part of"
        " an epoch)")
    return params.changed(mode="fast", workers=None)


def _wanted_window(task: tasks.TextClassification, texts: list[str]) -> tuple[int, list[int]] | None:
    """Where at least WIDEN_SHARE of the texts are longer than the task's window: the shortest multiple of WINDOW_STEP
    tokens that holds WINDOW_COVERS of them whole, up to what the base model takes, and the texts' lengths in tokens
    up to that. None where the window is long enough."""
    longest, window = hardware.max_positions(task.base_dir), task.max_length
    lengths = sorted(len(row) for row in task.words.at(longest).encode(texts)[0])
    if sum(length > window for length in lengths) < WIDEN_SHARE * len(lengths):
        return None
    covers = lengths[min(len(lengths) - 1, math.ceil(WINDOW_COVERS * len(lengths)) - 1)]
    return min(longest, -(-covers // WINDOW_STEP) * WINDOW_STEP), lengths


def _settle_window(train_size: int, params: TrainParams, rate: float, wanted: int, lengths: list[int],
                   rate_at: Callable[[int], float], say: LogFn) -> TrainParams:
    """The wanted window, or the longest step below it, where the whole run at the time estimated for it fits
    FIT_SHARE of the budget; the default one where none does.

    A text's time grows faster than its tokens (attention's cost is quadratic in them: on a 2-core CPU a 512-token
    window took 3.8 times the time of a 128-token one, and 15 times while attention dropout kept it off the fused
    kernel; see TextClassification.build_model). Linear in the tokens is the least it can cost, so the
    steps that fit even so are kept, and the speed is measured (rate_at) at the longest of them; each step's time
    is then read off the curve a.t + b.t^2 (t the mean tokens a text has there) through that measure and the
    default window's (rate), never below linear."""
    window, budget_s = params.max_length, FIT_SHARE * 60 * (params.max_minutes or math.inf)

    def tokens(width: int) -> float:
        return sum(min(length, width) for length in lengths) / len(lengths)

    def run_s(per_text_s: float) -> float:
        return params.epochs * train_size * per_text_s

    def linear_s(width: int) -> float:
        return tokens(width) / tokens(window) / rate

    long_texts = (f"{sum(length > window for length in lengths) / len(lengths):.0%} of the texts sampled are longer"
                  f" than the {window}-token window and {WINDOW_COVERS:.0%} fit in {wanted} tokens, which the base"
                  " model takes")
    keeps = f"the {window}-token window, each long text read {params.truncation}"
    steps = [width for width in range(wanted, window, -WINDOW_STEP) if run_s(linear_s(width)) <= budget_s]
    if not steps:
        say(f"{long_texts}, but {params.epochs} epochs at {wanted} tokens would take at least"
            f" {duration(run_s(linear_s(wanted)))}, more than the {duration(params.max_minutes * 60)} budget holds:"
            f" {keeps} (a longer --max-minutes or fewer --epochs make room for a longer window)")
        return params
    measured_at, measured = steps[0], rate_at(steps[0])
    low, high = tokens(window), tokens(measured_at)
    bend = max(0.0, (rate * low / (measured * high) - 1) / (high - low)) if high > low else 0.0

    def per_text_s(width: int) -> float:
        return linear_s(width) * (1 + bend * (tokens(width) - low))

    fits = [width for width in steps if run_s(per_text_s(width)) <= budget_s]
    speeds = f"measured {measured:,.1f} examples/s at {measured_at} tokens against {rate:,.1f} at {window}"
    if not fits:
        say(f"{long_texts}; {speeds}: no longer window fits the {duration(params.max_minutes * 60)} budget, so"
            f" {keeps} (a longer --max-minutes or fewer --epochs make room for one)")
        return params
    chosen = fits[0]
    say(f"{long_texts}; {speeds}: a {chosen}-token window, {params.epochs} epochs about"
        f" {duration(run_s(per_text_s(chosen)))} (against {duration(run_s(1 / rate))} at {window};"
        f" --max-length {window} keeps the shorter one)")
    return params.changed(max_length=chosen)


def _probe_sample(data: datasets.LoadedDataset, params: TrainParams) -> datasets.LoadedDataset:
    """Random training texts, enough for PROBE_BATCHES steps after one to warm up."""
    picked = random.Random(params.seed).sample(data.train, min(len(data.train), (PROBE_BATCHES + 1) * params.batch_size))
    return replace(data, labels=[data.labels[i] for i in picked], texts=[data.texts[i] for i in picked],
                   train=list(range(len(picked))), validation=[])


def _full_rate(task: tasks.TextClassification, sample: datasets.LoadedDataset, params: TrainParams,
               device: str | None) -> float:
    """Examples/s of full fine-tuning: PROBE_BATCHES steps on the sample's texts (as task reads them), after one to
    warm up, timed as cost per second (Task.cost: padded tokens) and read as examples of the sample at the cost each
    has alone, as an epoch's batches of like lengths pad little: a few random batches can be mostly long texts, or
    short."""
    plan = hardware.plan(hardware.detect(), _request(task, sample, task.base_dir, params.changed(workers=None),
                                                     device))
    torch.set_num_threads(plan.threads)
    on, autocast_dtype = torch.device(plan.device), tasks.autocast_dtype(plan.precision)
    _fit(task, on)
    model = task.build_model().to(on).train()  # as training runs it, dropout and all (loaded, it is in eval mode)
    optimizer = _optimizer(model, params)
    batches = task.batches(sample.train, plan.micro_batch, torch.Generator().manual_seed(params.seed))

    def step(batch: list[int]) -> None:
        inputs = _on(on, task.collate(batch))
        with tasks.autocast(on, autocast_dtype):
            model(**inputs).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if len(batches) > 1:
        step(batches[0])  # the first step allocates and picks kernels
    timed = batches[1 : PROBE_BATCHES + 1] or batches
    started = time.monotonic()
    for batch in timed:
        step(batch)
    if on.type == "cuda":
        torch.cuda.synchronize(on)
    per_example = sum(task.cost([index]) for index in sample.train) / len(sample.train)
    return sum(map(task.cost, timed)) / (time.monotonic() - started) / per_example


def _fit(task: tasks.Task, device: torch.device) -> None:
    """Batches and model shaped for the device: on a GPU, text padded to GPU_PAD_TO, so an epoch has a few shapes, not
    one per length; attention as tasks.attention_kernel picks it for the device and the window."""
    if isinstance(task, tasks.TextClassification):
        task.attention = tasks.attention_kernel(device, task.max_length)
        if device.type == "cuda":
            task.pad_to = GPU_PAD_TO


def _on(device: torch.device, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A batch on the device; to a GPU from pinned memory without waiting, so its copy overlaps the work queued."""
    if device.type != "cuda":
        return batch
    return {name: tensor.pin_memory().to(device, non_blocking=True) for name, tensor in batch.items()}


def _task(kind: str, data: datasets.LoadedDataset, base_dir: Path, params: TrainParams) -> tasks.Task:
    if kind == "image-classification":
        if params.mode == "fast":
            raise JobError("fast mode is for text: an image model trains whole",
                           hint="leave out --mode fast for an image dataset")
        return images.ImageClassification(data, images.Backbone.load(base_dir), params.freeze)
    if params.freeze:
        raise JobError("freeze is for image backbones: a text model fine-tunes whole, or trains LoRA adapters",
                       hint="leave out --freeze for a text dataset (--lora trains a small share of the weights)")
    if params.mode == "fast":
        return fast.FastTextClassification(data, base_dir, params.max_length, params.truncation)
    lora = tasks.LoraSettings(rank=params.lora_rank, alpha=2 * params.lora_rank) if params.lora else None
    return tasks.TextClassification(data, base_dir, params.max_length, lora, params.truncation)


def _request(
    task: tasks.Task, data: datasets.LoadedDataset, base_dir: Path, params: TrainParams, device: str | None,
    placed: parallel.Group | None = None,
) -> hardware.JobRequest:
    if isinstance(task, tasks.TextClassification):
        shape = hardware.model_shape(base_dir)
        if params.lora:
            shape = hardware.ModelShape(**{**asdict(shape), "trainable_parameters": shape.parameters // 50})
        seq_len = max(len(ids) for ids in task.input_ids)
    else:
        assert isinstance(task, images.ImageClassification)
        shape, seq_len = _image_shape(task)
    return hardware.JobRequest(
        shape=shape,
        seq_len=seq_len,
        effective_batch=params.batch_size,
        device=device,
        num_labels=len(data.label_names),
        workers=placed.size if placed else params.workers,
        placed=placed is not None,
    )


def _image_shape(task: images.ImageClassification) -> tuple[hardware.ModelShape, int]:
    """A CNN as the planner's encoder shape: the cells of its last feature map (input/32 a side) as the sequence,
    IMAGE_LAYERS layers as wide as its features. For EfficientNet-Lite0 at 224 that is 86 MiB of activations per
    image in fp32, as measured (88 MiB)."""
    model = task.build_model()
    count = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    features = next(module for module in reversed(list(model.modules())) if isinstance(module, torch.nn.Linear))
    return (hardware.ModelShape(count, trainable, features.in_features, IMAGE_LAYERS, 0, 0, 0),
            max(1, (task.image_size // 32) ** 2))


def _collated(task: tasks.Task, batches: list[list[int]], start: int, group: parallel.Group,
              seed: int) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's share of each batch from start on, collated one ahead of the step that takes it (an image batch
    decodes while the one before trains). Augmentation is drawn from seed and the batch's index, so a resumed epoch
    sees what the uninterrupted one would have."""
    return one_ahead(lambda index: task.collate(batches[index][group.rank::group.size],
                                                augment_seed=seed * 1_000_003 + index), range(start, len(batches)))


def _train(
    store: Store | None,
    run_id: str,
    task: tasks.Task,
    data: datasets.LoadedDataset,
    params: TrainParams,
    plan: hardware.TrainingPlan,
    state: dict[str, Any] | None,
    progress: ProgressFn | None,
    should_stop: Callable[[], bool],
    on_epoch: EpochFn | None = None,
    log: LogFn | None = None,
    began: float | None = None,
    group: parallel.Group = parallel.SOLO,
    on_checkpoint: CheckpointFn | None = None,
) -> RunResult:
    """The loop; began is when this session started preparing (time.monotonic()), which the budget counts too.

    In a data-parallel run every rank runs it on its share of each batch; only the lead (which alone has the store)
    records, and its decisions to stop or to checkpoint hold for all (parallel.Group.agree).
    """
    torch.set_num_threads(plan.threads)
    device = group.device(plan.device)
    _fit(task, device)
    say = log or (lambda _line: None)
    if isinstance(task, fast.FastTextClassification):
        earlier_s = state["position"]["elapsed_s"] if state else 0.0
        start = began - earlier_s if began is not None else time.monotonic()
        restored = state is not None and "encoder" in state  # tuned in an earlier session: the head read its vectors
        if restored:
            task.encoder.load_state_dict(state["encoder"])
        tuned = restored or _contrast(task, data, device, params, plan, start, progress, should_stop, say)
        embedded = _embed(task, data, device, plan, params, start, progress, should_stop, say) if tuned else None
        if embedded is None:
            step = state["position"]["step"] if state else 0
            runs.set_status(store, run_id, "interrupted", step=step)
            return RunResult(run_id, "interrupted", {}, None, step)
        data = replace(data, train=embedded)
    torch.manual_seed(params.seed)
    random.seed(params.seed)
    model = task.build_model().to(device)
    head_fitted_on = 0  # images: an image run's new head is fitted on frozen features first
    if isinstance(task, images.ImageClassification) and state is None:
        if group.leads:  # the others take the lead's weights as DistributedDataParallel starts
            head_fitted_on = _fit_head(task, model, data, device, plan, params, began, progress, should_stop)
        head_fitted_on = group.share(head_fitted_on)
    trained = model if group.size == 1 else torch.nn.parallel.DistributedDataParallel(model,
                                                                                     gradient_as_bucket_view=True)
    optimizer = _optimizer(model, params)
    batches_per_epoch = math.ceil(len(data.train) / (plan.micro_batch * group.size))
    steps_per_epoch = math.ceil(batches_per_epoch / plan.accumulation)
    total_steps = steps_per_epoch * params.epochs
    position = _Position.of(state["position"]) if state is not None else _Position()
    scheduler = _scheduler(optimizer, params, lambda: position.schedule_steps or total_steps)
    head_only = isinstance(task, fast.FastTextClassification)  # its precision was the encoder's: a head trains in fp32
    scaler = torch.amp.GradScaler(device.type, enabled=plan.grad_scaler and not head_only)
    autocast_dtype = None if head_only else tasks.autocast_dtype(plan.precision)
    sample = data.validation_sample(EVAL_SAMPLE, params.seed)
    budget = Budget(params.max_minutes * 60 if params.max_minutes else None, len(sample), steps_per_epoch,
                    params.checkpoint_minutes * 60, params.checkpoint_every,
                    time.monotonic() - began if began is not None else 0.0)
    if isinstance(task, tasks.TextClassification) and state is None:
        say(_window_note(task))
    elif isinstance(task, images.ImageClassification) and state is None:
        say(f"image backbone {task.backbone.name} at {task.image_size}x{task.image_size}{task.frozen_note(model)};"
            " photos decoded and augmented batch by batch")
    if group.size > 1:
        say(f"data-parallel over {group.size} workers: each trains on {plan.micro_batch * plan.accumulation} of every"
            f" batch of {params.batch_size}")

    best_state: dict[str, torch.Tensor] | None = None  # the best weights so far, in host memory: stored once, at the end
    # A fast run's encoder as tuned on pairs, in its checkpoints: tuning again on resume need not give the same one.
    tuned_encoder = {"encoder": task.encoder.state_dict()} if head_only and params.contrastive_pairs else {}
    if state is not None:
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(_with_kernel_of(optimizer, state["optimizer"]))
        except (RuntimeError, ValueError):  # torch's "missing keys" and "different number of parameter groups"
            raise JobError(f"run {run_id}'s checkpoint holds a model or optimizer laid out by an earlier version of"
                           " the appliance, which this one cannot continue", hint=f"start a new run with the same"
                           f" parameters ('appliance runs show {run_id}' lists them)") from None
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        _set_rng(state["helper_rng"][group.rank - 1] if group.rank else state["rng"])
        best_state = state.get("best")  # not in a checkpoint that named a stored best model (position.best_blob)
    writer = checkpoint.Writer(store, run_id) if store is not None else None
    unsettled_loss = torch.zeros((), device=device)  # this epoch's loss not yet in position.loss_sum: read seldom,
    # as reading a GPU's value waits for its queued work

    def settle_loss() -> None:
        position.loss_sum += unsettled_loss.item()
        unsettled_loss.zero_()

    def save_checkpoint() -> None:
        settle_loss()
        rng = group.gather(_get_rng())  # each rank's: dropout draws as many numbers as its share has tokens
        if writer is None:
            if on_checkpoint:
                on_checkpoint(None)
            return
        started = time.monotonic()
        writer.submit(position.step, {
            **checkpoint.snapshot({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                   "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                                   **tuned_encoder}),
            "best": best_state,  # replaced, never changed in place
            "rng": rng[0],
            "helper_rng": rng[1:],
            "position": asdict(position),
        })
        position.checkpoint_s = time.monotonic() - started  # what training waits for: the copy to host memory
        if on_checkpoint:
            on_checkpoint(Checkpointed(run_id, writer.wait()))

    def score(indices: list[int]) -> dict[str, float]:
        started = time.monotonic()
        metrics = evaluate(model, task, indices, plan, device, autocast_dtype, group)
        position.eval_s_per_example = (time.monotonic() - started) / len(indices)
        return metrics

    if head_fitted_on:
        metrics = score(sample)
        position.best, position.best_metrics, position.best_epoch = metrics[params.metric], metrics, 0
        best_state = checkpoint.snapshot(model.state_dict())
        on = "" if len(sample) == len(data.validation) else f" on a sample of {len(sample):,}"
        say(f"the new head fitted on the frozen backbone's features of {head_fitted_on:,} training images: validation"
            f" {_figures(metrics)}{on}; the whole network fine-tunes from there, and keeps this as epoch 0 if no"
            " epoch does better")

    session_start = time.monotonic() - position.elapsed_s
    last_checkpoint = last_report = time.monotonic()
    samples_this_session, train_s_this_session = 0, 0.0
    speed = _Speed()
    estimated_at: int | None = None  # the step after which the run's length was said (once a session, after PROBE_S)
    stopped: runs.Stop = "epochs"
    interrupted = False

    try:
        for epoch in range(position.epoch, params.epochs):
            generator = torch.Generator().manual_seed(params.seed * 1009 + epoch)
            batches = [batch for batch in task.batches(data.train, plan.micro_batch * group.size, generator)
                       if len(batch) >= group.size]  # each rank takes its share: one too small for all is left out
            costs = [task.cost(batch) for batch in batches]
            speed.epoch(sum(costs) / max(1, sum(map(len, batches))))
            model.train()
            step_start, step_cost = time.monotonic(), 0
            for index, collated in enumerate(_collated(task, batches, position.batch, group, params.seed * 1009 + epoch),
                                             start=position.batch):
                inputs = _on(device, collated)
                accumulating = (index + 1) % plan.accumulation and index + 1 < len(batches)
                with trained.no_sync() if accumulating and group.size > 1 else contextlib.nullcontext():
                    with tasks.autocast(device, autocast_dtype):
                        loss = trained(**inputs).loss
                    scaler.scale(loss / plan.accumulation).backward()
                unsettled_loss += loss.detach() * len(batches[index])  # the lead's share stands for the batch
                position.seen += len(batches[index])
                samples_this_session += len(batches[index])
                step_cost += costs[index]
                if accumulating:
                    continue
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), params.max_grad_norm)
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                position.step += 1
                position.batch = index + 1
                now = time.monotonic()
                train_s_this_session += now - step_start
                position.elapsed_s = now - session_start
                rate = speed.step(step_cost, now - step_start)
                if budget.seconds is not None and position.eval_s_per_example is None and sample:
                    score(sample[:4 * plan.micro_batch])  # what an evaluation costs, before the budget counts on it
                if estimated_at is None and (speed.measured_s >= budget.probe_s() or position.batch == len(batches)):
                    estimated_at = position.step
                    say(budget.estimate(position, len(data.train), rate, params.epochs, epoch))
                    if position.schedule_steps is None:
                        position.schedule_steps = budget.steps_within(position, len(data.train), rate,
                                                                      params.epochs, epoch)
                interrupted, out_of_time, due, position.schedule_steps = group.share((
                    should_stop(), budget.must_stop_training(position, rate),
                    now - last_checkpoint >= budget.checkpoint_s_every
                    or bool(params.checkpoint_every and position.step % params.checkpoint_every == 0),
                    position.schedule_steps))
                if progress and (now - last_report >= PROGRESS_EVERY_S or position.batch == len(batches)
                                 or interrupted or out_of_time):
                    last_report = now
                    settle_loss()
                    samples_left = (params.epochs - epoch) * len(data.train) - position.seen
                    progress(Progress("train", epoch + 1, params.epochs, position.step, total_steps,
                                      position.loss_sum / position.seen, rate,
                                      budget.eta(position, samples_left, samples_left / len(data.train), rate)))
                if interrupted or due:
                    save_checkpoint()
                    last_checkpoint = time.monotonic()
                if interrupted:
                    if writer is not None:
                        writer.wait()
                    if store is not None:
                        runs.set_status(store, run_id, "interrupted", step=position.step)
                    return RunResult(run_id, "interrupted", position.best_metrics, None, position.step)
                if out_of_time:
                    stopped = "budget"
                    break
                step_start, step_cost = time.monotonic(), 0

            settle_loss()
            if progress:
                progress(Progress("evaluate", epoch + 1, params.epochs, position.step, total_steps,
                                  position.loss_sum / max(position.seen, 1), 0.0, None))
            metrics = score(sample)
            position.elapsed_s = time.monotonic() - session_start
            row = runs.Epoch(
                epoch + 1,
                position.step,
                position.loss_sum / max(position.seen, 1),
                metrics,
                samples_this_session / max(train_s_this_session, 1e-9),
                position.elapsed_s,
                len(sample),
            )
            if store is not None:
                runs.record_epoch(store, run_id, row)
            improved = position.best is None or metrics[params.metric] > position.best
            if improved:
                position.best, position.best_metrics = metrics[params.metric], metrics
                position.best_epoch = epoch + 1
                best_state = checkpoint.snapshot(model.state_dict())
            if position.trained_best is None or metrics[params.metric] > position.trained_best:
                position.trained_best, position.bad_epochs = metrics[params.metric], 0
            else:
                position.bad_epochs += 1
            say(_epoch_line(row, params, len(data.validation), improved))
            if (epoch == 0 and epoch + 1 < params.epochs and budget.seconds is not None and stopped != "budget"
                    and position.step != estimated_at):
                # A whole epoch and its evaluation measured since the early estimate: the budget's horizon again
                position.schedule_steps = budget.steps_within(position, len(data.train), speed.rate, params.epochs,
                                                              epoch)
                say("after the first epoch, " + budget.estimate(position, len(data.train), speed.rate,
                                                                 params.epochs, epoch))
            position.epoch, position.batch, position.loss_sum, position.seen = epoch + 1, 0, 0.0, 0
            (told_to_end,) = group.agree(on_epoch is not None and on_epoch(row))
            if stopped == "budget":
                break
            if told_to_end and epoch + 1 < params.epochs:
                stopped = "asked"
                break
            if position.bad_epochs >= params.patience and epoch + 1 < params.epochs:
                stopped = "converged"
                break

        evaluated_on = len(sample)
        if evaluated_on < len(data.validation):
            if best_state is None:
                say(f"the final figures stay on the {evaluated_on:,}-example sample: the best epoch's weights were"
                    " stored before this version of the appliance kept them in checkpoints")
            elif group.agree(budget.allows(position, len(data.validation)))[0]:
                model.load_state_dict(best_state)
                position.best_metrics = score(data.validation)
                evaluated_on = len(data.validation)
                say("final, on all validation examples: " + _figures(position.best_metrics))
            else:
                say(f"the final figures stay on the {evaluated_on:,}-example sample: evaluating all"
                    f" {len(data.validation):,} would take about {budget.eval_s(position, len(data.validation)):.0f}"
                    " s more than the budget has left")
        outcome = runs.Outcome(position.best_epoch, position.epoch, stopped, evaluated_on, len(data.validation))
        say(outcome.sentence(params.model_dump()))
        if store is None or writer is None:
            return RunResult(run_id, "finished", position.best_metrics, None, position.step, outcome)
        writer.wait()  # the last checkpoint is committed before the run's end discards it
        stored_before = position.best_blob
        if best_state is not None:
            model.load_state_dict(best_state)
            position.best_blob = blobs.put(store, task.bundle(model))
        runs.finish(store, run_id, position.best_blob, position.best_metrics, outcome)
        runs.drop_checkpoint(store, run_id)
        if stored_before and stored_before != position.best_blob:
            blobs.delete(store, stored_before)
        return RunResult(run_id, "finished", position.best_metrics, position.best_blob, position.step, outcome)
    finally:
        if writer is not None:
            writer.close()


def _contrast(task: fast.FastTextClassification, data: datasets.LoadedDataset, device: torch.device,
              params: TrainParams, plan: hardware.TrainingPlan, began: float, progress: ProgressFn | None,
              should_stop: Callable[[], bool], say: LogFn) -> bool:
    """Fast mode's first phase: the encoder tuned on params.contrastive_pairs pairs of training texts, in the plan's
    precision. On a budget (counted from began) it takes CONTRAST_SHARE of it, or more: up to EMBED_SHARE less the
    embedding of every text, as estimated from its own pace (_tuning_s), so a small set's run uses the time it
    was given and a big one's keeps it for embedding. False when told to stop."""
    if not params.contrastive_pairs:
        return True
    order = _shuffled(data.train, params.seed)
    tuning = fast.pairs(task.targets.tolist(), order, params.contrastive_pairs, params.seed)
    texts, started = len(data.validation) + len(data.train), time.monotonic()
    allowed_s = partial(_tuning_s, params.max_minutes * 60, started - began, texts) if params.max_minutes else None
    if not tuning or allowed_s is not None and allowed_s(math.inf) <= 0:
        say("fast mode: no time left in the budget to tune the encoder on pairs; it embeds as it is")
        return True
    stopped = False

    def report(done: int, total: int, rate: float) -> bool:
        nonlocal stopped
        if progress:
            progress(Progress("contrast", 0, params.epochs, done, total, 0.0, rate, (total - done) / rate))
        stopped = should_stop()
        return not stopped

    torch.manual_seed(params.seed)  # dropout's draws
    done = task.contrast(device, tuning, tasks.autocast_dtype(plan.precision), params.seed, allowed_s, report)
    if stopped:
        return False
    said = (f"fast mode: the encoder tuned on {done:,} pairs of training texts in {duration(time.monotonic() - started)}"
            " (a text and one of its label drawn together, one of another label apart)")
    say(said + ("" if done == len(tuning) else f", {len(tuning):,} asked: the budget held no more beside embedding"
                f" {texts:,} texts"))
    return True


def _tuning_s(budget_s: float, before_s: float, texts: int, pairs_per_s: float) -> float:
    """The seconds tuning on pairs may take, from its start (before_s into the budget), at a pace of pairs_per_s:
    CONTRAST_SHARE of the budget, or up to EMBED_SHARE of it less the embedding of the texts, at the longest that
    pace suggests."""
    embedding_s = EMBED_SETUP_S + texts / (EMBED_PACE * pairs_per_s)
    return max(budget_s * CONTRAST_SHARE, budget_s * EMBED_SHARE - embedding_s) - before_s


def _embed(task: fast.FastTextClassification, data: datasets.LoadedDataset, device: torch.device,
           plan: hardware.TrainingPlan, params: TrainParams, began: float, progress: ProgressFn | None,
           should_stop: Callable[[], bool], say: LogFn) -> list[int] | None:
    """Fast mode's second phase: the validation texts, then the training texts in a seeded random order, through the
    encoder once. The training examples it embedded (all, unless EMBED_SHARE of the budget, counted from
    began, ran out first: then a random share of them); None when told to stop (a resumed run embeds again)."""
    order = _shuffled(data.train, params.seed)
    limit_s = params.max_minutes * 60 * EMBED_SHARE if params.max_minutes else None
    rate, stopped = 0.0, False

    def report(done: int, total: int, measured: float) -> bool:
        nonlocal rate, stopped
        rate = measured
        if progress:
            progress(Progress("embed", 0, params.epochs, done, total, 0.0, rate, (total - done) / rate))
        stopped = should_stop()
        out_of_time = limit_s is not None and done > len(data.validation) and time.monotonic() - began >= limit_s
        return not (stopped or out_of_time)

    started = time.monotonic()
    done = task.embed(device, data.validation + order, report, tasks.autocast_dtype(plan.precision))
    if stopped:
        return None
    kept = sorted(order[: max(0, done - len(data.validation))])
    said = (f"fast mode: embedded {done:,} texts in {duration(time.monotonic() - started)} ({rate:,.0f}/s once the"
            " encoder was compiled); ")
    if len(kept) < len(data.train):
        say(said + f"the budget covered {len(kept):,} of the {len(data.train):,} training texts, a random share,"
                   " and the classifier head trains on them (a longer --max-minutes covers more)")
    else:
        say(said + "training the classifier head on them")
    return kept


def _fit_head(task: images.ImageClassification, model: torch.nn.Module, data: datasets.LoadedDataset,
              device: torch.device, plan: hardware.TrainingPlan, params: TrainParams, began: float | None,
              progress: ProgressFn | None, should_stop: Callable[[], bool]) -> int:
    """An image run's first phase (train/images.py): the new head fitted on frozen features of the training images,
    in a seeded random order, until they are all read, the run is told to stop, or HEAD_FIT_SHARE of its budget is
    spent. How many images it was fitted on."""
    order = _shuffled(data.train, params.seed)
    limit_s = params.max_minutes * 60 * HEAD_FIT_SHARE if params.max_minutes else None
    started = began if began is not None else time.monotonic()

    def report(done: int, total: int, rate: float) -> bool:
        if progress:
            progress(Progress("fit-head", 0, params.epochs, done, total, 0.0, rate, (total - done) / rate))
        return not (should_stop() or limit_s is not None and time.monotonic() - started >= limit_s)

    return task.fit_head(model, order, device, report, tasks.autocast_dtype(plan.precision))


def _shuffled(indices: list[int], seed: int) -> list[int]:
    """The examples in a seeded random order: what a first phase that may be cut short (fast mode's embedding, an
    image run's head fit) reads, so the share it reaches is a random one, the same on every run."""
    return [indices[i] for i in torch.randperm(len(indices), generator=torch.Generator().manual_seed(seed)).tolist()]


class _Speed:
    """Training's speed this session, said in examples/s of the epoch at hand. It is measured as cost per second
    (Task.cost: a text batch's padded tokens), for a run's batches differ tenfold in cost: counted in examples,
    the first ten seconds of a run on real texts, which happened to draw many long ones, said its epochs would take
    1.5 times what they took. The session's first optimizer step is left out where later ones were measured: that
    step pays once for what the rest reuse (on a GPU, loading the kernels: 10 s of an image run on an H100, whose
    next steps took 70 ms), and counted in, it made an early estimate 40 times too long."""

    def __init__(self) -> None:
        self.first = (0, 0.0)  # cost and seconds of the session's first step
        self.cost, self.measured_s = 0, 0.0  # of the steps after it
        self.per_example = 1.0  # the epoch's cost per example

    def epoch(self, per_example: float) -> None:
        """An epoch begins whose examples cost this much each, on average over its batches."""
        self.per_example = per_example

    def step(self, cost: int, seconds: float) -> float:
        """Count one optimizer step; the rate so far."""
        if self.first == (0, 0.0):
            self.first = (cost, seconds)
        else:
            self.cost, self.measured_s = self.cost + cost, self.measured_s + seconds
        return self.rate

    @property
    def rate(self) -> float:
        per_s = self.cost / self.measured_s if self.measured_s > 0 else self.first[0] / max(self.first[1], 1e-9)
        return per_s / self.per_example


@dataclass(frozen=True)
class Budget:
    """max_minutes for the whole run, from the loading of its data: training stops early enough that its last
    evaluation fits too. It also makes the ETA and the early estimate, which count the evaluations and checkpoints
    left at the times last measured (evaluation, until measured, at twice training's samples/s)."""

    seconds: float | None
    sample: int  # examples in each epoch's evaluation
    steps_per_epoch: int
    checkpoint_s_every: float  # seconds of training between checkpoints
    checkpoint_every: int | None  # and optimizer steps, if set
    prepared_s: float = 0.0  # this session's loading, tokenising and model building, before its first step

    def used(self, position: _Position) -> float:
        return position.elapsed_s + self.prepared_s

    def eval_s(self, position: _Position, examples: int, train_rate: float | None = None) -> float:
        if position.eval_s_per_example is not None:
            return examples * position.eval_s_per_example
        return examples / (2 * train_rate) if train_rate else 0.0

    def must_stop_training(self, position: _Position, train_rate: float) -> bool:
        if self.seconds is None:
            return False
        return self.used(position) + self.eval_s(position, self.sample, train_rate) >= self.seconds

    def allows(self, position: _Position, examples: int) -> bool:
        return self.seconds is None or self.used(position) + self.eval_s(position, examples) <= self.seconds

    def probe_s(self) -> float:
        """Training measured before the run's length is said: PROBE_S, or a tenth of a shorter budget."""
        return PROBE_S if self.seconds is None else min(PROBE_S, self.seconds / 10)

    def left_s(self, position: _Position, samples_left: int, epochs_left: float, train_rate: float) -> float:
        """Seconds of work left without a budget: training, and each epoch's evaluation and the checkpoints."""
        evaluations = math.ceil(epochs_left - 1e-9)
        train_s = samples_left / train_rate
        checkpoints = int(train_s // self.checkpoint_s_every)
        if self.checkpoint_every:
            checkpoints += int(epochs_left * self.steps_per_epoch) // self.checkpoint_every
        return (train_s + evaluations * self.eval_s(position, self.sample, train_rate)
                + checkpoints * (position.checkpoint_s or 0.0))

    def eta(self, position: _Position, samples_left: int, epochs_left: float, train_rate: float) -> float:
        """Seconds to the run's end: the work left, and never more than the budget's rest."""
        left = self.left_s(position, samples_left, epochs_left, train_rate)
        return left if self.seconds is None else max(0.0, min(left, self.seconds - self.used(position)))

    def estimate(self, position: _Position, train_size: int, train_rate: float, epochs: int, epoch: int) -> str:
        """The run's length at the rates measured so far, and where the budget ends it when it is shorter."""
        done = epoch + position.seen / train_size
        said = (f"measured {train_rate:,.1f} examples/s: an epoch of {train_size:,} takes about"
                f" {duration(train_size / train_rate)}, the run to its last epoch with evaluations about"
                f" {duration(self._whole_s(position, train_size, train_rate, epochs, done))}")
        reached = self._reached(position, train_size, train_rate, epochs, done)
        if reached is None:
            return said + (f", within its {duration(self.seconds)} budget" if self.seconds else "")
        return (said + f"; the {duration(self.seconds)} budget stops it after about {reached:.1f} epochs, keeping the"
                " best model by then, its learning rate scheduled to end there (fewer --epochs, a sample of the data"
                " or a longer --max-minutes change that)")

    def steps_within(self, position: _Position, train_size: int, train_rate: float, epochs: int, epoch: int
                     ) -> int | None:
        """The optimizer steps the budget holds, where it ends the run before its last epoch: the learning rate's
        schedule is fitted to them, as training to a budget does best when its rate decays to the budget's end (Li,
        Yumer and Ramanan, "Budgeted Training", ICLR 2020). None where the run ends first."""
        reached = self._reached(position, train_size, train_rate, epochs, epoch + position.seen / train_size)
        return None if reached is None else max(position.step + 1, round(reached * self.steps_per_epoch))

    def _whole_s(self, position: _Position, train_size: int, train_rate: float, epochs: int, done: float) -> float:
        return self.used(position) + self.left_s(position, round((epochs - done) * train_size), epochs - done,
                                                 train_rate)

    def _reached(self, position: _Position, train_size: int, train_rate: float, epochs: int, done: float
                 ) -> float | None:
        """Epochs done when the budget ends the run; None where it does not."""
        if self.seconds is None or self._whole_s(position, train_size, train_rate, epochs, done) <= self.seconds:
            return None
        return done + (self.seconds - self.used(position)) / self.left_s(position, train_size, 1.0, train_rate)


def _window_note(task: tasks.TextClassification) -> str:
    """How many texts the token window cuts and how it reads them, and how long a window the base model takes."""
    cut, count, window = task.texts_cut, len(task.input_ids), task.max_length
    if not cut:
        return f"every text fits the {window}-token window"
    other = "head" if task.words.truncation == "head+tail" else "head+tail"
    note = (f"{cut:,} of {count:,} texts ({cut / count:.0%}) are longer than the {window}-token window: the model reads"
            f" {task.words.describe()} of each ({task.words.truncation}; --truncation {other} for the other way)")
    longest = hardware.max_positions(task.base_dir)
    if longest > window:
        note += f"; the base model takes up to {longest} (--max-length), at a cost in time"
    return note


def _epoch_line(row: runs.Epoch, params: TrainParams, validation: int, improved: bool) -> str:
    on = "" if row.evaluated_on == validation else f" on a sample of {row.evaluated_on:,} of {validation:,}"
    return (f"epoch {row.epoch}/{params.epochs}: validation {_figures(row.metrics)}{on}"
            f"{'; best so far' if improved else ''}")


def _figures(metrics: dict[str, float]) -> str:
    return (f"macro-F1 {metrics['macro_f1']:.4f}, accuracy {metrics['accuracy']:.4f}, loss {metrics['loss']:.4f}")


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    task: tasks.Task,
    indices: list[int],
    plan: hardware.TrainingPlan,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
    group: parallel.Group = parallel.SOLO,
) -> dict[str, float]:
    """Validation loss, accuracy and macro-F1, in a fixed order so results are repeatable; each rank of a
    data-parallel run evaluates its share."""
    model.eval()
    losses, predicted, labels = [], [], []  # on the device, read once at the end
    batches = task.batches(indices[group.rank::group.size], plan.micro_batch * 2, torch.Generator().manual_seed(0))
    for batch, collated in zip(batches, one_ahead(task.collate, batches), strict=True):
        inputs = _on(device, collated)
        with tasks.autocast(device, autocast_dtype):
            output = model(**inputs)
        losses.append(output.loss.float() * len(batch))
        predicted.append(output.logits.argmax(dim=-1))
        labels.append(inputs["labels"])
    model.train()
    loss_sum = torch.stack(losses).sum().item() if losses else 0.0
    predictions, targets = (torch.cat(predicted).tolist(), torch.cat(labels).tolist()) if losses else ([], [])
    parts = group.gather((loss_sum, predictions, targets))
    loss_sum = sum(part[0] for part in parts)
    predictions, targets = [p for part in parts for p in part[1]], [t for part in parts for t in part[2]]
    return {"loss": loss_sum / len(indices), **scoring.metrics(predictions, targets, len(task.label_names))}


def _optimizer(model: torch.nn.Module, params: TrainParams) -> torch.optim.AdamW:
    """AdamW (the fused kernel, tasks.adamw) without weight decay on biases and norms, as is usual for transformers."""
    decay, no_decay = [], []
    for parameter in model.parameters():
        if parameter.requires_grad:
            (no_decay if parameter.ndim < 2 else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": params.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return tasks.adamw(groups, params.learning_rate)


def _with_kernel_of(optimizer: torch.optim.Optimizer, saved: dict) -> dict:
    """A saved optimizer state with this optimizer's kernel (fused, foreach): that says how an update runs, not what
    it learnt, and a checkpoint written before AdamW was fused on a CPU would otherwise bring back the slower one."""
    kernel = {key: optimizer.defaults[key] for key in ("fused", "foreach")}
    return {**saved, "param_groups": [{**group, **kernel} for group in saved["param_groups"]]}


def _scheduler(optimizer: torch.optim.Optimizer, params: TrainParams, horizon: Callable[[], int]
               ) -> torch.optim.lr_scheduler.LambdaLR:
    """Warm-up, then linear or cosine decay to zero at horizon() steps: the run's last, or the budget's."""

    def factor(step: int) -> float:
        total_steps = horizon()
        warmup = max(1, int(total_steps * params.warmup_ratio))
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        if params.schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        return max(0.0, 1 - progress)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _get_rng() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
