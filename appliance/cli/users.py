"""`appliance users`: who may use the daemon's control API, and with which role."""

from __future__ import annotations

import dataclasses

import click

from appliance.access import users
from appliance.cli.base import cli, json_option, opened_store, print_json


@cli.group("users")
def users_group() -> None:
    """Control-API users: viewer reads, operator runs jobs and deploys, admin manages users and keys."""


@users_group.command("add")
@click.argument("name")
@click.option("--role", required=True, metavar="{" + ",".join(sorted(users.ROLES)) + "}", help="What the user may do.")
def users_add(name: str, role: str) -> None:
    """Add a user with ROLE; their token is printed this once only."""
    with opened_store() as opened:
        user, token = users.add(opened, name, role)  # checks the role: one clear line, not a usage screen
    click.echo(
        f"user {user.id} ({user.name}, {user.role}). The token is shown only this once: hand it over now,"
        f" it cannot be read back. The user sets it unseen and out of the shell's history with:"
        " read -rs APPLIANCE_TOKEN && export APPLIANCE_TOKEN (then pastes it)",
        err=True,
    )
    click.echo(token)


@users_group.command("list")
@json_option
def users_list(as_json: bool) -> None:
    """Every user with their role and when they last called; no secrets."""
    with opened_store() as opened:
        found = users.list_users(opened)
    if as_json:
        print_json([dataclasses.asdict(user) for user in found])
        return
    if not found:
        click.echo("no users yet; the daemon makes a local admin when it starts")
    for user in found:
        state = f"revoked {user.revoked_at}" if user.revoked_at else f"last call {user.last_used_at or 'never'}"
        click.echo(f"{user.id}  {user.name:<20} {user.role:<9} created {user.created_at}  {state}")


@users_group.command("revoke")
@click.argument("user_id", metavar="ID")
def users_revoke(user_id: str) -> None:
    """Revoke the user with this ID (or whole token); their calls fail from then on."""
    with opened_store() as opened:
        user = users.revoke(opened, user_id)
    click.echo(f"user {user.id} ({user.name}) revoked at {user.revoked_at}")
