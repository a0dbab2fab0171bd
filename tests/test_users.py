"""Control-API users against a real store and the real CLI: roles, tokens, revocation, the local admin file."""

from __future__ import annotations

import json
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from appliance import store
from appliance.access import auth, users
from appliance.core import config
from appliance.core.errors import AuthError, DaemonError, Forbidden, Unauthenticated
from appliance.store import Store, audit
from tests.conftest import run_cli
from tests.test_auth import _malformed


def _secret(token: str) -> str:
    return token[len(users.PREFIX) + 17 :]


def test_an_added_user_authenticates_with_the_token_returned_once(opened: Store) -> None:
    user, token = users.add(opened, "  alice ", "operator", actor="user:root")
    assert token.startswith(f"apu_{user.id}_") and len(user.id) == 16 and len(_secret(token)) == 43
    assert (user.name, user.role, user.last_used_at, user.revoked_at) == ("alice", "operator", None, None)
    found = users.authenticate(opened, token)
    assert (found.id, found.name, found.role) == (user.id, "alice", "operator") and found.last_used_at
    assert users.get(opened, user.id) == users.get(opened, token) == found  # a pasted token names its user
    record = audit.rows(opened, action="user.add")[-1]
    assert (record["object"], record["actor"], record["outcome"]) == (user.id, "user:root", "ok")
    assert json.loads(record["details"]) == {"name": "alice", "role": "operator"}


def test_the_secret_is_nowhere_in_the_database_or_the_audit_log(opened: Store, settings: config.Settings) -> None:
    made = [users.add(opened, f"user {n}", "viewer") for n in range(3)]
    for user, token in made:
        users.authenticate(opened, token)
        users.revoke(opened, user.id)
    stored = b"".join(
        path.read_bytes() for path in settings.db_path.parent.iterdir() if path.name.startswith(settings.db_path.name)
    )
    log = json.dumps(audit.rows(opened))
    assert all(user.id.encode() in stored and user.id in log for user, _ in made)  # the search sees what is there
    for user, token in made:
        for needle in (token, _secret(token), _secret(token)[:24]):
            assert needle.encode() not in stored and needle not in log and needle not in repr(user)


def test_list_shows_every_user_oldest_first_revoked_ones_too(opened: Store) -> None:
    assert users.list_users(opened) == []
    names = ["ann", "ben", "cat"]
    made = [users.add(opened, name, "viewer")[0] for name in names]
    users.revoke(opened, made[1].id)
    listed = users.list_users(opened)
    assert [user.name for user in listed] == names
    assert [user.revoked_at is not None for user in listed] == [False, True, False]


def test_a_revoked_user_is_unauthenticated_and_revoking_again_changes_nothing(opened: Store) -> None:
    user, token = users.add(opened, "leaked", "admin")
    revoked = users.revoke(opened, user.id, actor="user:security")
    assert revoked.revoked_at is not None
    with pytest.raises(Unauthenticated) as raised:
        users.authenticate(opened, token)
    assert raised.value.message == f"the token of user leaked was revoked at {revoked.revoked_at}"
    again = users.revoke(opened, token, actor="user:security")
    assert again.revoked_at == revoked.revoked_at
    records = audit.rows(opened, action="user.revoke")
    assert [(r["object"], r["actor"], r["outcome"]) for r in records] == [(user.id, "user:security", "ok")] * 2
    assert json.loads(records[-1]["details"])["already_revoked_at"] == revoked.revoked_at


def test_revoking_an_unknown_or_garbled_id_says_so_without_echoing_it(opened: Store) -> None:
    with pytest.raises(AuthError, match="no user with id 0123456789abcdef") as raised:
        users.revoke(opened, "0123456789abcdef")
    assert raised.value.hint and audit.rows(opened, action="user.revoke")[-1]["outcome"] == "failed"
    _, key_token = auth.create(opened, "app")
    for garbled in ("apu_nonsense", key_token):
        with pytest.raises(AuthError, match="not a user token id") as raised:
            users.get(opened, garbled)
        assert garbled not in raised.value.message and _secret(key_token) not in (raised.value.hint or "")


