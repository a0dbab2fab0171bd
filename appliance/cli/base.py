"""The root `appliance` group and what every command shares: settings, the open store, output."""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import click
from pydantic import BaseModel

from appliance import store
from appliance.core import config, logs, schema
from appliance.core.errors import KeyMissing
from appliance.daemon import client


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


@cli.command()
def version() -> None:
    """Print the appliance version."""
    click.echo(f"appliance {metadata.version('appliance')}")


def load_settings() -> config.Settings:
    return config.load(click.get_current_context().find_root().obj)


class FiniteRange(click.FloatRange):
    """click's FloatRange, which lets 'nan' through every bound (no comparison with it is true), and 'inf' past a
    missing one; neither is a setting anyone means."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def schema_option(model: type[BaseModel], field: str, *decls: str, **attrs: Any) -> Callable[[Callable], Callable]:
    """A click option for a field of a typed schema: its choices or range and its default are the schema's, so
    the command line takes what a job through the daemon takes."""
    info = model.model_fields[field]
    kind = schema.bare(info)
    if get_origin(kind) is Literal:
        attrs["type"] = click.Choice(get_args(kind))
    else:
        limits = schema.bounds(info)
        attrs["type"] = (click.IntRange if kind is int else FiniteRange)(
            limits.low, limits.high, min_open=limits.low_open, max_open=limits.high_open)
    if not info.is_required() and info.default is not None and "default" not in attrs:
        attrs.update(default=info.default, show_default=True)
    return click.option(*decls, **attrs)


def alias(group: click.Group, command: click.Command, name: str) -> None:
    """Another name for a command (data rm for data delete), left out of the help's list."""
    twin = copy.copy(command)
    twin.hidden = True
    group.add_command(twin, name)


def deployment(version: str, deployed: dict[str, str]) -> str:
    """What operations.deploy decided for a new version, and the command that takes it further."""
    model = version.partition(":")[0]
    return f"{version} " + {
        "production": "serves in production",
        "canary": f"serves as a canary: 'appliance deploy {version}' promotes it, 'appliance rollback {model}' ends it",
        "waits": f"is not deployed: 'appliance deploy {version}' serves it"}[deployed["how"]] + f" ({deployed['reason']})"


# The flag of the commands that run a service; the command takes it as log_format and calls log_as_service().
log_format_option = click.option("--log-format", type=click.Choice(logs.FORMATS), default="text", show_default=True,
                                 help="text: journald-friendly lines; json: one object per line.")


def log_as_service(log_format: str) -> None:
    """Log as a service does, for journald, from INFO (the access log's lines too), not as a command at a terminal."""
    logging.getLogger().handlers.clear()  # main() set up terminal logging
    logs.setup(log_format)


# The flag of every command that can print JSON instead of lines for people; the command takes it as as_json.
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


# The flag of every command that asks before it changes something that cannot be undone.
yes_option = click.option("--yes", is_flag=True, help="Do not ask for confirmation.")


def ask(question: str, yes: bool) -> None:
    """Go on when --yes was given or the person at the terminal agrees; with no terminal to ask at, say to give --yes."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise click.UsageError("give --yes to do this without a terminal to confirm at")
    click.confirm(question, abort=True)


def passphrase_from(env: str, prompt: str, *, confirm: bool = False) -> str:
    """A passphrase from the environment variable env, else typed unseen at the terminal; with no terminal to ask at,
    a usage error that names env (getpass would only warn that it echoes, read nothing and abort)."""
    given = os.environ.get(env)
    if given is not None:
        return given
    if not sys.stdin.isatty():
        raise click.UsageError(f"no terminal to ask for the passphrase at: set {env}")
    return click.prompt(prompt, hide_input=True, confirmation_prompt=confirm)


@contextmanager
def opened_store() -> Iterator[store.Store]:
    """The unlocked store; a passphrase comes from APPLIANCE_PASSPHRASE or, at a terminal, a prompt."""
    settings = load_settings()
    passphrase = os.environ.get("APPLIANCE_PASSPHRASE")
    try:
        opened = store.open(settings, passphrase)
    except KeyMissing:
        if passphrase is not None or not sys.stdin.isatty():
            raise
        opened = store.open(settings, click.prompt("Passphrase", hide_input=True))
    with opened:
        yield opened


@contextmanager
def daemon_client() -> Iterator[client.Client | None]:
    """The running daemon's control API, or None when no daemon answers: then commands use the store."""
    settings = load_settings()
    if not client.daemon_running(settings):
        yield None
        return
    with client.Client(settings) as api:
        yield api


def say_trust(trusted: str | None, noun: str) -> None:
    """What a signed set's check proves about who signed it (store/signed.py): the key's vouchers, or that none."""
    if trusted:
        click.echo(f"the key is vouched for by {trusted}")
    else:
        click.echo(f"note: the key is the one inside the {noun}, so this proves the {noun} is intact, not who made it;"
                   " give --checkpoint or --public-key to check the key too")


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


@contextmanager
def progress_bar(label: str) -> Iterator[Callable[..., None]]:
    """A progress bar on stderr, fed with (done, total) and, when it changes, a new label."""
    with click.progressbar(length=1, label=label, file=sys.stderr) as bar:

        def update(done: int, total: int, label: str | None = None) -> None:
            bar.length = max(total, 1)
            if label is not None:
                bar.label = label
            bar.update(done - bar.pos)

        yield update
        bar.update(bar.length - bar.pos)  # what ended without an error is done: a store with no blobs to read too
