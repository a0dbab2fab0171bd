"""The training loop: one function from a dataset version and a base model to a model blob.

It follows the hardware plan (device, precision, threads, micro-batch and gradient
accumulation), uses AdamW with warm-up and linear or cosine decay, clips gradients,
evaluates every epoch, stops early when the validation metric stops improving, and
checkpoints every N optimizer steps and at each epoch end. A run cut short (SIGKILL,
SIGTERM, the machine going down) continues from its checkpoint with the same data
order and random state, so it ends where an uninterrupted run would have.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from appliance.core import hardware, scoring
from appliance.core.errors import JobError
from appliance.data import datasets
from appliance.store import Store, blobs
from appliance.train import checkpoint, runs, tasks
from appliance.train.params import TrainParams


@dataclass(frozen=True)
class Progress:
    """What a progress bar or the TUI shows while a run trains."""

    phase: str  # train | evaluate
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
    stopped_early: bool

    @classmethod
    def of(cls, store: Store, run_id: str) -> RunResult:
        """A run as its records tell it: one trained earlier, or on the Ray cluster."""
        run, history = runs.get(store, run_id), runs.epochs(store, run_id)
        return cls(run_id, run.status, run.metrics or {}, run.model_blob, history[-1].step if history else 0, False)


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
    best_blob: str | None = None
    bad_epochs: int = 0
    elapsed_s: float = 0.0


ProgressFn = Callable[[Progress], None]
DEFAULTS = TrainParams()  # frozen: one instance is every call's default
EpochFn = Callable[[runs.Epoch], bool]  # after each epoch's evaluation; True ends the run there (a pruned trial)


def create(
    store: Store,
    *,
    dataset: str,
    base_dir: Path,
    params: TrainParams = DEFAULTS,
    device: str | None = None,
) -> str:
    """Plan a new run on a dataset version and record it, untrained: a job keeps the id before the first step."""
    version = datasets.get(store, dataset)
    data = datasets.load(store, version)
    task = _task(version.task, data, base_dir, params)
    plan = hardware.plan(hardware.detect(), _request(task, data, base_dir, params, device))
    return runs.create(
        store,
        dataset_id=version.id,
        base_model=str(base_dir) if isinstance(task, tasks.TextClassification) else "small-cnn",
        task=version.task,
        params=params.model_dump(),
        plan=asdict(plan),
    )


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
) -> RunResult:
    """Plan and run a new fine-tuning job on a dataset version."""
    run_id = create(store, dataset=dataset, base_dir=base_dir, params=params, device=device)
    return _continue(store, runs.get(store, run_id), progress, should_stop, on_epoch=on_epoch)


def resume(
    store: Store,
    run_id: str,
    *,
    progress: ProgressFn | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    max_threads: int | None = None,
    on_epoch: EpochFn | None = None,
) -> RunResult:
    """Continue a run from its last checkpoint (or its start, if it has none) with the plan it started with.

    max_threads caps the plan's CPU threads for this session, so serving keeps cores on a shared box.
    """
    run = runs.get(store, run_id)
    if run.status == "finished":
        raise JobError(f"run {run.id} has already finished", hint="start a new run with 'appliance train'")
    runs.set_status(store, run.id, "running", resumed=True)
    return _continue(store, run, progress, should_stop, max_threads, on_epoch)


def _continue(
    store: Store, run: runs.Run, progress: ProgressFn | None, should_stop: Callable[[], bool],
    max_threads: int | None = None, on_epoch: EpochFn | None = None,
) -> RunResult:
    params = TrainParams.parse(run.params)
    data = datasets.load(store, datasets.get(store, run.dataset_id))
    task = _task(run.task, data, Path(run.base_model), params)
    plan = hardware.TrainingPlan(**{**run.plan, "notes": tuple(run.plan["notes"])})
    if max_threads is not None:
        plan = replace(plan, threads=max(1, min(plan.threads, max_threads)))
    return _train(store, run.id, task, data, params, plan, checkpoint.latest(store, run.id), progress, should_stop,
                  on_epoch)


def _task(kind: str, data: datasets.LoadedDataset, base_dir: Path, params: TrainParams) -> tasks.Task:
    if kind == "image-classification":
        return tasks.ImageClassification(data)
    lora = tasks.LoraSettings(rank=params.lora_rank, alpha=2 * params.lora_rank) if params.lora else None
    return tasks.TextClassification(data, base_dir, params.max_length, lora)


def _request(
    task: tasks.Task, data: datasets.LoadedDataset, base_dir: Path, params: TrainParams, device: str | None
) -> hardware.JobRequest:
    if isinstance(task, tasks.TextClassification):
        shape = hardware.model_shape(base_dir)
        if params.lora:
            shape = hardware.ModelShape(**{**asdict(shape), "trainable_parameters": shape.parameters // 50})
        seq_len = max(len(ids) for ids in task.input_ids)
    else:
        # A small CNN: modelled as a tiny encoder over the image's 8x8 patches.
        count = sum(p.numel() for p in task.build_model().parameters())
        shape = hardware.ModelShape(count, count, 128, 3, 1, 256, 0)
        seq_len = (task.image_size // 8) ** 2
    return hardware.JobRequest(
        shape=shape,
        seq_len=seq_len,
        effective_batch=params.batch_size,
        device=device,
        num_labels=len(data.label_names),
    )


def _train(
    store: Store,
    run_id: str,
    task: tasks.Task,
    data: datasets.LoadedDataset,
    params: TrainParams,
    plan: hardware.TrainingPlan,
    state: dict[str, Any] | None,
    progress: ProgressFn | None,
    should_stop: Callable[[], bool],
    on_epoch: EpochFn | None = None,
) -> RunResult:
    torch.set_num_threads(plan.threads)
    device = torch.device(plan.device)
    torch.manual_seed(params.seed)
    random.seed(params.seed)
    model = task.build_model().to(device)
    optimizer = _optimizer(model, params)
    batches_per_epoch = math.ceil(len(data.train) / plan.micro_batch)
    steps_per_epoch = math.ceil(batches_per_epoch / plan.accumulation)
    total_steps = steps_per_epoch * params.epochs
    scheduler = _scheduler(optimizer, params, total_steps)
    scaler = torch.amp.GradScaler(device.type, enabled=plan.grad_scaler)
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan.precision)

    position = _Position()
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        _set_rng(state["rng"])
        position = _Position(**state["position"])

    def save_checkpoint() -> None:
        checkpoint.save(
            store,
            run_id,
            position.step,
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict(),
                "rng": _get_rng(),
                "position": asdict(position),
            },
        )

    session_start = time.monotonic() - position.elapsed_s
    samples_this_session, clock = 0, time.monotonic()
    stopped_early = interrupted = out_of_time = False

    for epoch in range(position.epoch, params.epochs):
        generator = torch.Generator().manual_seed(params.seed * 1009 + epoch)
        batches = task.batches(data.train, plan.micro_batch, generator)
        model.train()
        for index in range(position.batch, len(batches)):
            inputs = {name: tensor.to(device) for name, tensor in task.collate(batches[index]).items()}
            with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
                loss = model(**inputs).loss
            scaler.scale(loss / plan.accumulation).backward()
            position.loss_sum += loss.item() * len(batches[index])
            position.seen += len(batches[index])
            samples_this_session += len(batches[index])
            if (index + 1) % plan.accumulation and index + 1 < len(batches):
                continue
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), params.max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            position.step += 1
            position.batch = index + 1
            position.elapsed_s = time.monotonic() - session_start
            rate = samples_this_session / max(time.monotonic() - clock, 1e-9)
            if progress:
                left = (total_steps - position.step) * plan.micro_batch * plan.accumulation / rate if rate else None
                progress(
                    Progress("train", epoch + 1, params.epochs, position.step, total_steps,
                             position.loss_sum / position.seen, rate, left)
                )
            interrupted = should_stop()
            out_of_time = params.max_minutes is not None and position.elapsed_s > params.max_minutes * 60
            if interrupted or position.step % params.checkpoint_every == 0:
                save_checkpoint()
            if interrupted:
                runs.set_status(store, run_id, "interrupted", step=position.step)
                return RunResult(run_id, "interrupted", position.best_metrics, None, position.step, False)
            if out_of_time:
                break

        if progress:
            progress(Progress("evaluate", epoch + 1, params.epochs, position.step, total_steps,
                              position.loss_sum / max(position.seen, 1), 0.0, None))
        metrics = evaluate(model, task, data.validation, plan, device, autocast_dtype)
        position.elapsed_s = time.monotonic() - session_start
        row = runs.Epoch(
            epoch + 1,
            position.step,
            position.loss_sum / max(position.seen, 1),
            metrics,
            samples_this_session / max(time.monotonic() - clock, 1e-9),
            position.elapsed_s,
        )
        runs.record_epoch(store, run_id, row)
        previous_best = position.best_blob
        if position.best is None or metrics[params.metric] > position.best:
            position.best, position.best_metrics, position.bad_epochs = metrics[params.metric], metrics, 0
            position.best_blob = blobs.put(store, task.bundle(model))
        else:
            position.bad_epochs += 1
        position.epoch, position.batch, position.loss_sum, position.seen = epoch + 1, 0, 0.0, 0
        save_checkpoint()
        if previous_best and previous_best != position.best_blob:
            blobs.delete(store, previous_best)  # only now: the old checkpoint no longer needs it
        told_to_end = on_epoch is not None and on_epoch(row)
        if (position.bad_epochs >= params.patience or told_to_end) and epoch + 1 < params.epochs:
            stopped_early = True
            break
        if out_of_time:
            break

    runs.finish(store, run_id, position.best_blob, position.best_metrics)
    checkpoint.discard(store, run_id)
    return RunResult(run_id, "finished", position.best_metrics, position.best_blob, position.step, stopped_early)


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    task: tasks.Task,
    indices: list[int],
    plan: hardware.TrainingPlan,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
) -> dict[str, float]:
    """Validation loss, accuracy and macro-F1, in a fixed order so results are repeatable."""
    model.eval()
    predictions, targets, loss_sum = [], [], 0.0
    for batch in task.batches(indices, plan.micro_batch * 2, torch.Generator().manual_seed(0)):
        inputs = {name: tensor.to(device) for name, tensor in task.collate(batch).items()}
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            output = model(**inputs)
        loss_sum += output.loss.item() * len(batch)
        predictions += output.logits.argmax(dim=-1).tolist()
        targets += inputs["labels"].tolist()
    model.train()
    return {"loss": loss_sum / len(indices), **scoring.metrics(predictions, targets, len(task.label_names))}


def _optimizer(model: torch.nn.Module, params: TrainParams) -> torch.optim.AdamW:
    """AdamW without weight decay on biases and norms, as is usual for transformers."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            (no_decay if parameter.ndim < 2 else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": params.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=params.learning_rate)


def _scheduler(optimizer: torch.optim.Optimizer, params: TrainParams, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    warmup = max(1, int(total_steps * params.warmup_ratio))

    def factor(step: int) -> float:
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