def test_missing_or_malformed_tokens_are_unauthenticated_and_nothing_else(opened: Store) -> None:
    _, token = users.add(opened, "app", "viewer")
    # The API-key suite's malformed tokens, moved to the user prefix: one parser refuses both kinds.
    moved = [users.PREFIX + c[4:] if isinstance(c, str) and c.startswith(auth.PREFIX) else c for c in _malformed(token)]
    for candidate in moved:
        with pytest.raises(Unauthenticated) as raised:
            users.authenticate(opened, candidate)  # type: ignore[arg-type]
        assert type(raised.value) is Unauthenticated, candidate
        assert _secret(token) not in raised.value.message + (raised.value.hint or "")
    assert users.authenticate(opened, token).name == "app"  # and the good one still works


def test_a_wrong_secret_or_an_unknown_id_is_not_valid(opened: Store) -> None:
    user, token = users.add(opened, "app", "viewer")
    flipped = token[:-1] + ("A" if token[-1] != "A" else "B")
    with pytest.raises(Unauthenticated, match=f"user token {user.id} is not valid"):
        users.authenticate(opened, flipped)
    other = "f" * 16 if user.id != "f" * 16 else "e" * 16
    with pytest.raises(Unauthenticated, match=f"user token {other} is not valid"):
        users.authenticate(opened, token.replace(user.id, other))
    assert users.get(opened, user.id).last_used_at is None  # failures are not uses


def test_an_api_key_never_opens_the_control_api_nor_a_user_token_the_server(opened: Store) -> None:
    key, key_token = auth.create(opened, "app")
    user, user_token = users.add(opened, "bob", "admin")
    with pytest.raises(Unauthenticated, match="malformed"):
        users.authenticate(opened, key_token)
    with pytest.raises(Unauthenticated, match="malformed"):
        auth.verify(opened, user_token, None)
    # Even a key's stored hash copied into the users table does not let its secret in: each kind has its own HMAC key.
    opened.db.execute(
        "INSERT INTO users (id, name, role, secret_hash, created_at)"
        " SELECT id, name, 'admin', secret_hash, created_at FROM api_keys WHERE id = ?",
        (key.id,),
    )
    with pytest.raises(Unauthenticated, match=f"user token {key.id} is not valid"):
        users.authenticate(opened, f"apu_{key.id}_{_secret(key_token)}")
    assert users.authenticate(opened, user_token).id == user.id


def test_each_role_may_do_what_the_ones_before_it_may() -> None:
    def user(role: str) -> users.User:
        return users.User("0" * 16, f"a {role}", role, "2026-01-01T00:00:00+00:00", None, None)

    for rank, role in enumerate(users.ROLES):
        assert [user(role).may(needed) for needed in users.ROLES] == [n <= rank for n in range(len(users.ROLES))]
        users.require(user(role), role)
    with pytest.raises(Forbidden, match=r"^user a viewer \(viewer\) may not do this: needs operator$") as raised:
        users.require(user("viewer"), "operator")
    assert raised.value.hint
    with pytest.raises(Forbidden, match=r"\(operator\) may not do this: needs admin"):
        users.require(user("operator"), "admin")


def test_an_unknown_role_is_refused_naming_the_roles(opened: Store) -> None:
    with pytest.raises(AuthError, match="there is no role 'root': the roles are viewer, operator, admin"):
        users.add(opened, "eve", "root")
    assert users.list_users(opened) == [] and audit.rows(opened, action="user.*") == []


@pytest.mark.parametrize("name", ["", "   ", "x" * 65, "line\nbreak"])
def test_a_user_needs_a_usable_name(opened: Store, name: str) -> None:
    with pytest.raises(AuthError, match="name must be 1 to 64 printable characters"):
        users.add(opened, name, "viewer")
    assert users.list_users(opened) == []


def test_last_used_is_written_at_most_once_a_minute(opened: Store) -> None:
    user, token = users.add(opened, "app", "viewer")
    first = users.authenticate(opened, token).last_used_at
    assert first is not None and users.get(opened, user.id).last_used_at == first
    changes = opened.db.conn.total_changes
    for _ in range(20):
        users.authenticate(opened, token)
    assert opened.db.conn.total_changes == changes  # no write on every call

    stale = (datetime.now(UTC) - timedelta(minutes=2)).isoformat(timespec="seconds")
    opened.db.execute("UPDATE users SET last_used_at = ? WHERE id = ?", (stale, user.id))
    refreshed = users.authenticate(opened, token).last_used_at
    assert refreshed > stale and users.get(opened, user.id).last_used_at == refreshed


