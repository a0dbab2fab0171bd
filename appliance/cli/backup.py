"""`appliance backup`: take, list, check and restore backups of the store (store/backups.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from appliance import store
from appliance.cli.base import ask, cli, json_option, load_settings, opened_store, print_json, progress_bar
from appliance.core import config
from appliance.core.errors import BackupError, StoreError
from appliance.daemon import client
from appliance.store import backups, keys


@cli.group("backup")
def backup_group() -> None:
    """Online backups of the store: taken now or on the daemon's schedule, kept, checked, restored."""


@backup_group.command("now")
def backup_now() -> None:
    """Take a backup into the backup directory (backup.dir) while the appliance runs."""
    with opened_store() as opened, progress_bar("backing up") as progress:
        made, pruned = backups.create(opened, progress)
    click.echo(f"backup written to {made.path} ({made.bytes / 2**20:.1f} MiB, master key {made.key_fingerprint})")
    for path in pruned:
        click.echo(f"deleted {path.name} (backup.keep is {opened.settings.backup.keep})")


@backup_group.command("list")
@json_option
def backup_list(as_json: bool) -> None:
    """The backups, newest first, with the master key each one needs."""
    settings = load_settings()
    found = backups.list_backups(settings)
    current = _current_fingerprint(settings)
    if as_json:
        print_json({"directory": str(settings.backup_dir), "current_key_fingerprint": current,
                    "backups": [backup.summary() for backup in found]})
        return
    click.echo(f"backups in {settings.backup_dir}; the current master key is {current or 'unknown'}")
    if not found:
        click.echo("no backups yet: 'appliance backup now' takes one")
    for backup in found:
        if backup.problem:
            click.echo(f"{backup.path.name}  {backup.bytes / 2**20:8.1f} MiB  UNREADABLE: {backup.problem}")
            continue
        key = backup.key_fingerprint or "unknown"
        note = "" if current is None or key == current else "  (needs another key)"
        click.echo(f"{backup.path.name}  {backup.bytes / 2**20:8.1f} MiB  schema {backup.schema_version}  "
                   f"{backup.audit_records} audit records  key {key}{note}")


KEY_FILE = click.option("--key-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                        help="The key file the backup was taken under, where it is not this appliance's key (the key "
                             "before a rotation, or the old box's): 'appliance backup list' shows which one each needs.")


@backup_group.command("verify")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@KEY_FILE
@json_option
def backup_verify(file: Path, key_file: Path | None, as_json: bool) -> None:
    """Check a backup end to end without touching the store; exit 1 if any check fails."""
    settings = load_settings()
    passphrase = _passphrase(settings, key_file)
    with progress_bar("decrypting blobs") as progress:
        result = backups.verify(settings, _find(settings, file), passphrase, progress, master=_key(key_file))
    if as_json:
        print_json({"path": str(result.path), "ok": result.ok,
                    "checks": [{"check": name, "ok": ok, "detail": detail} for name, ok, detail in result.checks]})
    else:
        for name, ok, detail in result.checks:
            click.echo(f"{'ok' if ok else 'FAILED':6}  {name:9} {detail}")
        click.echo(f"backup {result.path.name} is {'good' if result.ok else 'NOT usable'}")
    if not result.ok:
        sys.exit(1)


@backup_group.command("restore")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@KEY_FILE
@click.option("--checkpoint", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="An audit checkpoint taken after the backup on the box it came from (its newest): the restore's"
                   " record says the log it gives up went that far, so the checkpoint is explained from then on.")
