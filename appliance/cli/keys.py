"""`appliance keys`: create, rotate and inspect the master key."""

from __future__ import annotations

from pathlib import Path

import click

from appliance import store
from appliance.cli.base import cli, json_option, load_settings, opened_store, passphrase_from, print_json
from appliance.core.errors import StoreError
from appliance.store import audit, backups, lifecycle


@cli.group("keys")
def keys_group() -> None:
    """Create, rotate and inspect the master key."""


@keys_group.command("init")
@click.option("--passphrase", "use_passphrase", is_flag=True, help="Derive the key from a passphrase instead of a key file.")
def keys_init(use_passphrase: bool) -> None:
    """Create the master key (a 0600 key file by default) and the store."""
    passphrase = passphrase_from("APPLIANCE_PASSPHRASE", "New passphrase", confirm=True) if use_passphrase else None
    settings = load_settings()
    with lifecycle.init(settings, passphrase) as opened:
        click.echo(f"master key {opened.master.fingerprint} from {opened.master.source}")
        click.echo(f"store {settings.db_path} is ready; back the key up: without it nothing can be read")


@keys_group.command("rotate")
@click.option(
    "--new-key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Only for a key from a systemd credential, which the appliance cannot rewrite: write the new key to this "
         "new file (in a folder that exists), then install it as the credential.",
)
def keys_rotate(new_key_file: Path | None) -> None:
    """Replace the master key; every data key is re-wrapped, no payload re-encrypted."""
    with opened_store() as opened:
        if new_key_file is not None:
            _check_new_key_file(opened.master.source, new_key_file)
        new_passphrase = None
        if opened.master.source == "passphrase":
            new_passphrase = passphrase_from("APPLIANCE_NEW_PASSPHRASE", "New passphrase", confirm=True)
        result = lifecycle.rotate(opened, new_passphrase=new_passphrase, new_key_file=new_key_file)
    click.echo(f"rotated master key {result.old_fingerprint} -> {result.new_fingerprint}")
    click.echo(f"re-wrapped {result.rewrapped} data keys; the new key is at {result.new_key_at}")
    if new_key_file is not None:
        click.echo("only it opens the store now: install it as the credential master.key (over the file "
                   "LoadCredential= names, and keys.file if that names another) before the service starts again")
    if opened.master.source != "passphrase":
        click.echo("copy the new key off this box now, as you did the old one: a backup from now on needs it")
    older = [found for found in backups.list_backups(opened.settings) if found.key_fingerprint == result.old_fingerprint]
    if older:
        click.echo(f"{len(older)} backup{'s' * (len(older) != 1)} in {opened.settings.backup_dir} still"
                   f" need{'s' * (len(older) == 1)} the old key"
                   f" {result.old_fingerprint}: keep your copy of it while they are kept ('appliance backup restore"
                   " FILE --key-file OLD' re-wraps one), or take one under the new key now ('appliance backup now')")


def _check_new_key_file(source: str, path: Path) -> None:
    """A new key goes elsewhere only from a credential: a key file or passphrase is replaced where the appliance
    reads it, and a key written anywhere else would leave every later command with a key that no longer opens."""
    if not source.startswith("systemd credential"):
        raise StoreError(f"--new-key-file is only for a master key from a systemd credential; this one is from the"
                         f" {source}", hint="leave out --new-key-file: the rotation then replaces the key where the"
                         " appliance reads it, so later commands find it")
    if not path.parent.is_dir():
        raise click.BadParameter(f"the folder {path.parent} does not exist", param_hint="--new-key-file")


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