# -- the local admin token file ------------------------------------------------------


def test_the_local_admin_token_file_is_private_reused_and_replaced_after_revoke(opened: Store, tmp_path: Path) -> None:
    path = tmp_path / "cli.token"
    old_umask = os.umask(0)  # the file must be 0600 by itself, not thanks to a strict umask
    try:
        first = users.local_admin_token(opened, path)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text().strip() == first
    admin = users.authenticate(opened, first)
    assert (admin.name, admin.role) == (users.LOCAL_ADMIN, "admin")
    assert audit.rows(opened, action="user.add")[-1]["actor"] == "daemon"

    assert users.local_admin_token(opened, path) == first
    assert len(users.list_users(opened)) == 1  # a restart reuses the user

    users.revoke(opened, admin.id)
    second = users.local_admin_token(opened, path)
    assert second != first and path.read_text().strip() == second
    assert users.authenticate(opened, second).role == "admin"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir() if "cli.token" in p.name) == ["cli.token"]  # no temp left


@pytest.mark.parametrize("garbled", [b"", b"not a token\n", b"\xff\xfe\x00binary", b"apu_0123456789abcdef_" + b"a" * 43])
def test_a_garbled_local_admin_token_file_is_replaced(opened: Store, tmp_path: Path, garbled: bytes) -> None:
    path = tmp_path / "cli.token"
    path.write_bytes(garbled)
    token = users.local_admin_token(opened, path)
    assert path.read_text().strip() == token and users.authenticate(opened, token).name == users.LOCAL_ADMIN
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_an_unwritable_local_admin_token_file_is_a_clear_error(opened: Store, tmp_path: Path) -> None:
    with pytest.raises(DaemonError, match="cannot write the local admin token to .*no such directory") as raised:
        users.local_admin_token(opened, tmp_path / "no such directory" / "cli.token")
    assert raised.value.hint


# -- the command -------------------------------------------------------------------


def test_cli_add_prints_the_token_once_and_list_never_shows_it(opened: Store, settings: config.Settings) -> None:
    opened.close()
    added = run_cli("users", "add", "frank", "--role", "operator", check=True)
    token = added.stdout.strip()
    assert token.startswith("apu_") and added.stdout.count("\n") == 1
    assert "shown only this once" in added.stderr and "read -rs APPLIANCE_TOKEN && export APPLIANCE_TOKEN" in added.stderr
    assert _secret(token) not in added.stderr
    user_id = token[4:20]

    listed = run_cli("users", "list", check=True).stdout
    assert user_id in listed and "frank" in listed and "operator" in listed and "never" in listed
    assert _secret(token) not in listed
    as_json = json.loads(run_cli("users", "list", "--json", check=True).stdout)
    assert [(u["id"], u["name"], u["role"]) for u in as_json] == [(user_id, "frank", "operator")]
    assert all("token" not in u and "secret_hash" not in u for u in as_json)

    revoked = run_cli("users", "revoke", token, check=True)  # a whole token names its user; it is not echoed
    assert f"user {user_id} (frank) revoked at" in revoked.stdout and _secret(token) not in revoked.stdout
    assert "revoked" in run_cli("users", "list", check=True).stdout

    with store.open(settings, None) as reopened:
        with pytest.raises(Unauthenticated, match="revoked"):
            users.authenticate(reopened, token)
        records = audit.rows(reopened, action="user.*")
    assert [(r["action"], r["object"], r["actor"]) for r in records] == [
        ("user.add", user_id, audit.default_actor()),
        ("user.revoke", user_id, audit.default_actor()),
    ]


def test_cli_refuses_a_bad_role_or_unknown_id_in_one_line(opened: Store) -> None:
    opened.close()
    bad_role = run_cli("users", "add", "gina", "--role", "root")
    assert bad_role.returncode == 1 and bad_role.stdout == ""
    assert bad_role.stderr == "error: there is no role 'root': the roles are viewer, operator, admin\n"
    unknown = run_cli("users", "revoke", "0123456789abcdef")
    assert unknown.returncode == 1 and "error: no user with id 0123456789abcdef" in unknown.stderr
    assert "Traceback" not in unknown.stderr and "internal error" not in unknown.stderr
    assert run_cli("users", "list", check=True).stdout.startswith("no users yet")
