"""`appliance feedback`: true labels for served predictions, and the live accuracy they show."""

from __future__ import annotations

from pathlib import Path

import click

from appliance.cli.base import cli, json_option, print_json
from appliance.cli.connect import connected
from appliance.registry import feedback


@cli.group("feedback")
def feedback_group() -> None:
    """Attach true labels to predictions; see how each served version does on them."""


@feedback_group.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def feedback_import(path: Path) -> None:
    """Attach the labels in PATH, a CSV file with columns prediction_id and label; all of them, or none."""
    pairs = feedback.read_csv(path)
    with connected() as appliance:  # a daemon writes it, audited under the caller's user
        answer = appliance.record_feedback(pairs, path.name)
    models = ", ".join(f"{model} {count}" for model, count in sorted(answer["by_model"].items()))
    click.echo(f"{answer['accepted']} labels stored ({models})")


@feedback_group.command("show")
@click.argument("model", required=False)
@json_option
def feedback_show(model: str | None, as_json: bool) -> None:
    """Live accuracy on feedback by model version over the last hour, day and week, and labels not trained on."""
    with connected() as appliance:
        found = appliance.quality(model)
    if as_json:
        print_json(found)
        return
    if not found:
        click.echo("no feedback yet: POST /v1/feedback or 'appliance feedback import FILE.csv' adds some")
        return
    click.echo(f"{'version':<24} {'last hour':>16} {'last day':>16} {'last week':>16}")
    for entry in found:
        cells = [_cell(entry["windows"][window]) for window in feedback.WINDOWS]
        click.echo(f"{entry['model'] + ':' + str(entry['version']):<24} " + " ".join(f"{cell:>16}" for cell in cells))
    for name, count in sorted({entry["model"]: entry["unused_labels"] for entry in found}.items()):
        click.echo(f"{name}: {count} labels not trained on yet")


def _cell(window: dict) -> str:
    return "-" if not window["feedback"] else f"{window['accuracy']:.1%} of {window['feedback']}"
