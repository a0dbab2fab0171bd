"""`appliance keys`: create, rotate and inspect the master key."""

from __future__ import annotations

import os
from pathlib import Path

import click

from appliance import store
from appliance.cli.base import cli, json_option, load_settings, opened_store, print_json
from appliance.store import audit, lifecycle


@cli.group("keys")
def keys_group() -> None:
    """Create, rotate and inspect the master key."""


@keys_group.command("init")
@click.option("--passphrase", "use_passphrase", is_flag=True, help="Derive the key from a passphrase instead of a key file.")
def keys_init(use_passphrase: bool) -> None:
    """Create the master key (a 0600 key file by default) and the store."""
    passphrase = None
    if use_passphrase:
        passphrase = os.environ.get("APPLIANCE_PASSPHRASE") or click.prompt(
            "New passphrase", hide_input=True, confirmation_prompt=True
        )
    settings = load_settings()
    with lifecycle.init(settings, passphrase) as opened:
        click.echo(f"master key {opened.master.fingerprint} from {opened.master.source}")
        click.echo(f"store {settings.db_path} is ready; back the key up: without it nothing can be read")


@keys_group.command("rotate")
@click.option(
    "--new-key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the new key here (needed when the key comes from a systemd credential).",
)
def keys_rotate(new_key_file: Path | None) -> None:
    """Replace the master key; every data key is re-wrapped, no payload re-encrypted."""
    with opened_store() as opened:
        new_passphrase = None
        if opened.master.source == "passphrase":
            new_passphrase = os.environ.get("APPLIANCE_NEW_PASSPHRASE") or click.prompt(
                "New passphrase", hide_input=True, confirmation_prompt=True
            )
        result = lifecycle.rotate(opened, new_passphrase=new_passphrase, new_key_file=new_key_file)
    click.echo(f"rotated master key {result.old_fingerprint} -> {result.new_fingerprint}")
    click.echo(f"re-wrapped {result.rewrapped} data keys; the new key is at {result.new_key_at}")


@keys_group.command("status")
@json_option
def keys_status(as_json: bool) -> None:
    """Show where the master key comes from and whether it opens the store."""
    with opened_store() as opened:
        status = {
            "source": opened.master.source,
            "fingerprint": opened.master.fingerprint,
            "opens_store": True,
            "store_id": opened.store_id,
            "data_keys": opened.db.execute("SELECT COUNT(*) FROM blobs").fetchone()[0],
            "last_rotation": _last_time(opened, "keys.rotate"),
        }
    if as_json:
        print_json(status)
        return
    for name, value in status.items():
        click.echo(f"{name:14} {value if value is not None else '-'}")


def _last_time(opened: store.Store, action: str) -> str | None:
    found = audit.rows(opened, action=action, limit=1)
    return found[0]["ts"] if found else None
