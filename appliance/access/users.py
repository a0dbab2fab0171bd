"""Users of the control API: a name, a role and a token kept only as an HMAC.

Roles are ordered: a viewer reads; an operator also imports data, runs jobs and
deploys; an admin also manages users and API keys. Tokens read ``apu_<id>_<secret>``
(see credentials.py) and are derived under their own label, so an API key for the
inference server never opens the control API, nor a user token the server.

The daemon leaves a token of a `local-admin` user in a 0600 file in the state
directory: the CLI and the TUI of the daemon's own user read it, as a root shell
reads a root-only file; anyone else needs a token of their own ($APPLIANCE_TOKEN).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from appliance.core import clock
from appliance.core.errors import AuthError, DaemonError, Forbidden, Unauthenticated
from appliance.store import Store, audit, credentials, keys

ROLES = ("viewer", "operator", "admin")  # each role may do everything the ones before it may
KIND = credentials.Kind("apu_", "user token", "a", "appliance control api users")
PREFIX = KIND.prefix
LOCAL_ADMIN = "local-admin"
_COLUMNS = "id, name, role, created_at, last_used_at, revoked_at"
_LISTING = "appliance users list"


@dataclass(frozen=True)
class User:
    """A user as listings show them: everything but the secret, which is never kept."""

    id: str
    name: str
    role: str
    created_at: str
    last_used_at: str | None
    revoked_at: str | None

    def may(self, role: str) -> bool:
        """Whether this user's role is at least `role`."""
        return ROLES.index(self.role) >= ROLES.index(role)


def add(store: Store, name: str, role: str, actor: str | None = None) -> tuple[User, str]:
    """A new user and their token; the token is returned here and nowhere else, ever."""
    name = credentials.check_name(name, "a user")
    if role not in ROLES:
        raise AuthError(f"there is no role {role!r}: the roles are {', '.join(ROLES)}")
    user_id, secret, token = KIND.new()
    with audit.operation(store, "user.add", user_id, actor=actor, name=name, role=role):
        store.db.execute(
            "INSERT INTO users (id, name, role, secret_hash, created_at) VALUES (?, ?, ?, ?, ?)",
            (user_id, name, role, KIND.digest(store.secret, secret), clock.stamp()),
        )
    return get(store, user_id), token


def get(store: Store, user_id: str) -> User:
    """One user by id (or by a whole token, whose secret is ignored and never echoed)."""
    user_id = KIND.check_id(user_id, _LISTING)
    row = store.db.execute(f"SELECT {_COLUMNS} FROM users WHERE id = ?", (user_id,)).fetchone()
    if row is None:
        raise AuthError(f"no user with id {user_id}", hint=f"'{_LISTING}' shows every user")
    return User(*row)


def list_users(store: Store) -> list[User]:
    """Every user, revoked ones included, oldest first."""
    return [User(*row) for row in store.db.execute(f"SELECT {_COLUMNS} FROM users ORDER BY rowid")]


def revoke(store: Store, user_id: str, actor: str | None = None) -> User:
    """Make a user's token useless from the next call on; revoking twice changes nothing."""
    user_id = KIND.check_id(user_id, _LISTING)
    credentials.revoke(store, "users", "user.revoke", user_id, lambda found: get(store, found), actor)
    return get(store, user_id)


def authenticate(store: Store, token: str | None) -> User:
    """The user behind a token; Unauthenticated for none, or a malformed, unknown or revoked one."""
    user_id, secret = KIND.parse(token, "send a user token: 'Authorization: Bearer apu_...'")
    row = store.db.execute(f"SELECT {_COLUMNS}, secret_hash FROM users WHERE id = ?", (user_id,)).fetchone()
    user, expected = (User(*row[:-1]), bytes(row[-1])) if row else (None, None)
    if user is None or not KIND.matches(store.secret, secret, expected):
        raise Unauthenticated(f"user token {user_id} is not valid", hint=f"check the token; '{_LISTING}'")
    if user.revoked_at is not None:
        raise Unauthenticated(f"the token of user {user.name} was revoked at {user.revoked_at}",
                              hint="ask an admin for a new one")
    stamp = credentials.touch(store, "users", user.id, user.last_used_at)
    return dataclasses.replace(user, last_used_at=stamp) if stamp else user


def require(user: User, role: str) -> None:
    """Forbidden unless the user's role is at least `role`: what every control-API call checks."""
    if not user.may(role):
        raise Forbidden(f"user {user.name} ({user.role}) may not do this: needs {role}",
                        hint=f"ask an admin for a token with the {role} role")


def local_admin_token(store: Store, path: Path) -> str:
    """The local admin's token from its 0600 file; made, with its user, when missing, garbled or revoked."""
    with contextlib.suppress(OSError, UnicodeError, AuthError):
        token = path.read_text().strip()
        authenticate(store, token)
        return token
    _, token = add(store, LOCAL_ADMIN, "admin", actor="daemon")
    try:
        keys.write_private(path, token + "\n")
    except OSError as exc:
        raise DaemonError(f"cannot write the local admin token to {path}: {exc.strerror}",
                          hint="check that the daemon's user may write there and the disk has room") from exc
    return token
