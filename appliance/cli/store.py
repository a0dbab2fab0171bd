"""`appliance store`: the database itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from appliance.cli.base import cli, json_option, opened_store, print_json, progress_bar
from appliance.store import lifecycle


@cli.group("store")
def store_group() -> None:
    """Inspect and back up the database."""


@store_group.command("info")
@json_option
def store_info(as_json: bool) -> None:
    """Sizes, counts and SQLite's integrity check."""
    with opened_store() as opened:
        details = lifecycle.info(opened)
    if as_json:
        print_json(details)
    else:
        show_info(details)


def show_info(details: dict[str, Any]) -> None:
    for name, value in details.items():
        click.echo(f"{name:16} {value}")


@store_group.command("backup")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def store_backup(path: Path) -> None:
    """Copy the store to PATH while it runs; the copy opens with the same key."""
    with opened_store() as opened, progress_bar("backing up") as progress:
        size = lifecycle.backup(opened, path, progress)
    click.echo(f"backup written to {path} ({size / 2**20:.1f} MiB)")