@click.option("--yes", is_flag=True, help="Restore without asking: what it undoes is still printed.")
def backup_restore(file: Path, key_file: Path | None, checkpoint: Path | None, yes: bool) -> None:
    """Replace the store of a stopped appliance with a backup, checked first; the old one is kept aside. With
    --key-file, the restored store is re-wrapped under this appliance's own key, which opens it from then on."""
    settings = load_settings()
    _refuse_while_running(settings)

    def confirmed(undone: backups.Undone) -> None:
        click.echo(f"\n{_undoing(undone, settings)}")
        ask("restore it?", yes)

    passphrase = _passphrase(settings, key_file)
    with progress_bar("checking the backup") as progress:
        restored = backups.restore(settings, _find(settings, file), passphrase, progress, backup_key=_key(key_file),
                                   checkpoint=checkpoint, confirm=confirmed)
    click.echo(f"restored {restored.backup.name}: the audit chain now ends at record {restored.audit_records}"
               + (f" (it stood at {restored.abandoned_head} before)" if restored.abandoned_head else ""))
    if restored.rewrapped:
        click.echo(f"re-wrapped under this appliance's master key {restored.rewrapped['to']} (the backup was under"
                   f" {restored.rewrapped['from']})")
    if restored.replaced:
        click.echo(f"the replaced database is kept as {restored.replaced}")


def _undoing(undone: backups.Undone, settings: config.Settings) -> str:
    """What a restore takes back, for the person to confirm: a revoked key or user comes back with it."""
    taken = f"{undone.backup.path.name} was taken {undone.backup.created_at:%Y-%m-%d %H:%M} UTC, at audit record" \
            f" {undone.backup.audit_records}"
    if not settings.db_path.exists():
        return f"{taken}; there is no store here yet"
    if undone.other_store is not None:
        return (f"{taken}, from another store ({undone.other_store}): everything in {settings.db_path}"
                f" ({undone.live_records} audit records) is set aside, not merged")
    if not undone.actions:
        return f"{taken}; nothing was done in the store since"
    done = ", ".join(f"{action} {count}" for action, count in undone.actions.items())
    return (f"{taken}; the store is at record {undone.live_records}. Undone by the restore, done since: {done}"
            " (a revoked key or user comes back: revoke it again after)")


def _passphrase(settings: config.Settings, key_file: Path | None) -> str | None:
    """APPLIANCE_PASSPHRASE, or typed unseen at a terminal where no key file or credential is there to open the
    backup (a passphrase store's): never on the command line."""
    given = os.environ.get("APPLIANCE_PASSPHRASE")
    if given is not None or key_file is not None or keys.stored_key(settings) is not None or not sys.stdin.isatty():
        return given
    return click.prompt("Passphrase", hide_input=True)


def _key(key_file: Path | None) -> keys.MasterKey | None:
    return None if key_file is None else keys.read_key_file(key_file)


def _find(settings: config.Settings, file: Path) -> Path:
    """A path as given, or the name of a backup in the backup directory."""
    in_dir = settings.backup_dir / file
    return in_dir if not file.exists() and file.parent == Path(".") and in_dir.exists() else file


def _current_fingerprint(settings: config.Settings) -> str | None:
    """The fingerprint of the key that opens the store, or on a box with no store yet (about to restore one) of the
    key it is set up with; None when neither can be told."""
    try:
        with store.open_read_only(settings, os.environ.get("APPLIANCE_PASSPHRASE")) as opened:
            return opened.master.fingerprint
    except StoreError:
        configured = keys.stored_key(settings) if not settings.db_path.exists() else None
        return configured.fingerprint if configured is not None else None


def _refuse_while_running(settings: config.Settings) -> None:
    """A restore under a running daemon would be undone by it, or worse: refuse while one answers or lives, or while
    a server started on its own (`appliance serve`) answers, which holds the store open as well."""
    pid = _daemon_pid(settings)
    if client.daemon_running(settings) or pid is not None:
        raise BackupError(
            "the appliance is running"
            + (f" (daemon pid {pid})" if pid else f" (it answers on {settings.socket_path})"),
            hint="stop it first ('appliance stop' or 'systemctl stop appliance'), then restore; nothing was changed")
    if client.inference_answers(settings):
        raise BackupError(f"an appliance server answers on {settings.inference_url}",
                          hint="stop it first ('appliance serve' started by hand: Ctrl-C), then restore; nothing was"
                               " changed")


def _daemon_pid(settings: config.Settings) -> int | None:
    try:
        pid = int(settings.pid_path.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"appliance" in cmdline else None
