"""`appliance tune`: search hyperparameters within a time budget, and show what a search tried."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import click

from appliance import operations
from appliance.cli.base import cli, deployment, json_option, print_json, schema_option
from appliance.cli.connect import connected
from appliance.cli.optimize import distill_option
from appliance.core.text import counted
from appliance.operations import jobspec
from appliance.train import space

_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_budget(text: str) -> float:
    """90s, 30m, 1.5h -> seconds."""
    match = re.fullmatch(r"\s*([0-9]{1,9}(?:\.[0-9]{1,9})?)\s*([smh])\s*", text)
    if not match or float(match[1]) <= 0:
        raise click.BadParameter(f"{text!r} is not a duration; write e.g. 90s, 30m or 2h", param_hint="--budget")
    return float(match[1]) * _UNITS[match[2]]


@cli.group("tune", invoke_without_command=True)
@click.option("--data", "dataset", help="Dataset name, name:version or id (see 'appliance data list').")
@click.option("--budget", help="Wall-clock time for the whole job, the optimisation after the search included: 90s, "
                              "30m, 2h.")
@click.option("--base", type=click.Path(file_okay=False, path_type=Path),
              help="Local Hugging Face model directory; through a running daemon, one in train.base_models_dir.")
@schema_option(jobspec.TuneJob, "metric", "--metric", help="Validation metric to maximise.")
@click.option("--space", "space_file", type=click.Path(dir_okay=False, path_type=Path),
              help="TOML file narrowing the default search space (see docs/architecture.md).")
@schema_option(jobspec.TuneJob, "sampler", "--sampler")
@schema_option(jobspec.TuneJob, "device", "--device", help="Default: the best available.")
@click.option("--name", "model_name", help="Register the best model under this name (default: the dataset's name).")
@schema_option(jobspec.TuneJob, "deploy", "--deploy",
               help="auto: production if the model serves nothing yet, else a canary if it holds up against "
                    "production; now; canary; never.")
@distill_option
@click.option("--resume", "resume_study", help="Continue a stopped search.")
@click.pass_context
def tune_group(ctx: click.Context, dataset: str | None, budget: str | None, base: Path | None, metric: str,
               space_file: Path | None, sampler: str, device: str | None, model_name: str | None, deploy: str,
               distill: bool, resume_study: str | None) -> None:
    """Find good hyperparameters for a dataset within a time budget; the best trial becomes the model.

    Trials that fall behind after an epoch are pruned, so the time goes to promising ones. The search leaves the
    optimisation after it the time it takes on this box; with --distill the search has half the budget and the
    student, distilled from its best trial, the other half.
    """
    if ctx.invoked_subcommand is not None:
        return
    if resume_study is None and (dataset is None or budget is None):
        raise click.UsageError("give --data NAME and --budget (e.g. 30m), or --resume SEARCH")
    if resume_study is not None and (dataset or budget or base or space_file):
        raise click.UsageError("--resume continues a search as it started: it takes no --data, --budget, --base "
                               "or --space")
    if resume_study is not None:
        job: dict[str, Any] = {"resume": resume_study, "name": model_name, "deploy": deploy}
    else:
        job = {"dataset": dataset, "budget_s": parse_budget(budget or ""), "metric": metric, "sampler": sampler,
               "space": space.read(space_file) if space_file else None, "device": device, "name": model_name,
               "deploy": deploy}
    job["distill"] = distill or None
    spec = jobspec.TuneJob.parse({key: value for key, value in job.items() if value is not None})
    with connected() as appliance:
        try:
            result = appliance.run(spec, "search", base=base)
        except operations.Stopped as stopped:
            click.echo(f"search {stopped.made['study']} stopped and checkpointed")
            click.echo(f"  continue it with: appliance tune --resume {stopped.made['study']}")
            sys.exit(143)
    click.echo(f"best trial: run {result['run_id']}; registered and optimised as {result['version']}")
    click.echo(f"  {deployment(result['version'], result['deployed'])}")
    click.echo(f"  every trial: 'appliance tune show {result['study']}'")


@tune_group.command("show")
@click.argument("search")
@json_option
def tune_show(search: str, as_json: bool) -> None:
    """A search's trials, best first, and how much each parameter mattered (SEARCH: its id, or its job's)."""
    with connected() as appliance:
        study = appliance.study(search)
    if as_json:
        print_json(study)
        return
    _print_study(study)


@tune_group.command("list")
def tune_list() -> None:
    """Every search, oldest first."""
    with connected() as appliance:
        found = appliance.studies()
    if not found:
        click.echo("no searches yet; start one with 'appliance tune --data NAME --budget 30m'")
    for study in found:
        best = study["best_value"]
        click.echo(f"{study['id']}  {study['created_at']}  {study['status']:<11} {counted(study['trials'], 'trial'):>10}  "
                   f"budget {study['budget_s'] / 60:.0f}m" + (f"  best {study['metric']} {best:.4f}" if best else ""))


def _print_study(study: dict[str, Any]) -> None:
    """A search as studies.describe() gives it: its trials best first."""
    ranked = study["trials"]
    states = [trial["state"] for trial in ranked]
    click.echo(f"search {study['id']}: {study['status']}, {study['metric']} on dataset {study['dataset_id'][:12]}, "
               f"{study['spent_s']:.0f}s of {study['budget_s']:.0f}s, {counted(len(ranked), 'trial')} "
               f"({states.count('pruned')} pruned, {states.count('refused')} refused)")
    names = [name for name in study["space"] if any(name in trial["params"] for trial in ranked)]
    click.echo(f"{'rank':>4} {'trial':>5} {'state':<9} {study['metric']:>8} {'epochs':>6}  "
               + " ".join(f"{_short(name):>10}" for name in names) + "  run")
    for rank, trial in enumerate(ranked, 1):
        value = f"{trial['value']:.4f}" if trial["value"] is not None else "-"
        cells = " ".join(f"{_cell(trial['params'].get(name)):>10}" for name in names)
        click.echo(f"{rank:>4} {trial['number']:>5} {trial['state']:<9} {value:>8} {len(trial['epochs']):>6}  {cells}  "
                   f"{trial['run_id'] or trial['note'] or ''}")
    if study["importances"]:
        click.echo("importance: " + ", ".join(f"{name} {share:.2f}" for name, share in study["importances"].items()))
    else:
        click.echo("importance: needs at least two finished trials with different values")


def _short(name: str) -> str:
    return {"learning_rate": "lr", "warmup_ratio": "warmup", "weight_decay": "decay"}.get(name, name)[:10]


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)[:10]

