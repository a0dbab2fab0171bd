"""`appliance data`: import dataset files as versions, look at the versions stored, delete them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from appliance.cli.base import FiniteRange, alias, ask, cli, json_option, print_json, yes_option
from appliance.cli.connect import connected
from appliance.data import datasets


@cli.group("data")
def data_group() -> None:
    """Import datasets and inspect their versions."""


@data_group.command("import")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--name", required=True, help="Dataset name; a changed file becomes its next version.")
@click.option("--task", type=click.Choice(datasets.TASKS), default=datasets.TEXT, show_default=True)
@click.option("--text-column", default="text", show_default=True, help="Column (CSV) or field (JSONL) of the text.")
@click.option("--label-column", default="label", show_default=True, help="Column or field of the label.")
@click.option(
    "--validation-fraction",
    type=FiniteRange(0, 1, min_open=True, max_open=True),
    default=0.2,
    show_default=True,
    help="Share of each class held out for validation.",
)
@click.option("--seed", type=int, default=13, show_default=True, help="Seed of the train/validation split.")
@click.option("--max-text-chars", type=click.IntRange(16, 10**7), default=datasets.MAX_TEXT_CHARS, show_default=True,
              help="Characters of one text; a longer one is cut to its beginning and end (or with --long-texts skip, "
                   "left out), never refused.")
@click.option("--long-texts", type=click.Choice(datasets.LONG_TEXTS), default="truncate", show_default=True,
              help="A text over --max-text-chars: cut to its beginning and end, or left out; counted either way.")
@click.option("--residency", type=click.Choice(datasets.RESIDENCIES), default=datasets.LOCAL_ONLY, show_default=True,
              help="Whether it may be sent (encrypted) to the Ray cluster for a burst.")
def data_import(
    path: Path, name: str, task: str, text_column: str, label_column: str, validation_fraction: float, seed: int,
    max_text_chars: int, long_texts: str, residency: str,
) -> None:
    """Check PATH (a CSV file, its fields separated by commas, semicolons or tabs as its header shows, or a JSONL
    file, or a folder of class subfolders of images) and store it encrypted."""
    options = {"name": name, "task": task, "text_column": text_column, "label_column": label_column,
               "validation_fraction": validation_fraction, "seed": seed, "max_text_chars": max_text_chars,
               "long_texts": long_texts, "residency": residency}
    with connected() as appliance:  # a daemon gets the file's bytes and audits the import under the caller's user
        ref, unchanged = appliance.import_data(path, options)
        version = appliance.dataset(ref)
    click.echo(f"{'unchanged, already stored as' if unchanged else 'imported as'} {version['ref']}")
    if unchanged:
        _say_options_kept(version, options)
    _describe(version)


def _say_options_kept(version: dict[str, Any], options: dict[str, Any]) -> None:
    """The same content is the version it already is, split and residency included: say which options given on the
    command line that leaves aside, and how to get what they asked for."""
    source = click.get_current_context().get_parameter_source
    kept = {"validation_fraction": version["split"]["validation_fraction"], "seed": version["split"]["seed"],
            "residency": version["residency"]}
    for name, value in kept.items():
        if source(name) is click.core.ParameterSource.COMMANDLINE and options[name] != value:
            how = (f"'appliance data residency {version['ref']} {options[name]}' changes it" if name == "residency"
                   else "a version's split is fixed when it is stored: import the file under another name for another")
            click.echo(f"  note: --{name.replace('_', '-')} {options[name]} is not used: the version keeps {value}; {how}")


@data_group.command("residency")
@click.argument("ref")
@click.argument("residency", type=click.Choice(datasets.RESIDENCIES))
def data_residency(ref: str, residency: str) -> None:
    """Say whether REF (a name: every version; or name:version) may leave this box for a burst; audited."""
    with connected() as appliance:
        changed = appliance.set_residency(ref, residency)
    click.echo(f"{', '.join(changed)}: {residency}")


@data_group.command("delete")
@click.argument("ref")
@yes_option
def data_delete(ref: str, yes: bool) -> None:
    """Delete the content of REF (a name: every version; or name:version); audited, admin only.

    The versions stay listed as deleted, so the runs and models trained on them still say on what; their
    examples are gone and nothing can train on them again. Refused while a job trains on the dataset.
    """
    ask(f"Delete the content of {ref} ({'that version' if ':' in ref else 'every version'})? It cannot be undone.", yes)
    with connected() as appliance:
        deleted = appliance.delete_dataset(ref)
    click.echo(f"deleted {', '.join(deleted)}")


alias(data_group, data_delete, "rm")


@data_group.command("list")
@json_option
def data_list(as_json: bool) -> None:
    """List every version of every dataset."""
    with connected() as appliance:
        versions = appliance.datasets()
    if as_json:
        print_json(versions)
        return
    if not versions:
        click.echo("no datasets yet: 'appliance data import PATH --name NAME' adds one")
    for v in versions:
        click.echo(
            f"{v['ref']:<24} {v['id'][:12]}  {v['task']:<20} {v['examples']:>7} examples"
            f"  {len(v['labels']):>3} labels  {v['residency']:<13} {v['created_at'][:19]}"
            + (f"  {v['removal']}" if v["removal"] else "")
        )


@data_group.command("show")
@click.argument("ref")
@json_option
def data_show(ref: str, as_json: bool) -> None:
    """Show one version: REF is a name (its latest version), name:version or an id prefix."""
    with connected() as appliance:
        version = appliance.dataset(ref)
    if as_json:
        print_json(version)
        return
    _describe(version)
    if version["models"]:
        click.echo(f"trained     {', '.join(version['models'])}")
    if version["removal"]:
        click.echo(f"content     {version['removal']}; it is gone"
                   + (f", the rest is in {version['replacement']}" if version["replacement"] else ""))


def _describe(version: dict[str, Any]) -> None:
    """A version as `data show` and `data import` print it: what it is, where from, its labels and warnings."""
    split = version["split"]
    click.echo(f"id          {version['id']}")
    click.echo(f"task        {version['task']}")
    click.echo(
        f"examples    {version['examples']}: {split['train']} train, {split['validation']} validation"
        f" (fraction {split['validation_fraction']}, seed {split['seed']})"
    )
    click.echo(f"residency   {version['residency']}")
    click.echo(f"source      {version['source']}")
    if version["parent"]:
        click.echo(f"extends     {version['parent']}")
    from_predictions = version["from_predictions"]
    if from_predictions:
        rest = len(from_predictions) - 5
        shown = ", ".join(from_predictions[:5]) + (f" and {rest} more" if rest > 0 else "")
        click.echo(f"feedback    true labels of {len(from_predictions)} predictions: {shown}")
    click.echo(f"created     {version['created_at']}")
    counts = version["counts"]
    if counts:
        click.echo("labels")
    width = max(map(len, counts), default=0)
    for label, count in counts.items():
        click.echo(f"  {label:<{width}}  {count:>6}")
    for warning in version["warnings"]:
        click.echo(f"warning: {warning}")
