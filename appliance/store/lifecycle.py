"""Whole-store operations: create the key, rotate it, describe the store, back it up.

Each one orders its file writes around the database commit so that a crash at any
point leaves a store that the key on disk still opens.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance import store as store_pkg
from appliance.core.config import Settings
from appliance.core.errors import StoreError
from appliance.store import Store, audit, keys, migrations, space
from appliance.store import db as store_db


def init(settings: Settings, passphrase: str | None = None) -> Store:
    """Create the master key (a 0600 key file, or a passphrase) and the store it opens."""
    if passphrase is not None:
        keys.check_new_passphrase(passphrase)  # a short one is refused before anything is made
    database = store_pkg.connect(settings)
    try:
        if keys.is_initialised(database):
            raise StoreError(
                f"the store {settings.db_path} already has a master key",
                hint="'appliance keys status' shows where it comes from; 'appliance keys rotate' replaces it",
            )
    finally:
        database.conn.close()
    if passphrase is None:
        keys.write_key_file(settings.key_file, keys.generate())
    opened = store_pkg.open(settings, passphrase)
    audit.record(opened, "keys.init", opened.master.fingerprint, source=opened.master.source)
    return opened


@dataclass(frozen=True)
class Rotation:
    old_fingerprint: str
    new_fingerprint: str
    rewrapped: int
    new_key_at: str


def rotate(store: Store, *, new_passphrase: str | None = None, new_key_file: Path | None = None) -> Rotation:
    """Re-wrap every data key and the store secret under a new master key, in one transaction.

    Key file: the new key is written durably beside the old one before the commit
    and renamed over it after, so a crash leaves a key that opens the store (see
    keys.unlock). Passphrase: a new salt and the new stretched key. Credential: the
    new key goes to new_key_file for the operator to install as the credential.
    """
    old = store.master
    pending: Path | None = None
    if new_passphrase is not None:
        new = keys.new_passphrase_key(new_passphrase)
        where = "passphrase"
    elif new_key_file is not None or not old.source.startswith("key file"):
        if new_key_file is None:
            raise StoreError(
                f"the master key comes from a {old.source}, which the appliance cannot rewrite",
                hint="give --new-key-file PATH, then install that file as the new credential",
            )
        new = keys.MasterKey(keys.generate(), f"key file {new_key_file}")
        keys.write_key_file(new_key_file, new.material)
        where = str(new_key_file)
    else:
        pending = keys.pending_key_file(store.settings.key_file)
        pending.unlink(missing_ok=True)  # left by a rotation that never committed
        new = keys.MasterKey(keys.generate(), old.source)
        keys.write_key_file(pending, new.material)
        where = str(store.settings.key_file)

    with audit.operation(store, "keys.rotate", new.fingerprint, old=old.fingerprint) as details:
        details["rewrapped"] = keys.rewrap_all(store.db, old, new)
    store.master = new
    if pending is not None:
        os.replace(pending, store.settings.key_file)
        keys.fsync_dir(store.settings.key_file.parent)
    return Rotation(old.fingerprint, new.fingerprint, details["rewrapped"], where)


def info(store: Store) -> dict[str, Any]:
    """Sizes, what takes the space, how fast it grows, counts and the result of SQLite's integrity check."""
    db = store.db

    def scalar(sql: str) -> Any:
        return db.execute(sql).fetchone()[0]

    path, wal = store.settings.db_path, store.settings.wal_path
    used, grown = space.usage(store), space.growth(db)
    return {
        "path": str(path),
        "store_id": store.store_id,
        "schema_version": migrations.current_version(db),
        "file_bytes": path.stat().st_size,
        "wal_bytes": wal.stat().st_size if wal.exists() else 0,
        "blobs": scalar("SELECT COUNT(*) FROM blobs"),
        "blob_bytes": scalar("SELECT COALESCE(SUM(size), 0) FROM blobs"),
        "chunks": scalar("SELECT COUNT(*) FROM blob_chunks"),
        "audit_records": scalar("SELECT COUNT(*) FROM audit"),
        "key_source": store.master.source,
        "key_fingerprint": store.master.fingerprint,
        "integrity_check": scalar("PRAGMA integrity_check"),
        "space": {"by_kind": used.by_kind, "free_bytes": used.free_bytes, "free_pages_go_back": used.reclaims},
        "growth_bytes_per_day": None if grown is None else round(grown.bytes_per_day),
        "growth_days": None if grown is None else grown.days,
    }


def backup(store: Store, target: Path, progress: Callable[[int, int], None] = lambda done, total: None, *,
           check: Callable[[Path], None] = lambda copy: None, action: str = "store.backup", actor: str | None = None,
           **details: Any) -> int:
    """Copy the live store to target (encrypted as it is) and return its size.

    The copy is made under a temporary name, checked (check raises for one that must not be kept), and renamed
    only once the backup is audited (as action, with details), so a failed backup leaves no file that looks
    complete.
    """
    target = target.absolute()
    if target.exists():
        raise StoreError(f"{target} already exists", hint="choose a new file name; backups are never overwritten")
    if not target.parent.is_dir():
        raise StoreError(f"the directory {target.parent} does not exist", hint="create it first")
    partial = target.with_name(target.name + ".partial")
    try:
        store_db.backup(store.db, partial, progress)
        check(partial)
        size = partial.stat().st_size
        audit.record(store, action, str(target), actor=actor, bytes=size, **details)
        os.replace(partial, target)
        keys.fsync_dir(target.parent)
    finally:
        partial.unlink(missing_ok=True)
        partial.with_name(partial.name + "-journal").unlink(missing_ok=True)  # SQLite's, of a copy cut short
    return size
