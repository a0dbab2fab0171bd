"""`appliance doctor`: can this appliance run? One line per check, with how to fix what fails."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict

import click

from appliance.cli.base import cli, json_option, load_settings, print_json
from appliance.daemon import doctor as checks


@cli.command("doctor")
@json_option
def doctor(as_json: bool) -> None:
    """Check hardware, key, store, audit log, ports and disk space; exit 1 if anything fails."""
    found = checks.run(load_settings(), os.environ.get("APPLIANCE_PASSPHRASE"))
    if as_json:
        print_json([asdict(check) | {"status": check.status.value} for check in found])
    else:
        for check in found:
            click.echo(f"{check.status.value.upper() if check.status is checks.Status.FAIL else check.status.value:5}"
                       f" {check.name:15} {check.detail}")
            if check.hint and check.status in (checks.Status.FAIL, checks.Status.WARN):
                click.echo(f"{'':5} {'':15} fix: {check.hint}")
        bad = sum(check.status is checks.Status.FAIL for check in found)
        click.echo(f"\n{bad} of {len(found)} checks failed" if bad else f"\nall {len(found)} checks passed")
    if checks.failed(found):
        sys.exit(1)
