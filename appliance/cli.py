"""The `appliance` command.

Each command loads the settings, calls one thing, and prints its result; main() is
the one place that turns an ApplianceError into a message and an exit code
(0 ok, 1 failed, 2 usage).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

import click

from appliance import config, store
from appliance.errors import ApplianceError, KeyMissing
from appliance.store import audit, keys, lifecycle


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML config file (default: $APPLIANCE_CONFIG, else /etc/appliance/appliance.toml).",
)
@click.pass_context
def cli(ctx: click.Context, config_file: Path | None) -> None:
    """The appliance: fine-tune, optimise and serve models on this server."""
    ctx.obj = config_file


def _settings() -> config.Settings:
    return config.load(click.get_current_context().find_root().obj)


@contextmanager
def _opened() -> Iterator[store.Store]:
    """The unlocked store; a passphrase comes from APPLIANCE_PASSPHRASE or, at a terminal, a prompt."""
    settings = _settings()
    passphrase = os.environ.get("APPLIANCE_PASSPHRASE")
    try:
        opened = store.open(settings, passphrase)
    except KeyMissing:
        if passphrase is not None or not sys.stdin.isatty():
            raise
        opened = store.open(settings, click.prompt("Passphrase", hide_input=True))
    with opened:
        yield opened


def _print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


@cli.command()
def version() -> None:
    """Print the appliance version."""
    click.echo(f"appliance {metadata.version('appliance')}")


@cli.command()
def quickstart() -> None:
    """Set up the store on first use (key, database) and show its state."""
    settings = _settings()
    if not settings.key_file.exists() and not os.environ.get("APPLIANCE_PASSPHRASE"):
        with lifecycle.init(settings):
            click.echo(f"created the master key at {settings.key_file} (mode 0600)")
            click.echo("  back it up somewhere safe: without it nothing in the store can be read")
    with _opened() as opened:
        _show_info(lifecycle.info(opened))
        _show_verification(audit.verify(opened))


# -- keys --------------------------------------------------------------------------


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
    settings = _settings()
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
    with _opened() as opened:
        new_passphrase = None
        if opened.master.source == "passphrase":
            new_passphrase = os.environ.get("APPLIANCE_NEW_PASSPHRASE") or click.prompt(
                "New passphrase", hide_input=True, confirmation_prompt=True
            )
        result = lifecycle.rotate(opened, new_passphrase=new_passphrase, new_key_file=new_key_file)
    click.echo(f"rotated master key {result.old_fingerprint} -> {result.new_fingerprint}")
    click.echo(f"re-wrapped {result.rewrapped} data keys; the new key is at {result.new_key_at}")


@keys_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def keys_status(as_json: bool) -> None:
    """Show where the master key comes from and whether it opens the store."""
    with _opened() as opened:
        status = {
            "source": opened.master.source,
            "fingerprint": opened.master.fingerprint,
            "opens_store": True,
            "store_id": opened.store_id,
            "data_keys": opened.db.execute("SELECT COUNT(*) FROM blobs").fetchone()[0],
            "last_rotation": _last_time(opened, "keys.rotate"),
        }
    if as_json:
        _print_json(status)
        return
    for name, value in status.items():
        click.echo(f"{name:14} {value if value is not None else '-'}")


def _last_time(opened: store.Store, action: str) -> str | None:
    found = audit.rows(opened, action=action, limit=1)
    return found[0]["ts"] if found else None


# -- audit -------------------------------------------------------------------------


@cli.group("audit")
def audit_group() -> None:
    """Read, verify and export the tamper-evident audit log."""


@audit_group.command("list")
@click.option("--since", help="Only records since then: 2026-11-01, 2026-11-01T08:00, or 30m, 12h, 7d.")
@click.option("--actor", help="Only records by this actor, e.g. user:alice.")
@click.option("--action", help="Only this action; globs work: 'keys.*'.")
@click.option("--limit", type=click.IntRange(min=1), help="At most this many (the newest).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def audit_list(since: str | None, actor: str | None, action: str | None, limit: int | None, as_json: bool) -> None:
    """List audit records, oldest first."""
    with _opened() as opened:
        found = audit.rows(opened, since=_parse_since(since), actor=actor, action=action, limit=limit)
    if as_json:
        _print_json([{**row, "details": json.loads(row["details"])} for row in found])
        return
    if not found:
        click.echo("no audit records match")
    for row in found:
        click.echo(f"{row['seq']:>6}  {row['ts'][:19]}  {row['actor']:<16} {row['action']:<18} {row['outcome']:<6} {row['object']}")


def _parse_since(text: str | None) -> datetime | None:
    if text is None:
        return None
    relative = re.fullmatch(r"(\d+)([mhd])", text.strip())
    if relative:
        amount, unit = int(relative[1]), relative[2]
        return datetime.now(UTC) - timedelta(**{{"m": "minutes", "h": "hours", "d": "days"}[unit]: amount})
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither a date (2026-11-01) nor an age (30m, 12h, 7d)", param_hint="--since")
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@audit_group.command("verify")
@click.option(
    "--checkpoint",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Also check the chain against a checkpoint exported earlier.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def audit_verify(checkpoint: Path | None, as_json: bool) -> None:
    """Check every record, the chain and its anchored head; exit 1 on any tampering."""
    with _opened() as opened:
        result = audit.verify(opened, checkpoint)
        audit.record(opened, "audit.verify", opened.store_id, ok=result.ok, first_bad=result.first_bad)
    if as_json:
        _print_json(result.__dict__)
    else:
        _show_verification(result)
    if not result.ok:
        sys.exit(1)


def _show_verification(result: audit.Verification) -> None:
    if result.ok:
        click.echo(f"audit log OK: {result.records} records, chain and anchored head intact")
    else:
        click.echo(f"AUDIT LOG TAMPERED: {result.problem}", err=True)
        if result.first_bad is not None:
            click.echo(f"first bad record: {result.first_bad}", err=True)


@audit_group.command("export")
@click.option("--format", "fmt", type=click.Choice(["jsonl"]), default="jsonl", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here instead of stdout.")
def audit_export(fmt: str, output: Path | None) -> None:
    """Export every record, one JSON object per line."""
    with _opened() as opened:
        lines = audit.export_jsonl(opened)
        if output is None:
            for line in lines:
                click.echo(line)
        else:
            with output.open("x") as f:
                for line in lines:
                    f.write(line + "\n")
        audit.record(opened, "audit.export", str(output or "stdout"), format=fmt)


@audit_group.command("checkpoint")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here instead of stdout.")
def audit_checkpoint(output: Path | None) -> None:
    """Export the signed head of the chain, to keep somewhere the appliance cannot write."""
    with _opened() as opened:
        head = audit.checkpoint(opened)
    text = json.dumps(head.__dict__, indent=2) + "\n"
    if output is None:
        click.echo(text, nl=False)
    else:
        with output.open("x") as f:
            f.write(text)
        click.echo(f"checkpoint of record {head.seq} written to {output}", err=True)


# -- store -------------------------------------------------------------------------


@cli.group("store")
def store_group() -> None:
    """Inspect and back up the database."""


@store_group.command("info")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def store_info(as_json: bool) -> None:
    """Sizes, counts and SQLite's integrity check."""
    with _opened() as opened:
        details = lifecycle.info(opened)
    if as_json:
        _print_json(details)
    else:
        _show_info(details)


