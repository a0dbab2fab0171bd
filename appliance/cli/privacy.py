"""`appliance privacy erase`: a data subject's right to erasure, across every erasure source."""

from __future__ import annotations

import sys
from typing import Any

import click

from appliance.cli.base import ask, cli, json_option, print_json, yes_option
from appliance.cli.connect import connected


@cli.group("privacy")
def privacy_group() -> None:
    """Data subject requests: find and erase every record of a person."""


@privacy_group.command("erase")
@click.option("--subject", required=True,
              help="The identifier (email address, customer id), matched in any case; '-' reads it from stdin,"
                   " which keeps it out of the process list and shell history.")
@click.option("--dry-run", is_flag=True, help="List what would be erased and change nothing.")
@yes_option
@json_option
def privacy_erase(subject: str, dry_run: bool, yes: bool, as_json: bool) -> None:
    """Remove every record containing SUBJECT: dataset examples (a new version without them); audited.

    Lists the models trained on the data for retraining. Backups made before stay as they were.
    With a daemon running it goes through its control API and needs an admin's token.
    """
    if subject == "-":
        subject = sys.stdin.readline().strip()
    with connected() as appliance:  # through a daemon: admin only, audited under the caller's user
        found = appliance.erasure(subject, dry_run=True)
        _confirm(found, dry_run or yes)
        result = found if dry_run else appliance.erasure(subject, dry_run=False)
    if as_json:
        print_json({**result, "dry_run": dry_run})
        return
    _show(result, "would erase" if dry_run else "erased")


def _confirm(found: dict[str, Any], skip: bool) -> None:
    if skip or not found["findings"]:
        return
    if sys.stdin.isatty():
        _show(found, "would erase")
    ask("Erase these records?", skip)


def _show(request: dict[str, Any], verb: str) -> None:
    if not request["findings"]:
        click.echo(f"no records of this subject (audit name {request['subject'][:16]}...)")
        return
    for finding in request["findings"]:
        click.echo(f"{verb} {finding['records']} record(s) in {finding['source']} {finding['object']}")
    for erased in request["erased"]:
        if erased.get("replaced_by"):
            click.echo(f"  {erased['dataset']} is now erased; {erased['replaced_by']} holds the rest")
    if request["affected_models"]:
        click.echo(f"retrain (trained on the erased data): {', '.join(request['affected_models'])}")
    click.echo(f"the audit log names the subject as {request['subject'][:16]}...")
