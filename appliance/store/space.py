"""The store's disk space: what takes it, giving free pages back, and how fast it grows.

Deleting a dataset, a model version or a finished run's checkpoint frees pages inside the
database file, not on the disk: SQLite keeps them for its next writes. A store made by this
version uses SQLite's incremental auto-vacuum, so the daemon hands free pages back to the
file system in small steps (`reclaim`, from `keep_tidy`'s thread), each one a short write
transaction that jobs and serving barely notice. A store made before has no such
bookkeeping; `compact` (`appliance store compact`) rewrites it once, switching it on.

`keep_tidy` also records the bytes in use once a day (table store_sizes, owned here), so
that `growth` can say how fast the store grows and `appliance doctor` when the disk fills.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
import threading
from dataclasses import dataclass
from datetime import date, timedelta

import sqlite_utils

from appliance import store as store_pkg
from appliance.core import clock
from appliance.core.config import Settings
from appliance.core.errors import ApplianceError, StoreError
from appliance.store import Store, audit
from appliance.store.db import transaction

log = logging.getLogger("appliance.store.space")

STEP_PAGES = 256  # pages given back per transaction: 16 MiB of the store's 64 KiB pages
TIDY_EVERY_S = 3600.0
GROWTH_DAYS = 7  # the window `growth` reads
INCREMENTAL = 2  # PRAGMA auto_vacuum's value for incremental

# What holds each blob, in the order a blob held by two is counted (the same bytes under a run and a version are
# the model's).
BLOB_HOLDERS = (("datasets", "datasets", "blob_id"), ("models", "model_artifacts", "blob_id"),
                ("models", "runs", "model_blob"), ("checkpoints", "checkpoints", "blob_id"))
# Tables whose rows are a kind of their own, counted by the pages they and their indexes take.
TABLE_KINDS = {"predictions": "prediction texts", "audit": "audit log"}
KINDS = ("datasets", "models", "checkpoints", "prediction texts", "audit log", "other")


@dataclass(frozen=True)
class Usage:
    """The database file, by what its bytes hold; free pages are inside the file, kept for its next writes."""

    file_bytes: int
    wal_bytes: int
    free_bytes: int
    by_kind: dict[str, int]  # KINDS, each the bytes it takes in the file
    reclaims: bool  # whether free pages go back to the disk without a compaction


@dataclass(frozen=True)
class Growth:
    """How fast the bytes in use grew between two daily samples."""

    bytes_per_day: float
    days: float  # between the first and the last sample read
    since: str  # the first sample's day


def usage(store: Store) -> Usage:
    db = store.db
    page_size = _pragma(db, "page_size")
    free = _pragma(db, "freelist_count") * page_size
    file_bytes = _pragma(db, "page_count") * page_size
    by_kind = dict.fromkeys(KINDS, 0)
    counted: set[str] = set()
    for kind, table, column in BLOB_HOLDERS:
        for blob_id, size in db.execute(f"SELECT b.id, b.size FROM blobs AS b JOIN {table} AS t ON t.{column} = b.id"
                                        " GROUP BY b.id"):
            if blob_id not in counted:
                counted.add(blob_id)
                by_kind[kind] += size
    for table, kind in TABLE_KINDS.items():
        by_kind[kind] = _table_bytes(db, table)
    by_kind["other"] = max(0, file_bytes - free - sum(by_kind.values()))
    wal = store.settings.wal_path
    return Usage(file_bytes, wal.stat().st_size if wal.exists() else 0, free, by_kind,
                 _pragma(db, "auto_vacuum") == INCREMENTAL)


def reclaim(store: Store, stop: threading.Event | None = None) -> int:
    """Give the store's free pages back to the disk, STEP_PAGES per transaction; the bytes given back.

    Nothing on a store without incremental auto-vacuum (see compact). Stops early when stop is set.
    """
    db = store.db
    if _pragma(db, "auto_vacuum") != INCREMENTAL:
        return 0
    page_size, given = _pragma(db, "page_size"), 0
    while (free := _pragma(db, "freelist_count")) and not (stop and stop.is_set()):
        with transaction(db):
            db.execute(f"PRAGMA incremental_vacuum({min(free, STEP_PAGES)})").fetchall()
        given += min(free, STEP_PAGES) * page_size
    return given


def compact(store: Store, actor: str | None = None) -> tuple[int, int]:
    """Rewrite the whole database without its free pages, with incremental auto-vacuum on from then on.

    The file's size before and after. It needs free disk space for a second copy while it runs, and writers
    wait for it: a few seconds per GiB.
    """
    db, path = store.db, store.settings.db_path
    before = _pragma(db, "page_count") * _pragma(db, "page_size")
    needed = _pragma(db, "page_count") * _pragma(db, "page_size")
    if shutil.disk_usage(path.parent).free < needed:
        raise StoreError(f"compacting the store needs about {needed / 2**20:.0f} MiB free beside {path}",
                         hint="free space on that file system first; the store is unchanged")
    try:  # VACUUM runs in no transaction of ours: it is one of its own, all or nothing
        db.execute(f"PRAGMA auto_vacuum = {INCREMENTAL}")
        db.execute("VACUUM")
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"compacting the store failed: {exc}", hint="the store is unchanged; try again when"
                         " no job is running, or stop the daemon first") from exc
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    after = _pragma(db, "page_count") * _pragma(db, "page_size")
    audit.record(store, "store.compact", str(path), actor=actor, bytes_before=before, bytes_after=after)
    return before, after


def sample(store: Store) -> None:
    """Record today's bytes in use (the file less its free pages); a later sample of the same day replaces it."""
    db = store.db
    used = (_pragma(db, "page_count") - _pragma(db, "freelist_count")) * _pragma(db, "page_size")
    with transaction(db):
        db.execute("INSERT INTO store_sizes (day, used_bytes) VALUES (?, ?)"
                   " ON CONFLICT (day) DO UPDATE SET used_bytes = excluded.used_bytes", (_today(), used))
        db.execute("DELETE FROM store_sizes WHERE day < ?", (_today(-4 * GROWTH_DAYS),))


