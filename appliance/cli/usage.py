"""`appliance usage`: who and which model used what, by day (the chargeback)."""

from __future__ import annotations

import csv
import sys

import click

from appliance.cli.base import cli, json_option, print_json
from appliance.cli.connect import connected
from appliance.registry import usage
from appliance.store import audit

HEADINGS = {"day": "day", "user": "user", "model": "model", "cpu_hours": "CPU h", "gpu_hours": "GPU h",
            "job_attempts": "jobs", "requests": "requests", "inference_hours": "inference h"}


@cli.command("usage")
@click.option("--since", help="From this day on: 2026-11-01, or an age: 7d, 12h.")
@click.option("--by", type=click.Choice(usage.BY), help="Sum by user or by model (default: both).")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV.")
@json_option
def usage_command(since: str | None, by: str | None, as_csv: bool, as_json: bool) -> None:
    """CPU and GPU hours of jobs and inference requests and hours, per day, user and model."""
    if as_csv and as_json:
        raise click.UsageError("give --csv or --json, not both")
    _check_since(since)  # a mistake is told here, before anything is asked
    with connected() as appliance:
        rows = appliance.usage(since, by)
    if as_json:
        print_json(rows)
    elif as_csv:
        columns = list(rows[0]) if rows else ["day", *(usage.BY if by is None else [by]), *list(HEADINGS)[3:]]
        writer = csv.DictWriter(sys.stdout, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    elif not rows:
        click.echo("no usage recorded" + (f" since {since}" if since else ""))
    else:
        columns = list(rows[0])
        widths = {column: max(len(HEADINGS[column]), *(len(_cell(row[column])) for row in rows)) for column in columns}
        click.echo("  ".join(HEADINGS[column].ljust(widths[column]) for column in columns).rstrip())
        for row in rows:
            click.echo("  ".join(_cell(row[column]).ljust(widths[column]) for column in columns).rstrip())


def _cell(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _check_since(text: str | None) -> None:
    try:
        if text is not None:
            audit.parse_since(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from exc
