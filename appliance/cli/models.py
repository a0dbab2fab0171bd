"""`appliance models`: the registry's versions, their variants, lineage and aliases."""

from __future__ import annotations

import dataclasses

import click

from appliance import registry
from appliance.cli.base import cli, opened_store, print_json


@cli.group("models")
def models_group() -> None:
    """Registered model versions and which one serves."""


@models_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def models_list(as_json: bool) -> None:
    """Every version of every model, with its chosen variant and aliases."""
    with opened_store() as opened:
        versions = registry.list_versions(opened)
    if as_json:
        print_json([dataclasses.asdict(version) for version in versions])
        return
    if not versions:
        click.echo("no models registered yet")
    for v in versions:
        accuracy = v.variants[v.chosen].metrics.get("accuracy")
        score = f"accuracy {accuracy:.4f}" if accuracy is not None else ""
        click.echo(f"{v.ref:<24} {v.created_at}  serves {v.chosen:<12} {score:<16} {' '.join(v.aliases)}")


@models_group.command("show")
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def models_show(ref: str, as_json: bool) -> None:
    """One version (MODEL, MODEL:VERSION or MODEL@ALIAS): variants side by side, lineage, decision."""
    with opened_store() as opened:
        version = registry.get(opened, ref)
        lineage = version.lineage(opened)
    if as_json:
        print_json({**dataclasses.asdict(version), "lineage": lineage})
        return
    click.echo(f"{version.ref}  ({', '.join(version.aliases) or 'no alias'})  {version.task}")
    click.echo(f"chosen: {version.chosen} - {version.reason}")
    click.echo(f"lineage: run {lineage['run']}, dataset {lineage['dataset'][:12]}, base {lineage['base_model']}")
    names = sorted({name for variant in version.variants.values() for name in variant.metrics})
    click.echo(f"{'variant':<14}{'format':<14}{'MiB':>8}" + "".join(f"{name:>14}" for name in names))
    for variant in version.variants.values():
        cells = "".join(f"{variant.metrics[name]:>14.4g}" if name in variant.metrics else f"{'-':>14}" for name in names)
        click.echo(f"{variant.name:<14}{variant.format:<14}{variant.bytes / 2**20:>8.1f}{cells}")
