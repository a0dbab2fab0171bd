"""API keys for the inference server: created once, stored as an HMAC, scoped to models.

A token reads ``apl_<id>_<secret>``: the id (8 random bytes, hex) is public and names
the key in listings, logs and audit records; the secret (32 random bytes, urlsafe
base64) is shown once, at creation, and only its HMAC-SHA256 under a key derived from
the store secret is kept. A key may call the models it lists, or every model with
``["*"]``. A server checks requests against a Verifier, a snapshot of the keys it
re-reads every poll, so no request touches the database; comparisons are constant
time and last_used_at is written at most once a minute.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import re
import secrets
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from appliance import registry
from appliance.errors import AuthError, Forbidden, RegistryError, Unauthenticated
from appliance.store import Store, audit, keys
from appliance.store.db import transaction

log = logging.getLogger(__name__)

PREFIX = "apl_"
ALL_MODELS = "*"
TOKEN = re.compile(r"apl_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")
KEY_ID = re.compile(r"[0-9a-f]{16}")
LAST_USED_EVERY = timedelta(minutes=1)
_COLUMNS = "id, name, models, created_at, last_used_at, revoked_at"


@dataclass(frozen=True)
class ApiKey:
    """A key as listings show it: everything but the secret, which is never kept."""

    id: str
    name: str
    models: tuple[str, ...]
    created_at: str
    last_used_at: str | None
    revoked_at: str | None

    def may_call(self, model: str | None) -> bool:
        """Whether this key may call model (a name, 'name:3' or 'name@alias'); None asks for any model."""
        if model is None or ALL_MODELS in self.models:
            return True
        return model.partition(":")[0].partition("@")[0] in self.models


def create(
    store: Store, name: str, models: Sequence[str] = (ALL_MODELS,), actor: str | None = None
) -> tuple[ApiKey, str]:
    """A new key and its token; the token is returned here and nowhere else, ever."""
    name = _check_name(name)
    scope = _check_models(models)
    key_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
    with audit.operation(store, "apikey.create", key_id, actor=actor, name=name, models=list(scope)):
        store.db.execute(
            "INSERT INTO api_keys (id, name, secret_hash, models, created_at) VALUES (?, ?, ?, ?, ?)",
            (key_id, name, _digest(store, secret), json.dumps(list(scope)), _now()),
        )
    return get(store, key_id), f"{PREFIX}{key_id}_{secret}"


def verify(store: Store, token: str | None, model: str | None) -> ApiKey:
    """The key behind token if it may call model (None: any model); Unauthenticated or Forbidden if not."""
    return _touch(store, verifier(store).verify(token, model))


@dataclass
class Verifier:
    """The keys as read at one moment, checked with no database access: what a server holds between polls."""

    hmac_key: bytes = field(repr=False)
    keys: dict[str, tuple[ApiKey, bytes]]  # id -> key, HMAC of its secret
    used: set[str] = field(default_factory=set)  # ids that passed since the snapshot, for last_used_at

    def verify(self, token: str | None, model: str | None) -> ApiKey:
        if not token:
            raise Unauthenticated("no API key given",
                                  hint="send an API key; 'appliance api-keys create NAME' makes one")
        match = TOKEN.fullmatch(token) if isinstance(token, str) else None
        if match is None:
            raise Unauthenticated("the API key is malformed",
                                  hint=f"an API key reads {PREFIX}<16 hex digits>_<43 characters>")
        key_id, secret = match.groups()
        key, expected = self.keys.get(key_id, (None, bytes(hashlib.sha256().digest_size)))
        # An unknown id costs the same HMAC as a known one.
        digest = hmac.new(self.hmac_key, secret.encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(digest, expected) or key is None:
            raise Unauthenticated(f"API key {key_id} is not valid", hint="check the token; 'appliance api-keys list'")
        if key.revoked_at is not None:
            raise Unauthenticated(f"API key {key_id} was revoked at {key.revoked_at}", hint="ask for a new key")
        if not key.may_call(model):
            raise Forbidden(
                f"API key {key_id} ({key.name}) may not call model {model!r}",
                hint=f"it may call: {', '.join(key.models)}",
            )
        self.used.add(key_id)
        return key


def verifier(store: Store) -> Verifier:
    """Every key and its HMAC, read now."""
    rows = store.db.execute(f"SELECT {_COLUMNS}, secret_hash FROM api_keys").fetchall()
    return Verifier(_hmac_key(store.secret), {row[0]: (_key(row[:-1]), bytes(row[-1])) for row in rows})


def record_use(store: Store, used: Verifier) -> None:
    """Write last_used_at for the keys a server's snapshot let through (at most once a minute each)."""
    for key_id in used.used:
        _touch(store, used.keys[key_id][0])


