"""`appliance compliance`: write the signed evidence pack for an auditor, and check one offline."""

from __future__ import annotations

from pathlib import Path

import click

from appliance.cli.base import cli, json_option, opened_store, print_json, say_trust
from appliance.compliance import pack
from appliance.core import clock


@cli.group("compliance")
def compliance_group() -> None:
    """Evidence for auditors: a signed report of data, lineage, transfers, keys, access and the audit chain."""


@compliance_group.command("report")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path),
              help="A new (or empty) folder for the pack; default: compliance-YYYYMMDDTHHMMSSZ here.")
def compliance_report(out: Path | None) -> None:
    """Write report.html, report.json (and report.pdf where a converter is installed), signed; audited."""
    out = out or Path(f"compliance-{clock.now():%Y%m%dT%H%M%SZ}")
    with opened_store() as opened:
        written = pack.write(opened, out)
    click.echo(f"compliance pack written to {written.folder}: {', '.join(written.files)}")
    click.echo(written.pdf)
    click.echo(f"signed with the audit signing key, SHA-256 {pack.anchor.fingerprint(written.public_key)}")
    click.echo("check it with 'appliance compliance verify DIR'; trust it by comparing that key with an audit"
               " checkpoint kept elsewhere")


@compliance_group.command("verify")
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--public-key", help="The key the pack must be signed by (hex, or its SHA-256), received separately.")
@click.option("--checkpoint", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="An audit checkpoint exported earlier: the pack must be signed by the same key and store.")
@json_option
def compliance_verify(folder: Path, public_key: str | None, checkpoint: Path | None, as_json: bool) -> None:
    """Check that no file of the pack in FOLDER changed since it was signed; exit 1 naming any that did.

    Needs no store and no key: it runs anywhere the appliance is installed.
    """
    checked = pack.verify(folder, public_key, checkpoint)
    if as_json:
        print_json(pack.summary(checked))
        return
    click.echo(f"pack OK: {', '.join(checked.files)} unchanged since store {checked.store_id} signed them"
               f" ({checked.generated_at})")
    click.echo(f"signing key SHA-256 {pack.anchor.fingerprint(checked.public_key)}")
    say_trust(checked.trusted, "pack")