def _show_info(details: dict[str, Any]) -> None:
    for name, value in details.items():
        click.echo(f"{name:16} {value}")


@store_group.command("backup")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def store_backup(path: Path) -> None:
    """Copy the store to PATH while it runs; the copy opens with the same key."""
    with _opened() as opened, click.progressbar(length=1, label="backing up", file=sys.stderr) as bar:

        def progress(done: int, total: int) -> None:
            bar.length = total
            bar.update(done - bar.pos)

        size = lifecycle.backup(opened, path, progress)
    click.echo(f"backup written to {path} ({size / 2**20:.1f} MiB)")


def main() -> None:
    """Entry point: run the command, turn errors into messages and exit codes."""
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    try:
        cli.main(prog_name="appliance", standalone_mode=False)
    except ApplianceError as exc:
        click.echo(f"error: {exc.message}", err=True)
        if exc.hint:
            click.echo(f"  hint: {exc.hint}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except Exception as exc:  # a bug: say so plainly, keep the traceback for whoever debugs it
        if os.environ.get("APPLIANCE_DEBUG"):
            raise
        click.echo(f"internal error: {type(exc).__name__}: {exc}", err=True)
        click.echo("  hint: this is a bug; run again with APPLIANCE_DEBUG=1 for the traceback", err=True)
        sys.exit(1)
