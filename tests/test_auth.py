"""API keys: hashed at rest, scoped to models, revocable; every bad token is a 401, never a crash."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from appliance.access import auth
from appliance.core.errors import AuthError, Forbidden, RegistryError, Unauthenticated
from appliance.store import Store, audit, migrations
from tests.conftest import run_cli


def test_a_created_token_verifies_as_its_key(opened: Store) -> None:
    key, token = auth.create(opened, "billing app", ["tickets"])
    assert token.startswith(f"apl_{key.id}_") and len(key.id) == 16 and len(token) == 4 + 16 + 1 + 43
    found = auth.verify(opened, token, "tickets")
    assert (found.id, found.name, found.models) == (key.id, "billing app", ("tickets",))
    assert auth.verify(opened, token, None).id == key.id  # None: any valid key
    assert auth.list_keys(opened)[0].id == key.id
    record = audit.rows(opened, action="apikey.create")[-1]
    assert record["object"] == key.id and json.loads(record["details"]) == {
        "name": "billing app", "models": ["tickets"], "may_label": False}
    assert not key.may_label and auth.create(opened, "crm", may_label=True)[0].may_label  # labels: when made to


def test_keys_made_before_the_right_to_label_existed_keep_it(opened: Store) -> None:
    key, _ = auth.create(opened, "old app")
    opened.db.execute("ALTER TABLE api_keys DROP COLUMN may_label")  # as schema 15 left the table
    opened.db.execute("DELETE FROM schema_version WHERE version = 16")
    migrations.migrate(opened.db)
    assert auth.get(opened, key.id).may_label


def test_two_keys_never_share_id_or_token(opened: Store) -> None:
    (a, token_a), (b, token_b) = auth.create(opened, "a"), auth.create(opened, "b")
    assert a.id != b.id and token_a.split("_", 2)[2] != token_b.split("_", 2)[2]
    assert auth.verify(opened, token_a, None).id == a.id and auth.verify(opened, token_b, None).id == b.id


def test_a_key_calls_only_the_models_it_lists(opened: Store) -> None:
    _, scoped = auth.create(opened, "scoped", ["tickets", "intent"])
    _, everything = auth.create(opened, "admin")  # the default is every model
    assert auth.verify(opened, scoped, "intent").name == "scoped"
    assert auth.verify(opened, scoped, "tickets:3").name == "scoped"  # a version or alias of a listed model
    with pytest.raises(Forbidden, match="may not call model 'sentiment'"):
        auth.verify(opened, scoped, "sentiment")
    with pytest.raises(Forbidden):
        auth.verify(opened, scoped, "ticketsX")
    for model in ("tickets", "sentiment", "anything-else@production", None):
        assert auth.verify(opened, everything, model).models == ("*",)


def test_a_revoked_key_is_unauthenticated(opened: Store) -> None:
    key, token = auth.create(opened, "leaked", ["tickets"])
    auth.verify(opened, token, "tickets")
    revoked = auth.revoke(opened, key.id, actor="user:security")
    assert revoked.revoked_at is not None
    with pytest.raises(Unauthenticated, match=f"API key {key.id} was revoked"):
        auth.verify(opened, token, "tickets")
    record = audit.rows(opened, action="apikey.revoke")[-1]
    assert (record["object"], record["actor"], record["outcome"]) == (key.id, "user:security", "ok")
    assert auth.revoke(opened, key.id).revoked_at == revoked.revoked_at  # again: nothing changes


def test_revoke_takes_a_whole_token_and_refuses_unknown_ids(opened: Store) -> None:
    key, token = auth.create(opened, "pasted")
    assert auth.revoke(opened, token).id == key.id
    secret = token.split("_", 2)[2]
    assert all(secret not in row["object"] + row["details"] for row in audit.rows(opened))
    with pytest.raises(AuthError, match="no API key with id 0123456789abcdef") as raised:
        auth.revoke(opened, "0123456789abcdef")
    assert raised.value.hint
    assert audit.rows(opened, action="apikey.revoke")[-1]["outcome"] == "failed"
    with pytest.raises(AuthError, match="not an API key id"):
        auth.revoke(opened, "apl_nonsense")


def test_a_tampered_secret_is_unauthenticated(opened: Store) -> None:
    key, token = auth.create(opened, "app")
    flipped = token[:-1] + ("A" if token[-1] != "A" else "B")
    with pytest.raises(Unauthenticated, match=f"API key {key.id} is not valid"):
        auth.verify(opened, flipped, None)
    other_id = "f" * 16 if key.id != "f" * 16 else "e" * 16
    with pytest.raises(Unauthenticated, match=f"API key {other_id} is not valid"):
        auth.verify(opened, token.replace(key.id, other_id), None)  # the right secret under an unknown id


def _malformed(token: str) -> list[object]:
    key_id, secret = token[4:20], token[21:]
    return [
        None,
        "",
        " ",
        "garbage",
        "Bearer " + token,
        token + "\n",
        " " + token,
        "apk_" + token[4:],  # wrong prefix
        "APL_" + token[4:],
        f"apl_{key_id[:-1]}_{secret}",  # id one digit short
        f"apl_{key_id}0_{secret}",  # id one digit long
        f"apl_{key_id.upper()}_{secret}",
        f"apl_{key_id}_{secret[:-1]}",  # secret one character short
        f"apl_{key_id}_{secret}A",
        f"apl_{key_id}_{secret[:-1]}=",
        f"apl_{key_id}{secret}",
        f"apl_{key_id}_{secret[:-1]}é",
        "apl_" + "\x00" * 60,
        "apl_" + "_" * 60,
        token.encode(),  # bytes, not str
        "apl_" + "g" * 16 + "_" + secret,
        "x" * 10_000,
    ]


def test_malformed_tokens_are_unauthenticated_and_nothing_else(opened: Store) -> None:
    _, token = auth.create(opened, "app")
    bad = _malformed(token)
    for candidate in bad:
        with pytest.raises(Unauthenticated) as raised:
            auth.verify(opened, candidate, None)  # type: ignore[arg-type]
        assert type(raised.value) is Unauthenticated, candidate
        assert token[21:] not in raised.value.message and token[21:] not in (raised.value.hint or "")
    assert auth.verify(opened, token, None)  # and the good one still works


def test_the_secret_is_nowhere_in_the_database_files(opened: Store, settings) -> None:
    keys_made = [auth.create(opened, f"app {n}", ["tickets"]) for n in range(3)]
    for key, token in keys_made:
        auth.verify(opened, token, "tickets")
        auth.revoke(opened, key.id)
    stored = b"".join(
        path.read_bytes() for path in settings.db_path.parent.iterdir() if path.name.startswith(settings.db_path.name)
    )
    assert any(key.id.encode() in stored for key, _ in keys_made)  # the search does see what is there
    rows = json.dumps(audit.rows(opened))
    for key, token in keys_made:
        secret = token[21:]
        assert key.id in rows
        for needle in (token, secret, secret[:24]):
            assert needle.encode() not in stored and needle not in rows
        assert repr(key).count(secret) == 0


def test_the_secret_is_stored_only_as_an_hmac(opened: Store) -> None:
    import hashlib
    import hmac

    from appliance.store import keys

    key, token = auth.create(opened, "app")
    stored = opened.db.execute("SELECT secret_hash FROM api_keys WHERE id = ?", (key.id,)).fetchone()[0]
    expected = hmac.new(keys.derive(opened.secret, "appliance api keys"), token[21:].encode(), hashlib.sha256).digest()
    assert bytes(stored) == expected


def test_last_used_is_written_at_most_once_a_minute(opened: Store) -> None:
    key, token = auth.create(opened, "app")
    assert key.last_used_at is None
    first = auth.verify(opened, token, None)
    assert first.last_used_at is not None and auth.get(opened, key.id).last_used_at == first.last_used_at

    changes = opened.db.conn.total_changes
    for _ in range(20):
        auth.verify(opened, token, None)
    assert opened.db.conn.total_changes == changes  # no write on every request

    recent = (datetime.now(UTC) - timedelta(seconds=30)).isoformat(timespec="seconds")
    opened.db.execute("UPDATE api_keys SET last_used_at = ? WHERE id = ?", (recent, key.id))
    assert auth.verify(opened, token, None).last_used_at == recent
    assert auth.get(opened, key.id).last_used_at == recent

    stale = (datetime.now(UTC) - timedelta(minutes=2)).isoformat(timespec="seconds")
    opened.db.execute("UPDATE api_keys SET last_used_at = ? WHERE id = ?", (stale, key.id))
    refreshed = auth.verify(opened, token, None).last_used_at
    assert refreshed > stale and auth.get(opened, key.id).last_used_at == refreshed


def test_failed_checks_do_not_count_as_use(opened: Store) -> None:
    key, token = auth.create(opened, "app", ["tickets"])
    with pytest.raises(Forbidden):
        auth.verify(opened, token, "other")
    with pytest.raises(Unauthenticated):
        auth.verify(opened, token[:-1] + ("A" if token[-1] != "A" else "B"), None)
    assert auth.get(opened, key.id).last_used_at is None


@pytest.mark.parametrize("name", ["", "   ", "x" * 65, "line\nbreak"])
def test_a_key_needs_a_usable_name(opened: Store, name: str) -> None:
    with pytest.raises(AuthError, match="name"):
        auth.create(opened, name)
    assert auth.list_keys(opened) == []


@pytest.mark.parametrize("models", [[], ["bad name"], ["../etc"], ["ok", "-dash"]])
def test_a_key_needs_usable_model_names(opened: Store, models: list[str]) -> None:
    with pytest.raises(AuthError) as raised:
        auth.create(opened, "app", models)
    assert not isinstance(raised.value, RegistryError)
    assert auth.list_keys(opened) == [] and audit.rows(opened, action="apikey.*") == []


def test_a_star_among_names_means_every_model(opened: Store) -> None:
    key, _ = auth.create(opened, "app", ["tickets", "*", "tickets"])
    assert key.models == ("*",)
    assert auth.create(opened, "dup", ["b", "a", "b"])[0].models == ("b", "a")


def test_may_call() -> None:
    key = auth.ApiKey("0" * 16, "n", ("a", "b.c"), "2026-01-01T00:00:00+00:00", None, None)
    assert key.may_call("a") and key.may_call("b.c") and key.may_call("a@candidate") and key.may_call(None)
    assert not key.may_call("b") and not key.may_call("*") and not key.may_call("")


# -- the command -------------------------------------------------------------------


def test_cli_create_list_and_revoke(opened: Store) -> None:
    opened.close()
    created = run_cli("api-keys", "create", "billing app", "--model", "tickets", "--model", "intent", check=True)
    token = created.stdout.strip()
    assert token.startswith("apl_") and created.stdout.count("\n") == 1
    assert "only this once" in created.stderr and token[21:] not in created.stderr
    key_id = token[4:20]

    as_json = json.loads(run_cli("api-keys", "create", "admin", "--json", check=True).stdout)
    assert as_json["models"] == ["*"] and as_json["token"].startswith(f"apl_{as_json['id']}_")

    listed = run_cli("api-keys", "list", check=True).stdout
    assert key_id in listed and "billing app" in listed and "tickets,intent" in listed and "never" in listed
    assert token[21:] not in listed and as_json["token"][21:] not in listed
    listed_json = json.loads(run_cli("api-keys", "list", "--json", check=True).stdout)
    assert [k["id"] for k in listed_json] == [key_id, as_json["id"]]
    assert all("token" not in k and "secret_hash" not in k for k in listed_json)

    revoked = run_cli("api-keys", "revoke", key_id, check=True)
    assert f"API key {key_id} (billing app) revoked" in revoked.stdout
    assert "revoked" in run_cli("api-keys", "list", check=True).stdout

    audit_log = run_cli("audit", "list", "--json", check=True).stdout
    assert "apikey.create" in audit_log and "apikey.revoke" in audit_log
    assert token[21:] not in audit_log and as_json["token"][21:] not in audit_log


def test_cli_revoke_of_an_unknown_id_is_a_message(opened: Store) -> None:
    opened.close()
    result = run_cli("api-keys", "revoke", "0123456789abcdef")
    assert result.returncode == 1
    assert "error: no API key with id 0123456789abcdef" in result.stderr and "hint:" in result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr


def test_cli_create_refuses_a_bad_model_name(opened: Store) -> None:
    opened.close()
    result = run_cli("api-keys", "create", "app", "--model", "no such/model")
    assert result.returncode == 1 and result.stdout == ""
    assert "is not a usable model name" in result.stderr and "Traceback" not in result.stderr