def get(store: Store, key_id: str) -> ApiKey:
    """One key by its id (or by a whole token, whose secret is ignored)."""
    key_id = _check_id(key_id)
    row = store.db.execute(f"SELECT {_COLUMNS} FROM api_keys WHERE id = ?", (key_id,)).fetchone()
    if row is None:
        raise AuthError(f"no API key with id {key_id}", hint="'appliance api-keys list' shows every key")
    return _key(row)


def list_keys(store: Store) -> list[ApiKey]:
    """Every key, revoked ones included, oldest first."""
    return [_key(row) for row in store.db.execute(f"SELECT {_COLUMNS} FROM api_keys ORDER BY rowid")]


def revoke(store: Store, key_id: str, actor: str | None = None) -> ApiKey:
    """Make a key useless from the next request on; revoking a revoked key changes nothing."""
    key_id = _check_id(key_id)
    with audit.operation(store, "apikey.revoke", key_id, actor=actor) as details:
        key = get(store, key_id)
        details["name"] = key.name
        if key.revoked_at is None:
            store.db.execute("UPDATE api_keys SET revoked_at = ? WHERE id = ?", (_now(), key_id))
        else:
            details["already_revoked_at"] = key.revoked_at
    return get(store, key_id)


# -- helpers -----------------------------------------------------------------------


def _touch(store: Store, key: ApiKey) -> ApiKey:
    """Record that the key was used, at most once a minute: bookkeeping, not audited."""
    now = datetime.now(UTC)
    if key.last_used_at is not None and now - datetime.fromisoformat(key.last_used_at) < LAST_USED_EVERY:
        return key
    stamp = now.isoformat(timespec="seconds")
    try:
        with transaction(store.db):
            store.db.execute("UPDATE api_keys SET last_used_at = ? WHERE id = ?", (stamp, key.id))
    except sqlite3.Error as exc:  # a busy or full disk must not turn a valid key away
        log.warning("last use of API key %s not recorded: %s", key.id, exc)
        return key
    return ApiKey(key.id, key.name, key.models, key.created_at, stamp, key.revoked_at)


def _digest(store: Store, secret: str) -> bytes:
    return hmac.new(_hmac_key(store.secret), secret.encode(), hashlib.sha256).digest()


@functools.lru_cache(maxsize=4)
def _hmac_key(store_secret: bytes) -> bytes:
    """Derived once per store, not on every request."""
    return keys.derive(store_secret, "appliance api keys")


def _key(row: tuple) -> ApiKey:
    key_id, name, models, created_at, last_used_at, revoked_at = row
    return ApiKey(key_id, name, tuple(json.loads(models)), created_at, last_used_at, revoked_at)


def _check_id(key_id: str) -> str:
    """The id itself, from an id or a whole token; the input is never echoed, it may hold a secret."""
    match = TOKEN.fullmatch(key_id)
    if match:
        return match[1]
    if not KEY_ID.fullmatch(key_id):
        raise AuthError("that is not an API key id (16 hex digits)", hint="'appliance api-keys list' shows the ids")
    return key_id


def _check_name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > 64 or not name.isprintable():
        raise AuthError("an API key's name must be 1 to 64 printable characters", hint="name who or what holds it")
    return name


def _check_models(models: Sequence[str]) -> tuple[str, ...]:
    if isinstance(models, str):
        models = (models,)
    if not models:
        raise AuthError("an API key must be allowed at least one model", hint=f"give model names, or {ALL_MODELS!r}")
    if ALL_MODELS in models:
        return (ALL_MODELS,)
    try:
        return tuple(dict.fromkeys(registry.check_name(model) for model in models))
    except RegistryError as exc:
        raise AuthError(exc.message, hint=exc.hint) from exc


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
