"""`appliance models`: the registry's versions, their variants, lineage and aliases; deleting one."""

from __future__ import annotations

from typing import Any

import click

from appliance.cli.base import alias, ask, cli, json_option, print_json, yes_option
from appliance.cli.connect import connected


@cli.group("models")
def models_group() -> None:
    """Registered model versions and which one serves."""


@models_group.command("list")
@json_option
def models_list(as_json: bool) -> None:
    """Every version of every model, with its chosen variant and aliases."""
    with connected() as appliance:
        versions = appliance.models()
    if as_json:
        print_json(versions)
        return
    if not versions:
        click.echo("no models registered yet")
    for v in versions:
        accuracy = v["variants"][v["chosen"]]["metrics"].get("accuracy")
        score = f"accuracy {accuracy:.4f}" if accuracy is not None else ""
        runs_as = f"serves {v['chosen']}" if v["servable"] else "not optimised"
        click.echo(f"{v['model'] + ':' + str(v['version']):<24} {v['created_at']}  {runs_as:<19} {score:<16}"
                   f" {' '.join(v['aliases'])}")


@models_group.command("show")
@click.argument("ref")
@json_option
def models_show(ref: str, as_json: bool) -> None:
    """One version (MODEL, MODEL:VERSION or MODEL@ALIAS): variants side by side, lineage, decision."""
    with connected() as appliance:
        version = appliance.model(ref)
    if as_json:
        print_json(version)
        return
    show_version(version)


@models_group.command("delete")
@click.argument("ref", metavar="MODEL:VERSION")
@yes_option
def models_delete(ref: str, yes: bool) -> None:
    """Delete a version and its weights; audited, admin only.

    Refused while it serves, is the canary's candidate, or a rollback could return to it. Its number is not
    given again; the run it came from and the audit records stay.
    """
    if not ref.partition(":")[2].isdigit():
        raise click.BadParameter("name the version as MODEL:VERSION, e.g. tickets:3", param_hint="MODEL:VERSION")
    ask(f"Delete {ref} and its weights? It cannot be undone.", yes)
    with connected() as appliance:
        click.echo(f"deleted {appliance.delete_model(ref)}")


alias(models_group, models_delete, "rm")


def show_version(version: dict[str, Any]) -> None:
    """A version for a person: aliases, the guard's decision, lineage, then its variants side by side."""
    lineage = version["lineage"]
    click.echo(f"{version['model']}:{version['version']}  ({', '.join(version['aliases']) or 'not deployed'})"
               f"  {version['task']}")
    click.echo(f"chosen: {version['chosen']} - {version['reason']}")
    click.echo(f"lineage: run {lineage['run']}, dataset {lineage['dataset'][:12]}, base {lineage['base_model']},"
               f" trained on {lineage['trained_on']}")
    click.echo("hyperparameters: " + ", ".join(f"{key}={value}" for key, value in lineage["params"].items()))
    click.echo(f"{'variant':<16}{'format':<13}{'MiB':>6}{'acc':>7}{'F1':>7}{'p50 ms':>8}{'b1/s':>7}{'b16/s':>7}{'x fp32':>7}")
    for variant in sorted(version["variants"].values(),
                          key=lambda v: (v["name"] != "torch", "student" in v["name"], v["name"])):
        cells = "".join(_cell(variant["metrics"].get(name), spec) for name, spec in COLUMNS)
        click.echo(f"{variant['name']:<16}{variant['format']:<13}{variant['bytes'] / 2**20:>6.1f}{cells}")


COLUMNS = (("accuracy", ">7.3f"), ("macro_f1", ">7.3f"), ("latency_ms_p50", ">8.1f"), ("throughput_b1", ">7.0f"),
           ("throughput_b16", ">7.0f"), ("speedup_b16", ">7.2f"))


def _cell(value: float | None, spec: str) -> str:
    width = spec[1:].split(".")[0]
    return f"{'-':>{width}}" if value is None else f"{value:{spec}}"
