"""API keys for the inference server: created once, stored as an HMAC, scoped to models.

A token reads ``apl_<id>_<secret>``: the id (8 random bytes, hex) is public and names
the key in listings, logs and audit records; the secret (32 random bytes, urlsafe
base64) is shown once, at creation, and only its HMAC-SHA256 under a key derived from
the store secret is kept. A key may call the models it lists, or every model with
``["*"]``; it may send true labels for its predictions (which go into retraining) only
when it was made to (`may_label`), so the key an app predicts with cannot write training
data unless someone meant it to. A server checks requests against a Verifier, a snapshot of the keys it
re-reads every poll, so no request touches the database; comparisons are constant
time and last_used_at is written at most once a minute.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from appliance import registry
from appliance.core import clock
from appliance.core.errors import AuthError, Forbidden, RegistryError, Unauthenticated
from appliance.store import Store, audit, credentials

KIND = credentials.Kind("apl_", "API key", "an", "appliance api keys")
PREFIX = KIND.prefix
ALL_MODELS = "*"
_COLUMNS = "id, name, models, created_at, last_used_at, revoked_at, may_label"


@dataclass(frozen=True)
class ApiKey:
    """A key as listings show it: everything but the secret, which is never kept."""

    id: str
    name: str
    models: tuple[str, ...]
    created_at: str
    last_used_at: str | None
    revoked_at: str | None
    may_label: bool = False  # may send true labels for its models' predictions (POST /v1/feedback)

    def may_call(self, model: str | None) -> bool:
        """Whether this key may call model (a name, 'name:3' or 'name@alias'); None asks for any model."""
        if model is None or ALL_MODELS in self.models:
            return True
        return model.partition(":")[0].partition("@")[0] in self.models

    def permit(self, model: str | None) -> None:
        """Forbidden, naming what it may call, unless this key may call model."""
        if not self.may_call(model):
            raise Forbidden(f"API key {self.id} ({self.name}) may not call model {model!r}",
                            hint=f"it may call: {', '.join(self.models)}")


def create(
    store: Store, name: str, models: Sequence[str] = (ALL_MODELS,), actor: str | None = None, *,
    may_label: bool = False,
) -> tuple[ApiKey, str]:
    """A new key and its token; the token is returned here and nowhere else, ever."""
    name = credentials.check_name(name, "an API key")
    scope = _check_models(models)
    key_id, secret, token = KIND.new()
    with audit.operation(store, "apikey.create", key_id, actor=actor, name=name, models=list(scope),
                         may_label=may_label):
        store.db.execute(
            "INSERT INTO api_keys (id, name, secret_hash, models, created_at, may_label) VALUES (?, ?, ?, ?, ?, ?)",
            (key_id, name, KIND.digest(store.secret, secret), json.dumps(list(scope)), clock.stamp(), may_label),
        )
    return get(store, key_id), token


def verify(store: Store, token: str | None, model: str | None) -> ApiKey:
    """The key behind token if it may call model (None: any model); Unauthenticated or Forbidden if not."""
    return _touch(store, verifier(store).verify(token, model))


@dataclass
class Verifier:
    """The keys as read at one moment, checked with no database access: what a server holds between polls."""

    store_secret: bytes = field(repr=False)
    keys: dict[str, tuple[ApiKey, bytes]]  # id -> key, HMAC of its secret
    used: set[str] = field(default_factory=set)  # ids that passed since the snapshot, for last_used_at

    def verify(self, token: str | None, model: str | None) -> ApiKey:
        key_id, secret = KIND.parse(token, "send an API key; 'appliance api-keys create NAME' makes one")
        key, expected = self.keys.get(key_id, (None, None))
        if key is None or not KIND.matches(self.store_secret, secret, expected):
            raise Unauthenticated(f"API key {key_id} is not valid", hint="check the token; 'appliance api-keys list'")
        if key.revoked_at is not None:
            raise Unauthenticated(f"API key {key_id} was revoked at {key.revoked_at}", hint="ask for a new key")
        key.permit(model)
        self.used.add(key_id)
        return key


def verifier(store: Store) -> Verifier:
    """Every key and its HMAC, read now."""
    rows = store.db.execute(f"SELECT {_COLUMNS}, secret_hash FROM api_keys").fetchall()
    return Verifier(store.secret, {row[0]: (_key(row[:-1]), bytes(row[-1])) for row in rows})


def record_use(store: Store, used: Verifier) -> None:
    """Write last_used_at for the keys a server's snapshot let through (at most once a minute each)."""
    for key_id in used.used:
        _touch(store, used.keys[key_id][0])


def get(store: Store, key_id: str) -> ApiKey:
    """One key by its id (or by a whole token, whose secret is ignored)."""
    key_id = KIND.check_id(key_id, "appliance api-keys list")
    row = store.db.execute(f"SELECT {_COLUMNS} FROM api_keys WHERE id = ?", (key_id,)).fetchone()
    if row is None:
        raise AuthError(f"no API key with id {key_id}", hint="'appliance api-keys list' shows every key")
    return _key(row)


def list_keys(store: Store) -> list[ApiKey]:
    """Every key, revoked ones included, oldest first."""
    return [_key(row) for row in store.db.execute(f"SELECT {_COLUMNS} FROM api_keys ORDER BY rowid")]


def revoke(store: Store, key_id: str, actor: str | None = None) -> ApiKey:
    """Make a key useless from the next request on; revoking a revoked key changes nothing."""
    key_id = KIND.check_id(key_id, "appliance api-keys list")
    credentials.revoke(store, "api_keys", "apikey.revoke", key_id, lambda found: get(store, found), actor)
    return get(store, key_id)


# -- helpers -----------------------------------------------------------------------


def _touch(store: Store, key: ApiKey) -> ApiKey:
    stamp = credentials.touch(store, "api_keys", key.id, key.last_used_at)
    return dataclasses.replace(key, last_used_at=stamp) if stamp else key


def _key(row: tuple) -> ApiKey:
    key_id, name, models, created_at, last_used_at, revoked_at, may_label = row
    return ApiKey(key_id, name, tuple(json.loads(models)), created_at, last_used_at, revoked_at, bool(may_label))


def require_labelling(key: ApiKey) -> None:
    """Forbidden unless the key was made to send true labels."""
    if not key.may_label:
        raise Forbidden(f"API key {key.id} ({key.name}) may not send true labels: they go into retraining",
                        hint="an admin makes a key that may: 'appliance api-keys create NAME --feedback'")


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
