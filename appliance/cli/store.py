"""`appliance store`: the database itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from appliance.cli.base import cli, json_option, opened_store, print_json, progress_bar
from appliance.core.hardware import format_bytes
from appliance.store import backups, lifecycle, space


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
    shown = dict(details)
    used, per_day, days = shown.pop("space"), shown.pop("growth_bytes_per_day"), shown.pop("growth_days")
    for name, value in shown.items():
        click.echo(f"{name:16} {value}")
    free = used["free_bytes"]
    whither = ("the daemon gives them back to the disk" if used["free_pages_go_back"]
               else "'appliance store compact' gives them back to the disk")
    click.echo(f"{'space':16} {format_bytes(details['file_bytes'])} in the file, {format_bytes(free)} of it free"
               f"{f' ({whither})' if free else ''}")
    for kind, count in used["by_kind"].items():
        click.echo(f"  {kind:18} {format_bytes(count):>10}")
    click.echo(f"{'growth':16} " + ("not known yet: the daemon records the size once a day" if per_day is None else
                                    f"{'+' if per_day >= 0 else '-'}{format_bytes(abs(per_day))} a day over the last"
                                    f" {days} day{'s' * (days != 1)}"))


@store_group.command("compact")
def store_compact() -> None:
    """Rewrite the database without its free pages (once; then the daemon keeps giving them back)."""
    with opened_store() as opened:
        click.echo("compacting the store: writers wait until it is done (a few seconds per GiB)", err=True)
        before, after = space.compact(opened)
    click.echo(f"compacted: {format_bytes(before)} -> {format_bytes(after)}; free pages now go back to the disk"
               " as they are freed")


@store_group.command("backup")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def store_backup(path: Path) -> None:
    """Copy the store to PATH while it runs; the copy opens with the same key."""
    with opened_store() as opened, progress_bar("backing up") as progress:
        size = backups.copy(opened, path, progress)
    click.echo(f"backup written to {path} ({size / 2**20:.1f} MiB)")
