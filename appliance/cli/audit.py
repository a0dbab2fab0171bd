"""`appliance audit`: read, verify and export the tamper-evident audit log."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import TextIO

import click

from appliance.cli.base import ask, cli, json_option, opened_store, print_json, yes_option
from appliance.cli.connect import connected
from appliance.core import files
from appliance.core.errors import ApplianceError
from appliance.core.text import printable
from appliance.store import alerts, anchor, audit


@cli.group("audit")
def audit_group() -> None:
    """Read, verify and export the tamper-evident audit log."""


@audit_group.command("list")
@click.option("--since", help="Only records since then: 2026-11-01, 2026-11-01T08:00, or 30m, 12h, 7d.")
@click.option("--actor", help="Only records by this actor, e.g. user:alice.")
@click.option("--action", help="Only this action; globs work: 'keys.*'.")
@click.option("--limit", type=click.IntRange(min=1, max=audit.LIST_MAX),
              help=f"At most this many (the newest); through a daemon, {audit.LIST_MAX} without it.")
@json_option
def audit_list(since: str | None, actor: str | None, action: str | None, limit: int | None, as_json: bool) -> None:
    """List audit records, oldest first (through a daemon, with a viewer's token: no key needed)."""
    _parse_since(since)  # a mistake is told here, before anything is asked
    with connected() as appliance:
        found = appliance.audit_records(since, actor, action, limit)
    if as_json:
        print_json(found)
        return
    if not found:
        click.echo("no audit records match")
    for row in found:
        click.echo(printable(f"{row['seq']:>6}  {row['ts'][:19]}  {row['actor']:<16} {row['action']:<18} "
                             f"{row['outcome']:<6} {row['object']}"))


def _parse_since(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return audit.parse_since(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from exc


CHECKPOINT_HINT = "give a file written by 'appliance audit checkpoint'"


@audit_group.command("verify")
@click.option(
    "--checkpoint",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Also check the chain against a checkpoint exported earlier.",
)
@json_option
def audit_verify(checkpoint: Path | None, as_json: bool) -> None:
    """Check every record, the chain and its anchored head; exit 1 on any tampering."""
    if checkpoint is not None:
        check_is_checkpoint(checkpoint)
    with opened_store() as opened:
        result = alerts.check_audit(opened, checkpoint)
    if as_json:
        print_json(result.__dict__)
    else:
        show_verification(result)
    if not result.ok:
        sys.exit(1)


def check_is_checkpoint(path: Path) -> None:
    """Refuse a file that is no checkpoint at all (signed by the key inside it) before the log is checked against
    it: a wrong file is the operator's mistake, not a tampered log, and raises no alert."""
    try:
        files.regular_file(path, "the audit checkpoint", files.MAX_SMALL_FILE, over=CHECKPOINT_HINT)
    except ApplianceError as exc:
        raise click.BadParameter(f"{exc.message}; {exc.hint}", param_hint="--checkpoint") from None
    if anchor.signed_checkpoint(path) is None:
        raise click.BadParameter(f"{path} is not a signed audit checkpoint; {CHECKPOINT_HINT}",
                                 param_hint="--checkpoint")


def show_verification(result: audit.Verification) -> None:
    if result.ok:
        click.echo(f"audit log OK: {result.records} records, chain and anchored head intact")
        if result.rewound:
            click.echo(f"but {result.rewound}: check that this rewind was made on purpose", err=True)
    else:
        click.echo(f"AUDIT LOG TAMPERED: {result.problem}", err=True)
        if result.first_bad is not None:
            click.echo(f"first bad record: {result.first_bad}", err=True)


@audit_group.command("accept-rewind")
@click.option("--reason", required=True, help="Why the log is shorter or older than its anchor; kept in the record.")
@yes_option
def audit_accept_rewind(reason: str, yes: bool) -> None:
    """Accept that the audit log was cut or an older database put back: audited, then the appliance writes again."""
    with opened_store() as opened:
        problem = audit.divergence(opened)
        if problem is None:
            click.echo("the audit log agrees with its head file: there is no rewind to accept")
            return
        click.echo(problem, err=True)
        ask("Record this rewind as accepted, and let the appliance write again?", yes)
        accepted = audit.accept_rewind(opened, reason)
    lost = accepted["abandoned_head"]
    click.echo("rewind accepted and recorded as audit.rewind_accepted"
               + (f"; records after {accepted['log_tail']['seq'] if accepted['log_tail'] else 0} up to {lost['seq']}"
                  " are gone for good" if lost else ""))


@audit_group.command("export")
@click.option("--format", "fmt", type=click.Choice(["jsonl"]), default="jsonl", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here instead of stdout.")
def audit_export(fmt: str, output: Path | None) -> None:
    """Export every record, one JSON object per line."""
    with opened_store() as opened:
        lines = audit.export_jsonl(opened)
        if output is None:
            for line in lines:
                click.echo(line)
        else:
            with _new_private(output) as f:
                for line in lines:
                    f.write(line + "\n")
        audit.record(opened, "audit.export", str(output or "stdout"), format=fmt)


@audit_group.command("checkpoint")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here instead of stdout.")
def audit_checkpoint(output: Path | None) -> None:
    """Export the signed head of the chain, to keep somewhere the appliance cannot write."""
    target = _new_private(output) if output is not None else None  # made before the checkpoint is on the record
    try:
        with opened_store() as opened:
            head = audit.checkpoint(opened)
    except BaseException:
        if target is not None and output is not None:
            target.close()
            output.unlink()
        raise
    text = json.dumps(head.__dict__, indent=2) + "\n"
    if target is None:
        click.echo(text, nl=False)
        return
    with target:
        target.write(text)
    click.echo(f"checkpoint of record {head.seq} written to {output}", err=True)


def _new_private(path: Path) -> TextIO:
    """A new file only its owner can read (an export holds who did what); an existing one is never overwritten."""
    try:
        return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w")
    except FileExistsError:
        raise click.ClickException(f"{path} already exists; exports never overwrite a file") from None
    except OSError as exc:
        raise click.ClickException(f"cannot create {path}: {exc.strerror}; name a new file in a folder that exists"
                                   " and that you may write to") from None
