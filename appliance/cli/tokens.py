"""`appliance api-keys`: create, list and revoke the keys the inference server asks for."""

from __future__ import annotations

import dataclasses

import click

from appliance.access import auth
from appliance.cli.base import cli, json_option, opened_store, print_json


@cli.group("api-keys")
def api_keys_group() -> None:
    """API keys for the inference server: stored hashed, scoped to models."""


@api_keys_group.command("create")
@click.argument("name")
@click.option("--model", "models", multiple=True, help="A model the key may call; repeat for more (default: all).")
@click.option("--feedback", "may_label", is_flag=True,
              help="The key may also send true labels for its predictions (POST /v1/feedback); they go into retraining.")
@json_option
def api_keys_create(name: str, models: tuple[str, ...], may_label: bool, as_json: bool) -> None:
    """Create a key for NAME; its token is printed this once only."""
    with opened_store() as opened:
        key, token = auth.create(opened, name, models or (auth.ALL_MODELS,), may_label=may_label)
    click.echo(
        f"API key {key.id} for {key.name}, models: {', '.join(key.models)}"
        f"{', may send true labels' if key.may_label else ''}."
        " The token is shown only this once: store it now, it cannot be read back.",
        err=True,
    )
    if as_json:
        print_json({**dataclasses.asdict(key), "token": token})
        return
    click.echo(token)


@api_keys_group.command("list")
@json_option
def api_keys_list(as_json: bool) -> None:
    """Every key with its models and when it was last used; no secrets."""
    with opened_store() as opened:
        found = auth.list_keys(opened)
    if as_json:
        print_json([dataclasses.asdict(key) for key in found])
        return
    if not found:
        click.echo("no API keys yet; 'appliance api-keys create NAME' makes one")
    for key in found:
        state = f"revoked {key.revoked_at}" if key.revoked_at else f"last used {key.last_used_at or 'never'}"
        labels = "labels" if key.may_label else "-"
        click.echo(f"{key.id}  {key.name:<20} {','.join(key.models):<24} {labels:<6} created {key.created_at}  {state}")


@api_keys_group.command("revoke")
@click.argument("key_id", metavar="ID")
def api_keys_revoke(key_id: str) -> None:
    """Revoke the key with this ID; requests with it fail from then on."""
    with opened_store() as opened:
        key = auth.revoke(opened, key_id)
    click.echo(f"API key {key.id} ({key.name}) revoked at {key.revoked_at}")
