"""`appliance store` and `appliance quickstart`: the database itself."""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path
from typing import Any

import click

from appliance.cli.audit import show_verification
from appliance.cli.base import cli, load_settings, opened_store, print_json, progress_bar
from appliance.store import audit, lifecycle


@cli.command()
def version() -> None:
    """Print the appliance version."""
    click.echo(f"appliance {metadata.version('appliance')}")


@cli.command()
def quickstart() -> None:
    """Set up the store on first use (key, database) and show its state."""
    settings = load_settings()
    if not settings.key_file.exists() and not os.environ.get("APPLIANCE_PASSPHRASE"):
        with lifecycle.init(settings):
            click.echo(f"created the master key at {settings.key_file} (mode 0600)")
            click.echo("  back it up somewhere safe: without it nothing in the store can be read")
    with opened_store() as opened:
        _show_info(lifecycle.info(opened))
        show_verification(audit.verify(opened))


@cli.group("store")
def store_group() -> None:
    """Inspect and back up the database."""


@store_group.command("info")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def store_info(as_json: bool) -> None:
    """Sizes, counts and SQLite's integrity check."""
    with opened_store() as opened:
        details = lifecycle.info(opened)
    if as_json:
        print_json(details)
    else:
        _show_info(details)


def _show_info(details: dict[str, Any]) -> None:
    for name, value in details.items():
        click.echo(f"{name:16} {value}")


@store_group.command("backup")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def store_backup(path: Path) -> None:
    """Copy the store to PATH while it runs; the copy opens with the same key."""
    with opened_store() as opened, progress_bar("backing up") as progress:
        size = lifecycle.backup(opened, path, progress)
    click.echo(f"backup written to {path} ({size / 2**20:.1f} MiB)")
