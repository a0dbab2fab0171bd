"""`appliance train` and `appliance runs`: fine-tune on a dataset, and compare runs."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from click.core import ParameterSource

from appliance import operations
from appliance.cli.base import ask, cli, deployment, json_option, print_json, schema_option, yes_option
from appliance.cli.connect import connected
from appliance.cli.optimize import distill_option
from appliance.core.errors import JobError
from appliance.core.text import counted
from appliance.operations import jobspec
from appliance.train import runs
from appliance.train.params import TrainParams


@cli.command("train")
@click.option("--data", "dataset", help="Dataset name, name:version or id (see 'appliance data list').")
@click.option("--base", type=click.Path(file_okay=False, path_type=Path),
              help="Local Hugging Face model directory; through a running daemon, one in train.base_models_dir.")
@schema_option(TrainParams, "mode", "--mode",
               help="full: fine-tune every weight. fast: tune the encoder on pairs of texts, embed each text once "
                    "and train only a linear head (minutes where full takes hours; usually a few points less "
                    "accurate). auto: time "
                    "full fine-tuning here first and say how long it takes; fast only if one epoch would not fit "
                    "--max-minutes.")
@schema_option(TrainParams, "contrastive_pairs", "--contrastive-pairs",
               help="Fast mode: tune the encoder first on this many pairs of training texts, as SetFit does (same "
                    "label drawn together, others apart); 0 embeds with the encoder as it is "
                    f"[fast mode: {TrainParams.FAST_DEFAULTS['contrastive_pairs']}].")
@schema_option(TrainParams, "epochs", "--epochs", help=f"[fast mode: {TrainParams.FAST_DEFAULTS['epochs']}]")
@schema_option(TrainParams, "learning_rate", "--lr", "lr",
               help=f"[fast mode: {TrainParams.FAST_DEFAULTS['learning_rate']}]")
@schema_option(TrainParams, "batch_size", "--batch-size",
               help="Effective batch; the plan splits it into micro-batches that fit memory.")
@schema_option(TrainParams, "max_length", "--max-length",
               help="Tokens of a text the model reads. Left out, a run with --max-minutes whose texts are often "
                    "longer reads more, up to what the base model takes, where the budget holds it.")
@schema_option(TrainParams, "truncation", "--truncation",
               help="How a text longer than --max-length is read: head, its first tokens; head+tail, its first "
                    "quarter-window and its last three quarters (the beginning and the conclusion).")
@click.option("--lora", is_flag=True, help="Train LoRA adapters instead of every weight.")
@schema_option(TrainParams, "freeze", "--freeze",
               help="Share of a pretrained image backbone's blocks, from the input on, kept as pretrained while the "
                    f"rest fine-tunes [image runs: {TrainParams.IMAGE_DEFAULTS['freeze']}].")
@schema_option(TrainParams, "schedule", "--schedule")
@schema_option(TrainParams, "patience", "--patience",
               help="Stop after this many epochs without a better validation metric "
                    f"[fast mode: {TrainParams.FAST_DEFAULTS['patience']}].")
@schema_option(TrainParams, "seed", "--seed")
@schema_option(TrainParams, "max_minutes", "--max-minutes",
               help="Stop after this long with the best so far; with --deploy, the whole job: the training leaves "
                    "the optimisation after it the time it takes on this box (with --distill, the training has half, "
                    "the student the other half).")
@schema_option(TrainParams, "checkpoint_minutes", "--checkpoint-minutes",
               help="Minutes of training between checkpoints, written in the background; stopping (Ctrl-C, SIGTERM) "
                    "always checkpoints.")
@schema_option(TrainParams, "checkpoint_every", "--checkpoint-every", help="Also checkpoint every N optimizer steps.")
@schema_option(TrainParams, "workers", "--workers",
               help="Train data-parallel in this many processes, each on its share of every batch. Default: one per "
                    "GPU, one on a CPU.")
@schema_option(jobspec.TrainJob, "device", "--device", help="Default: the best available.")
@click.option("--resume", "resume_run", help="Continue an interrupted run from its last checkpoint.")
@click.option("--name", "model_name", help="Register the model under this name (default: the dataset's name).")
@click.option("--burst", is_flag=True, help="Train on the configured Ray cluster, if the dataset's residency allows.")
@click.option("--fallback", is_flag=True, help="With --burst: train here if the burst fails.")
@schema_option(jobspec.PipelineJob, "deploy", "--deploy", default=None,
               help="Then optimise it and deploy it. auto: production if the model serves nothing yet, else a canary "
                    "if it holds up against production; now; canary; never: optimise only.")
@distill_option
def train(
    dataset: str | None,
    base: Path | None,
    mode: str,
    contrastive_pairs: int,
    epochs: int,
    lr: float,
    batch_size: int,
    max_length: int,
    truncation: str,
    lora: bool,
    freeze: float,
    schedule: str,
    patience: int,
    seed: int,
    max_minutes: float | None,
    checkpoint_minutes: float,
    checkpoint_every: int | None,
    workers: int | None,
    device: str | None,
    resume_run: str | None,
    model_name: str | None,
    burst: bool,
    fallback: bool,
    deploy: str | None,
    distill: bool,
) -> None:
    """Fine-tune a base model on a dataset version, checkpointing as it goes.

    With a daemon running, the daemon trains it as a job (it survives this shell, and crashes); with none, it
    trains here. Either way the run is registered as the next version of the model; with --deploy it is then
    optimised (with --distill, a student too) and deployed as a pipeline job would.
    """
    if (dataset is None) == (resume_run is None):
        raise click.UsageError("give either --data NAME for a new run or --resume RUN")
    if resume_run is not None and (burst or fallback or base or deploy or distill):
        raise click.UsageError("--resume continues a run as it started: it takes no --burst, --fallback, --base, "
                               "--deploy or --distill (optimise and deploy the version it registers afterwards)")
    if fallback and not burst:
        raise click.UsageError("--fallback says what to do when a burst fails: add --burst, or leave it out to train"
                               " here")
    if distill and not deploy:
        raise click.UsageError("--distill shapes the optimisation that --deploy runs: add --deploy (auto, now, canary "
                               "or never), or distil a registered version with 'appliance optimize MODEL --distill'")
    if resume_run is not None:
        job = {"resume": resume_run, "name": model_name}
    else:
        values = {"mode": mode, "contrastive_pairs": contrastive_pairs, "epochs": epochs, "learning_rate": lr, "batch_size": batch_size,
                  "max_length": max_length, "truncation": truncation, "lora": lora, "freeze": freeze, "schedule": schedule, "patience": patience,
                  "seed": seed, "max_minutes": max_minutes, "checkpoint_minutes": checkpoint_minutes,
                  "checkpoint_every": checkpoint_every, "workers": workers}
        given = click.get_current_context().get_parameter_source
        # Only what was given: the rest takes the mode's default (fast mode has its own learning rate and epochs).
        params = TrainParams.parse({field: value for field, value in values.items()
                                    if given("lr" if field == "learning_rate" else field) != ParameterSource.DEFAULT})
        job = {"dataset": dataset, "params": params, "device": device, "name": model_name, "burst": burst or None,
               "fallback": fallback or None, "deploy": deploy, "distill": distill or None}
    kind = jobspec.PipelineJob if deploy else jobspec.TrainJob
    spec = kind.parse({key: value for key, value in job.items() if value is not None})
    with connected() as appliance:
        try:
            result = appliance.run(spec, "burst" if burst else "training", base=base)
        except operations.Stopped as stopped:
            if "run_id" not in stopped.made:
                raise JobError("the burst was stopped; the Ray job is cancelled", hint="nothing was stored") from None
            click.echo(f"run {stopped.made['run_id']} stopped and checkpointed")
            click.echo(f"  continue it with: appliance train --resume {stopped.made['run_id']}")
            sys.exit(143)
    if deploy:
        click.echo(f"run {result['run_id']} finished; registered and optimised as {result['version']}")
        click.echo(f"  {deployment(result['version'], result['deployed'])}")
        return
    if result["trained_on"]:
        click.echo(f"trained on {result['trained_on']}")
    summary = ", ".join(f"{metric} {value:.4f}" for metric, value in result["metrics"].items())
    ended = result.get("outcome")
    on = ("" if not ended or ended["evaluated_on"] == ended["validation_examples"]
          else f" (on a sample of {ended['evaluated_on']:,} of {ended['validation_examples']:,} examples)")
    click.echo(f"run {result['run_id']} finished after {result['steps']} steps"
               + (f", keeping epoch {ended['best_epoch']} of {ended['epochs_run']}" if ended else "")
               + (" (stopped early)" if result["stopped_early"] else ""))
    click.echo(f"  best validation: {summary}{on}")
    click.echo(f"  registered as {result['version']}; optimise it with 'appliance optimize {result['version']}'")


@cli.group("runs")
def runs_group() -> None:
    """Training runs: their parameters, plans and metrics."""


@runs_group.command("list")
@json_option
def runs_list(as_json: bool) -> None:
    """Every training run, oldest first."""
    with connected() as appliance:
        found = appliance.runs()
        if as_json:
            print_json(found)
            return
        data = {version["id"]: version["ref"] for version in appliance.datasets()}
        made: dict[str, list[str]] = {}
        for version in appliance.models():
            made.setdefault(version["run_id"], []).append(f"{version['model']}:{version['version']}")
    if not found:
        click.echo("no training runs yet; start one with 'appliance train --data NAME'")
    for run in found:
        metric = f"macro_f1 {run['metrics']['macro_f1']:.4f}" if run["metrics"] else ""
        trained = data.get(run["dataset_id"], run["dataset_id"][:12])
        click.echo(f"{run['id']}  {run['created_at'][:19]}  {run['status']:<11} on {trained:<18}"
                   f" made {' '.join(made.get(run['id'], [])) or '-':<22} {metric}")


@runs_group.command("show")
@click.argument("run_id")
@json_option
def runs_show(run_id: str, as_json: bool) -> None:
    """One run: hyperparameters, hardware plan and per-epoch metrics."""
    with connected() as appliance:
        run = appliance.run_detail(run_id)
    if as_json:
        print_json(run)
        return
    click.echo(f"run {run['id']}: {run['status']}, dataset {run['dataset_id'][:12]}, base {run['base_model']}"
               + (f", trained on {run['trained_on']}" if run["trained_on"] else ""))
    click.echo("params: " + ", ".join(f"{k}={v}" for k, v in run["params"].items()))
    plan = run["plan"]
    click.echo(
        f"plan:   {plan['device']} {plan['precision']}, {counted(plan['threads'], 'thread')}, "
        f"micro-batch {plan['micro_batch']} x {plan['accumulation']}"
    )
    for row in run["epochs"]:
        metrics = row["metrics"]
        sampled = f"  on {row['evaluated_on']:,}" if row.get("evaluated_on") else ""
        click.echo(
            f"  epoch {row['epoch']:>3}  train loss {row['train_loss']:.4f}  val loss {metrics['loss']:.4f}  "
            f"accuracy {metrics['accuracy']:.4f}  macro-F1 {metrics['macro_f1']:.4f}  "
            f"{row['samples_per_s']:.1f} samples/s  at {row['elapsed_s']:.0f}s{sampled}"
        )
    if run.get("outcome"):
        click.echo(runs.Outcome(**run["outcome"]).sentence(run["params"]))


@runs_group.command("discard")
@click.argument("run_id")
@yes_option
def runs_discard(run_id: str, yes: bool) -> None:
    """Give up a run that will not be resumed: its checkpoint, the size of its model and optimiser state, is
    deleted; the run and its curve stay listed. Audited, admin only; refused while a job trains or resumes it."""
    ask(f"Delete the checkpoint of run {run_id}? It can no longer be resumed.", yes)
    with connected() as appliance:
        run = appliance.discard_run(run_id)
    click.echo(f"run {run['id']} discarded: its checkpoint ({run['freed_bytes'] / 2**20:.1f} MiB) is deleted;"
               " 'appliance store compact' gives the space back to the disk")


@runs_group.command("compare")
@click.argument("first")
@click.argument("second")
def runs_compare(first: str, second: str) -> None:
    """Two runs side by side: what differed, and what it gave."""
    with connected() as appliance:
        a, b = appliance.run_detail(first), appliance.run_detail(second)
    click.echo(f"{'':22} {a['id']:>16} {b['id']:>16}")
    for section in ("params", "plan", "metrics"):
        left, right = a[section] or {}, b[section] or {}
        for key in sorted(set(left) | set(right)):
            x, y = left.get(key), right.get(key)
            marker = " " if x == y else "*"
            click.echo(f"{marker}{section[:1]}.{key:<20} {_cell(x):>16} {_cell(y):>16}")


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)[:16]
