"""Hyperparameter search against the default configuration and a random search, at one wall-clock budget.

Three contenders get the same dataset (the bundled sample unless --dataset), the same
base model (the bundled all-MiniLM-L6-v2 unless --base), the same seed and split, and the
same budget of wall-clock time (--budget, default 30m):

- default: one training run with the engine's TrainParams defaults, cut at the budget
  (max_minutes) like any run; what `appliance train` gives without tuning;
- random: `appliance tune`'s search with a random sampler (pruning on), the baseline every
  tuning paper holds a sampler against;
- tpe: `appliance tune` as shipped (TPE, successive-halving pruning, the default space).

Each contender's figure is the best validation macro-F1 it reached (what it would keep).
Wall time on a shared machine is noisy and a search is seeded, not deterministic in its
timing: run it twice before trusting a small difference.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from appliance.core import config  # after HF_HUB_OFFLINE: transformers reads it on import
from appliance.data import datasets
from appliance.store import lifecycle
from appliance.train import engine, space, tune
from appliance.train.params import TrainParams

SAMPLE = Path(__file__).resolve().parent.parent / "appliance" / "samples" / "support_tickets.csv"
METRIC = "macro_f1"
TARGET_VS_DEFAULT = 1.0  # the tuned model is at least as good as the defaults
TARGET_VS_RANDOM = 1.0  # and at least as good as a random search of the same budget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, default=SAMPLE, help="CSV or JSONL of text,label (default: the sample)")
    parser.add_argument("--base", type=Path, help="base model directory (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--budget", type=float, default=30.0, help="minutes for each contender")
    parser.add_argument("--space", type=Path, help="TOML narrowing the default space, as for 'appliance tune'")
    args = parser.parse_args()

    state_dir = Path(tempfile.mkdtemp(prefix="appliance-bench-tune-"))
    try:
        os.environ["APPLIANCE_STATE_DIR"] = str(state_dir)
        with lifecycle.init(config.load()) as store:
            base = args.base or store.settings.base_model
            datasets.import_file(store, args.dataset, name="bench")
            budget_s = args.budget * 60
            narrowing = space.read(args.space) if args.space else {}
            rows: dict[str, tuple[float, float, str]] = {}
            began = time.monotonic()
            default = engine.start(store, dataset="bench", base_dir=base,
                                   params=TrainParams(max_minutes=args.budget))
            rows["default"] = (default.metrics[METRIC], time.monotonic() - began, "1 run")
            for sampler in ("random", "tpe"):
                began = time.monotonic()
                result = tune.start(store, tune.Request(dataset="bench", base_dir=base, budget_s=budget_s,
                                                        narrowing=narrowing, sampler=sampler))
                rows[sampler] = (result.best_value, time.monotonic() - began,
                                 f"{result.trials} trials, {result.pruned} pruned")
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)

    print(f"dataset {args.dataset.name}, base {Path(base).name}, budget {args.budget:g} min each, metric {METRIC}")
    print(f"{'contender':<10} {METRIC:>9} {'wall s':>8}  what")
    for name, (value, seconds, what) in rows.items():
        print(f"{name:<10} {value:>9.4f} {seconds:>8.0f}  {what}")
    vs_default = rows["tpe"][0] / rows["default"][0] if rows["default"][0] else 0.0
    vs_random = rows["tpe"][0] / rows["random"][0] if rows["random"][0] else 0.0
    print(f"tuned / default: {vs_default:.3f}x (target {TARGET_VS_DEFAULT:.2f}x)")
    print(f"tuned / random search: {vs_random:.3f}x (target {TARGET_VS_RANDOM:.2f}x)")
    print(json.dumps({"tuned_vs_default": round(vs_default, 3), "tuned_vs_default_target": TARGET_VS_DEFAULT,
                      "tuned_vs_random": round(vs_random, 3), "tuned_vs_random_target": TARGET_VS_RANDOM}))


if __name__ == "__main__":
    main()
