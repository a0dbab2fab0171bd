"""What a hyperparameter search may try: a default space per task, narrowed by a small TOML file.

A space maps a TrainParams field to one of three things, written the same way in TOML:

    learning_rate = { low = 1e-4, high = 1e-3, log = true }   # a range (ints stay ints)
    batch_size = [16, 32]                                     # choices
    lora = false                                              # fixed: not searched

Fields left out keep the task's default below. The defaults are wide enough for a small
encoder (all-MiniLM-L6-v2 and its kind) on a few hundred to a few thousand labelled rows,
and every value in them fits the hardware plan on a CPU-only box with 8 GB of RAM.
Kept free of torch and Optuna, so the CLI checks a file before anything starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from appliance.core.config import read_toml
from appliance.core.errors import ConfigError
from appliance.core.schema import problems
from appliance.train.params import TrainParams

Space = dict[str, Any]  # field -> {"low", "high", "log"} | list of choices | a fixed value

TEXT: Space = {
    "learning_rate": {"low": 1e-5, "high": 3e-4, "log": True},
    "epochs": {"low": 2, "high": 8},
    "batch_size": [8, 16, 32, 64],
    "warmup_ratio": {"low": 0.0, "high": 0.2},
    "weight_decay": {"low": 0.0, "high": 0.1},
    "lora": [False, True],
    "lora_rank": [4, 8, 16],  # searched only in trials that train LoRA adapters
    "max_length": [64, 128, 256],  # capped at what the base model can take
    "truncation": ["head", "head+tail"],  # how a text longer than max_length is read
}
IMAGE: Space = {  # fine-tuning a pretrained CNN whose head was fitted first (images.py)
    "learning_rate": {"low": 5e-5, "high": 2e-3, "log": True},
    "epochs": {"low": 3, "high": 15},
    "batch_size": [8, 16, 32],
    "warmup_ratio": {"low": 0.0, "high": 0.2},
    "weight_decay": {"low": 0.0, "high": 0.1},
    "freeze": [0.0, 0.25, 0.5, 0.75],  # the share of the backbone's blocks kept as pretrained
}
SEARCHABLE = {"learning_rate", "epochs", "batch_size", "warmup_ratio", "weight_decay", "lora", "lora_rank",
              "max_length", "truncation", "schedule", "max_grad_norm", "freeze"}
_TYPES = {name: type(getattr(TrainParams(), name)) for name in SEARCHABLE}


def default(task: str) -> Space:
    """The documented default space of a task (a copy: callers may change it)."""
    return dict(IMAGE if task == "image-classification" else TEXT)


def narrowed(task: str, overrides: dict[str, Any], source: str = "the search space") -> Space:
    """The task's default space with the user's entries in place of its own, each checked."""
    space = default(task)
    for name, entry in overrides.items():
        space[name] = check(name, entry, source)
    return space


def read(path: Path) -> dict[str, Any]:
    """The entries of a TOML file narrowing a space, each checked; the task's default fills in the rest."""
    overrides = read_toml(path, "the search space", hint="see 'appliance tune --help' for the format")
    return {name: check(name, entry, str(path)) for name, entry in overrides.items()}


def check(name: str, entry: Any, source: str) -> Any:
    """One entry of a space, as written by a user: a range, choices or a fixed value of the field's type."""
    hint = 'write a range { low = 1e-4, high = 1e-3 }, choices [16, 32] or one value'
    if name not in SEARCHABLE:
        raise ConfigError(f"{source}: {name!r} cannot be searched",
                          hint=f"searchable: {', '.join(sorted(SEARCHABLE))}")
    kind = _TYPES[name]
    if isinstance(entry, dict):
        if set(entry) - {"low", "high", "log"} or not {"low", "high"} <= set(entry):
            raise ConfigError(f"{source}: the range for {name} needs low and high (and optionally log)", hint=hint)
        low, high = (_value(name, entry[key], kind, source) for key in ("low", "high"))
        if kind not in (int, float) or not low <= high:
            raise ConfigError(f"{source}: {name} has the range {low}..{high}", hint="a range needs numbers, low <= high")
        if entry.get("log") and low <= 0:
            raise ConfigError(f"{source}: a log range for {name} must start above 0", hint=hint)
        return {"low": low, "high": high, "log": bool(entry.get("log", False))}
    if isinstance(entry, list):
        if not entry:
            raise ConfigError(f"{source}: {name} has no choices", hint=hint)
        return [_value(name, value, kind, source) for value in entry]
    return _value(name, entry, kind, source)


def suggest(trial: Any, space: Space, base: TrainParams) -> dict[str, Any]:
    """Ask an Optuna trial for one value of each searched field; fixed fields are set, not searched."""
    chosen: dict[str, Any] = {}
    for name, entry in space.items():
        if name == "lora_rank" and not chosen.get("lora", base.lora):
            continue  # no adapters, no rank: TPE sees a conditional parameter, not noise
        if isinstance(entry, dict) and _TYPES[name] is int:
            chosen[name] = trial.suggest_int(name, entry["low"], entry["high"], log=entry.get("log", False))
        elif isinstance(entry, dict):
            chosen[name] = trial.suggest_float(name, entry["low"], entry["high"], log=entry.get("log", False))
        elif isinstance(entry, list):
            chosen[name] = trial.suggest_categorical(name, entry)
        else:
            chosen[name] = entry
    return chosen


def nearest(space: Space, base: TrainParams) -> dict[str, Any]:
    """The base parameters moved into the space: the first trial, so a search never ends below the defaults."""
    values: dict[str, Any] = {}
    for name, entry in space.items():
        wanted = getattr(base, name)
        if isinstance(entry, dict):
            values[name] = min(max(wanted, entry["low"]), entry["high"])
        elif isinstance(entry, list):
            values[name] = wanted if wanted in entry else min(
                entry, key=lambda choice: abs(choice - wanted) if isinstance(choice, int | float) else 0)
        else:
            values[name] = entry
    if not values.get("lora", base.lora):
        values.pop("lora_rank", None)
    return values


def cap(space: Space, name: str, limit: int) -> Space:
    """The space with a numeric field kept at or below limit (max_length under the model's positions)."""
    entry = space.get(name)
    if isinstance(entry, dict):
        entry = {**entry, "high": min(entry["high"], limit), "low": min(entry["low"], limit)}
    elif isinstance(entry, list):
        entry = sorted({min(value, limit) for value in entry})
    elif entry is not None:
        entry = min(entry, limit)
    return {**space, name: entry} if entry is not None else space


def _value(name: str, value: Any, kind: type, source: str) -> Any:
    """A value the training takes for this field (its type and bounds are TrainParams')."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    try:
        return getattr(TrainParams.model_validate({name: value}), name)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {problems(exc)}") from None
