"""Control-API users against a real store and the real CLI: roles, tokens, revocation, the local admin file."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from appliance import auth, users
from appliance.errors import AuthError, Forbidden, Unauthenticated
from appliance.store import Store, audit
from tests.conftest import run_cli


def test_a_user_token_authenticates_until_revoked(opened: Store) -> None:
    user, token = users.add(opened, "alice", "operator", actor="user:root")
    assert token.startswith("apu_") and user.role == "operator"
    assert users.authenticate(opened, token).last_used_at is not None
    users.revoke(opened, user.id)
    with pytest.raises(Unauthenticated, match="revoked"):
        users.authenticate(opened, token)
    assert [(row["action"], row["actor"]) for row in audit.rows(opened, action="user.*")] == [
        ("user.add", "user:root"), ("user.revoke", audit.default_actor())]


@pytest.mark.parametrize("token", [None, "", "apu_nothex_x", "apl_0123456789abcdef_" + "a" * 43])
def test_missing_malformed_or_foreign_tokens_are_unauthenticated(opened: Store, token: str | None) -> None:
    with pytest.raises(Unauthenticated):
        users.authenticate(opened, token)


def test_an_api_key_secret_never_opens_the_control_api(opened: Store) -> None:
    """The same secret under the other prefix must not verify: each kind derives its own HMAC key."""
    _, key_token = auth.create(opened, "app")
    user, _ = users.add(opened, "bob", "admin")
    forged = f"apu_{user.id}_{key_token[len('apl_') + 17:]}"  # the key's secret under the user's id
    with pytest.raises(Unauthenticated, match="not valid"):
        users.authenticate(opened, forged)


def test_roles_are_ordered(opened: Store) -> None:
    viewer, _ = users.add(opened, "carol", "viewer")
    admin, _ = users.add(opened, "dave", "admin")
    assert admin.may("operator") and admin.may("viewer") and not viewer.may("operator")
    with pytest.raises(Forbidden, match="carol \\(viewer\\) may not do this: it needs the operator role") as raised:
        users.require(viewer, "operator")
    assert raised.value.status == 403
    with pytest.raises(AuthError, match="there is no role 'root'"):
        users.add(opened, "eve", "root")


def test_the_local_admin_token_file_is_private_reused_and_replaced_after_revoke(opened: Store, tmp_path: Path) -> None:
    path = tmp_path / "cli.token"
    first = users.local_admin_token(opened, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert users.local_admin_token(opened, path) == first
    users.revoke(opened, users.authenticate(opened, first).id)
    second = users.local_admin_token(opened, path)
    assert second != first and users.authenticate(opened, second).role == "admin"


def test_the_cli_prints_the_token_once_and_never_lists_it() -> None:
    run_cli("keys", "init", check=True)
    added = run_cli("users", "add", "frank", "--role", "viewer", check=True)
    token = added.stdout.strip()
    assert token.startswith("apu_") and "shown only this once" in added.stderr
    listed = run_cli("users", "list", check=True).stdout
    assert "frank" in listed and "viewer" in listed and token[len('apu_') + 17:] not in listed
    bad = run_cli("users", "add", "gina", "--role", "root")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    revoked = run_cli("users", "revoke", token, check=True)  # a whole token names its user; it is not echoed
    assert "revoked" in revoked.stdout and token not in revoked.stdout
