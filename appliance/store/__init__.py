"""The one SQLite database that holds all state; it knows nothing of ML.

    store.open(settings) -> Store     connect, migrate, unlock with the master key
    store.open_read_only(settings)    the same to look at it: no migration, nothing written
    blobs.put / blobs.get             encrypted content-addressed bytes
    audit.operation / audit.record    every state change, hash-chained and anchored
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self

# sqlite-utils imports pandas where it is installed (and pandas imports pyarrow), only to take pandas' types as
# values, which the appliance never passes: 200 MB more in every process that opens the store, the serving daemon
# among them. So it is imported with pandas hidden, unless this process has loaded pandas already.
_pandas_hidden = sys.modules.setdefault("pandas", None) is None  # type: ignore[arg-type]
try:
    import sqlite_utils
finally:
    if _pandas_hidden:
        del sys.modules["pandas"]

from appliance.core.config import Settings
from appliance.core.errors import StoreError
from appliance.store import db as store_db
from appliance.store import keys, migrations


@dataclass
class Store:
    """An open, unlocked store: the database, the master key and the store secret."""

    db: sqlite_utils.Database
    settings: Settings
    master: keys.MasterKey
    store_id: str
    secret: bytes = field(repr=False)
    read_only: bool = False
    checkpointer: store_db.Checkpointer | None = field(repr=False, default=None)

    def __post_init__(self) -> None:
        if not self.read_only:
            store_db.Checkpointer.hand_over(self.db)
            self.checkpointer = store_db.Checkpointer(self.settings.db_path, self.settings.wal_path)

    def close(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()
        self.db.conn.close()  # the last connection to close folds the WAL into the database

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def open(settings: Settings, passphrase: str | None = None) -> Store:
    """Open the store, creating the state directory and database on first use: only where a key is there to open
    it, so that a command run without one (a mistyped state directory) leaves nothing behind."""
    if passphrase is None and not settings.db_path.exists() and keys.stored_key(settings) is None:
        raise keys.missing(settings, made=False)
    return _unlocked(settings, lambda database: keys.unlock(database, settings, passphrase))


def scratch(settings: Settings) -> Store:
    """A new store whose key is never written anywhere: gone with the process (a burst job on a cluster node)."""
    return _unlocked(settings, keys.in_memory)


def _unlocked(settings: Settings, unlock: Callable[[sqlite_utils.Database], tuple[keys.MasterKey, bytes]]) -> Store:
    database = connect(settings)
    try:
        master, secret = unlock(database)
        keys.note_key(database, master)  # a store made before the fingerprint was kept, or a key file's with a salt
        store_id = keys.stored_id(database)
    except BaseException:
        database.conn.close()
        raise
    return Store(database, settings, master, store_id, secret)


def another_connection(store: Store) -> Store:
    """The same unlocked store over a connection of its own, for a thread that writes beside the store's owner (a
    training run's background checkpoints): SQLite takes their transactions one at a time. Closed by its user."""
    return Store(connect(store.settings), store.settings, store.master, store.store_id, store.secret)


def open_read_only(settings: Settings, passphrase: str | None = None) -> Store:
    """The unlocked store for inspection (appliance doctor): not migrated, nothing written to it or beside it."""
    if not settings.db_path.exists():
        raise StoreError(f"there is no store at {settings.db_path}", hint="the daemon creates it on its first start")
    database = store_db.connect_read_only(settings.db_path)
    try:
        migrations.checked_version(database)
        if "meta" not in database.table_names() or not keys.is_initialised(database):
            raise StoreError(f"the store {settings.db_path} has no master key yet",
                             hint="the daemon sets it up on its first start; 'appliance keys init' does it by hand")
        master, secret = keys.unlock(database, settings, passphrase)
        store_id = keys.stored_id(database)
    except BaseException:
        database.conn.close()
        raise
    return Store(database, settings, master, store_id, secret, read_only=True)


def connect(settings: Settings) -> sqlite_utils.Database:
    """The migrated database, without unlocking it (for status and first-time setup)."""
    settings.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not settings.db_path.exists():
        # SQLite gives the -wal and -shm files the mode of the database file.
        os.close(os.open(settings.db_path, os.O_WRONLY | os.O_CREAT, 0o600))
    database = store_db.connect(settings.db_path)
    try:
        migrations.migrate(database)
    except BaseException:
        database.conn.close()
        raise
    return database
