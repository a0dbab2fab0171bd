"""Bearer tokens kept only as an HMAC: what API keys and control-API users have in common.

A token reads ``<prefix><id>_<secret>``: the id (8 random bytes, hex) is public and names
the credential in listings, logs and audit records; the secret (32 random bytes, urlsafe
base64) is shown once, at creation, and only its HMAC-SHA256 under a key derived from
the store secret is kept. Each kind of credential derives its own key (`label`), so a
secret of one kind can never verify as the other.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import re
import secrets
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from appliance.core import clock
from appliance.core.errors import AuthError, Unauthenticated
from appliance.store import Store, audit, keys
from appliance.store.db import transaction

log = logging.getLogger(__name__)

ID = re.compile(r"[0-9a-f]{16}")
LAST_USED_EVERY = timedelta(minutes=1)
_UNKNOWN = bytes(hashlib.sha256().digest_size)


@dataclass(frozen=True)
class Kind:
    """One kind of token: its prefix, what people call it, and the label its HMAC key is derived with."""

    prefix: str
    noun: str  # "API key", "user token"
    article: str  # "an", "a"
    label: str

    @functools.cached_property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(re.escape(self.prefix) + r"([0-9a-f]{16})_([A-Za-z0-9_-]{43})")

    def new(self) -> tuple[str, str, str]:
        """A fresh (id, secret, token)."""
        token_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        return token_id, secret, f"{self.prefix}{token_id}_{secret}"

    def parse(self, token: str | None, hint: str) -> tuple[str, str]:
        """(id, secret) of a well-formed token; Unauthenticated for none or a malformed one."""
        if not token:
            raise Unauthenticated(f"no {self.noun} given", hint=hint)
        match = self.pattern.fullmatch(token) if isinstance(token, str) else None
        if match is None:
            raise Unauthenticated(f"the {self.noun} is malformed",
                                  hint=f"{self.article} {self.noun} reads {self.prefix}<16 hex digits>_<43 characters>")
        return match[1], match[2]

    def digest(self, store_secret: bytes, secret: str) -> bytes:
        return hmac.new(_hmac_key(store_secret, self.label), secret.encode(), hashlib.sha256).digest()

    def matches(self, store_secret: bytes, secret: str, expected: bytes | None) -> bool:
        """Constant time; an unknown id (expected None) costs the same HMAC as a known one."""
        return hmac.compare_digest(self.digest(store_secret, secret), expected or _UNKNOWN) and expected is not None

    def check_id(self, text: str, listing: str) -> str:
        """The id itself, from an id or a whole token; the input is never echoed, it may hold a secret."""
        match = self.pattern.fullmatch(text)
        if match:
            return match[1]
        if not ID.fullmatch(text):
            raise AuthError(f"that is not {self.article} {self.noun} id (16 hex digits)", hint=f"'{listing}' shows the ids")
        return text


def check_name(name: str, what: str) -> str:
    """The name, stripped; it is shown in listings and logs, so one short printable line."""
    name = name.strip()
    if not name or len(name) > 64 or not name.isprintable():
        raise AuthError(f"{what}'s name must be 1 to 64 printable characters", hint="name who or what holds it")
    return name


def revoke(store: Store, table: str, action: str, credential_id: str, find: Callable[[str], Any],
           actor: str | None) -> None:
    """Mark a credential revoked, audited; revoking a revoked one changes nothing but is recorded."""
    with audit.operation(store, action, credential_id, actor=actor) as details:
        found = find(credential_id)
        details["name"] = found.name
        if found.revoked_at is None:
            store.db.execute(f"UPDATE {table} SET revoked_at = ? WHERE id = ?", (clock.stamp(), credential_id))
        else:
            details["already_revoked_at"] = found.revoked_at


def touch(store: Store, table: str, credential_id: str, last_used_at: str | None) -> str | None:
    """Record a use, at most once a minute (bookkeeping, not audited); the new stamp, or None if not written."""
    if last_used_at is not None and clock.age(last_used_at) < LAST_USED_EVERY:
        return None
    stamp = clock.stamp()
    try:
        with transaction(store.db):
            store.db.execute(f"UPDATE {table} SET last_used_at = ? WHERE id = ?", (stamp, credential_id))
    except sqlite3.Error as exc:  # a busy or full disk must not turn a valid credential away
        log.warning("last use of %s not recorded: %s", credential_id, exc)
        return None
    return stamp


@functools.lru_cache(maxsize=8)
def _hmac_key(store_secret: bytes, label: str) -> bytes:
    """Derived once per store and kind, not on every request."""
    return keys.derive(store_secret, label)