def growth(db: sqlite_utils.Database) -> Growth | None:
    """The growth of the bytes in use over the last GROWTH_DAYS of daily samples; None with fewer than two days.

    Takes a bare database (no key needed), so that `appliance doctor` can read it beside a store it cannot open.
    """
    if "store_sizes" not in db.table_names():
        return None
    rows = db.execute("SELECT day, used_bytes FROM store_sizes WHERE day >= ? ORDER BY day",
                      (_today(-GROWTH_DAYS),)).fetchall()
    if len(rows) < 2:
        return None
    (first_day, first), (last_day, last) = rows[0], rows[-1]
    days = (date.fromisoformat(last_day) - date.fromisoformat(first_day)).days
    return Growth((last - first) / days, days, first_day)


def keep_tidy(settings: Settings, passphrase: str | None, stop: threading.Event) -> None:
    """Until stop is set: every TIDY_EVERY_S, give free pages back and record the day's size (the daemon's thread)."""
    with store_pkg.open(settings, passphrase) as opened:
        while not stop.is_set():
            try:
                given = reclaim(opened, stop)
                if given:
                    log.info("gave %.1f MiB of free pages in the store back to the disk", given / 2**20)
                sample(opened)
            except (ApplianceError, sqlite3.Error, OSError) as exc:  # a busy or full disk must not stop the daemon
                log.error("store upkeep failed, tried again in an hour: %s", getattr(exc, "message", exc))
            stop.wait(TIDY_EVERY_S)


def _pragma(db: sqlite_utils.Database, name: str) -> int:
    return int(db.execute(f"PRAGMA {name}").fetchone()[0])


def _table_bytes(db: sqlite_utils.Database, table: str) -> int:
    """The bytes of a table's pages and its indexes' (SQLite's dbstat), or of its rows where dbstat is missing."""
    try:
        return int(db.execute("SELECT COALESCE(SUM(s.pgsize), 0) FROM dbstat AS s JOIN sqlite_master AS m"
                              " ON m.name = s.name WHERE m.tbl_name = ?", (table,)).fetchone()[0])
    except sqlite3.OperationalError:  # SQLite built without the dbstat table
        columns = " + ".join(f"COALESCE(LENGTH({column.name}), 0)" for column in db[table].columns)
        return int(db.execute(f"SELECT COALESCE(SUM({columns}), 0) FROM {table}").fetchone()[0])


def _today(days: int = 0) -> str:
    return (clock.now() + timedelta(days=days)).date().isoformat()
