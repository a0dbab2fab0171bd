"""The SQLite connection: opened with the same pragmas every time, explicit transactions.

Python's sqlite3 and sqlite-utils both like to commit on their own; here the
connection is in autocommit mode and every write goes through transaction(), so a
change is visible whole or not at all.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlite_utils

from appliance.core.errors import BackupError, StoreBusy, StoreDamaged, StoreError, StoreFull

log = logging.getLogger(__name__)
RESTORE_HINT = ("keep appliance.db as evidence, stop the daemon and restore the newest good backup ('appliance backup"
                " list', 'appliance backup verify FILE', 'appliance backup restore FILE')")  # what a damaged store needs

FULL_HINT = ("free space on that disk ('df -h' shows how much; 'appliance store info' what the store holds), then"
             " try again; nothing half-written was kept")

BUSY_TIMEOUT_MS = 30_000
FULL_BELOW_BYTES = 1 << 20  # a disk with less free is full to SQLite, which needs room for its -wal and -shm
WAL_BOUND_BYTES = 512 << 20  # past this the writing connection folds the WAL in itself

PRAGMAS = (
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = FULL",  # a committed change survives power loss
    "PRAGMA foreign_keys = ON",
    f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}",
    "PRAGMA journal_size_limit = 67108864",  # give the WAL back after a large blob
)


class Checkpointer:
    """Copies the WAL into the database from a background thread.

    SQLite checkpoints right after the commit that crossed its threshold, in the
    committing thread, so a large put would pay to write its bytes twice before
    returning. The store's connection leaves that to this thread, which does the copy
    when woken after a large write, or every CHECKPOINT_EVERY_S seconds.

    Not entirely: a writer that never pauses (a training run saving a checkpoint every
    few steps, in a transaction still open when this thread wakes) outruns a copy that
    lets it go on. The WAL, never folded in whole, never starts over and grows until the
    disk is full. So past WAL_BOUND_BYTES SQLite's own checkpoint runs after each commit,
    in the writer: the one writing too fast is the one that waits. This thread then stands
    aside, as a copy of its own running at the commit would have the writer's skipped.
    """

    CHECKPOINT_EVERY_S = 30.0

    def __init__(self, path: Path, wal_path: Path) -> None:
        self._path = path
        self._wal_path = wal_path
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="wal-checkpoint", daemon=True)
        self._thread.start()

    @staticmethod
    def hand_over(db: sqlite_utils.Database) -> None:
        """Leave db's checkpoints to the thread, up to WAL_BOUND_BYTES."""
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        db.execute(f"PRAGMA wal_autocheckpoint = {WAL_BOUND_BYTES // page_size}")

    def request(self) -> None:
        self._wake.set()

    def close(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join()

    def _wal_size(self) -> int:
        try:
            return self._wal_path.stat().st_size
        except FileNotFoundError:
            return 0

    def _run(self) -> None:
        conn = sqlite3.connect(self._path, timeout=BUSY_TIMEOUT_MS / 1000)
        try:
            while not self._stopping:
                self._wake.wait(self.CHECKPOINT_EVERY_S)
                self._wake.clear()
                if self._wal_size() <= WAL_BOUND_BYTES:
                    try:
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    except sqlite3.Error as exc:  # the writers' own checkpoints go on; this one tries again later
                        log.warning("folding the write-ahead log into %s failed: %s", self._path, exc)
        finally:
            conn.close()


def connect(path: Path) -> sqlite_utils.Database:
    """Open (creating if needed) the database at path with the appliance's pragmas; one this user may only read is
    refused here (SQLite would open it read-only and fail at the first write)."""
    for needed in (path, path.parent):  # the -wal and -shm files are made beside it
        if needed.exists() and not os.access(needed, os.W_OK):
            raise StoreError(f"the database {path} cannot be written by this user ({needed} is read-only to it)",
                             hint="run the command as the appliance's user (sudo -u appliance), or fix the owner and"
                                  " mode of the state directory and its files")
    try:
        conn = sqlite3.connect(
            path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
        )
        if conn.execute("PRAGMA page_count").fetchone()[0] == 0:
            # Large pages: the store is mostly 1 MiB encrypted chunks. Incremental auto-vacuum, which only a new
            # database can take without a rewrite: pages freed by deletions can go back to the disk (store/space).
            conn.execute("PRAGMA page_size = 65536")
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        for pragma in PRAGMAS:
            conn.execute(pragma)
        _temporary_files_beside(conn, path.parent)
    except sqlite3.DatabaseError as exc:
        if _full(path.parent):  # SQLite says only "disk I/O error" then
            raise StoreFull(f"cannot open the database {path}: its disk is full ({exc})", hint=FULL_HINT) from exc
        if isinstance(busy := disk_error(exc), StoreBusy):
            raise busy from exc
        raise StoreError(
            f"cannot open the database {path}: {exc}",
            hint="check the path and its permissions; restore from a backup if the file is damaged",
        ) from exc
    return sqlite_utils.Database(conn)


_temporary_folder_chosen = threading.Lock()


def _temporary_files_beside(conn: sqlite3.Connection, folder: Path) -> None:
    """SQLite's temporary files (a statement's journal, a large sort, VACUUM's copy of the whole store) in the
    store's own private folder, not /var/tmp: they hold its pages, and compaction's copy needs that disk's room.
    The setting is the process's, safe to change only while no other thread uses SQLite, so it is made once, at the
    process's first connection (a later store's folder that is gone: SQLite falls back to /var/tmp)."""
    if not _temporary_folder_chosen.acquire(blocking=False):
        return
    quoted = str(folder.absolute()).replace("'", "''")
    conn.execute(f"PRAGMA temp_store_directory = '{quoted}'")


def connect_read_only(path: Path) -> sqlite_utils.Database:
    """Open the database to look at it, writing nothing, not even SQLite's -wal and -shm files.

    While a writer runs, its -wal and -shm files exist and are shared. Without one, a read-only
    connection would still create them, owned by whoever looks (root, say), and the service could
    not open them afterwards; so then the file is read as immutable, which it is while nobody writes.
    """
    immutable = not any(path.with_name(path.name + suffix).exists() for suffix in ("-wal", "-shm"))
    uri = path.absolute().as_uri() + "?mode=ro" + ("&immutable=1" if immutable else "")
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000,
                               check_same_thread=False)
        conn.execute("PRAGMA schema_version").fetchone()  # fails here, not later, on a file that is no database
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"cannot open the database {path}: {exc}",
                         hint="check the path and its permissions; restore from a backup if the file is damaged") from exc
    return sqlite_utils.Database(conn)


def _full(folder: Path) -> bool:
    try:
        return shutil.disk_usage(folder).free < FULL_BELOW_BYTES
    except OSError:
        return False


@contextmanager
def transaction(db: sqlite_utils.Database) -> Iterator[None]:
    """Run the block as one write transaction; nested calls become savepoints."""
    conn = db.conn
    if conn.in_transaction:
        conn.execute("SAVEPOINT nested")
        try:
            yield
        except BaseException:
            if conn.in_transaction:  # see below
                conn.execute("ROLLBACK TO nested")
                conn.execute("RELEASE nested")
            raise
        conn.execute("RELEASE nested")
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:  # SQLite rolled back itself on some errors (a full disk): that error is the one told
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def backup(db: sqlite_utils.Database, target: Path, progress: Callable[[int, int], None]) -> None:
    """Copy the live database to target with SQLite's online backup API, in one step.

    Copied in steps, a backup starts over whenever another connection writes in between
    (a job's heartbeat every second), so a large store might never finish; one step is one
    read transaction, a consistent snapshot, and under WAL it holds no writer back.
    """
    os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    dest = sqlite3.connect(target)
    try:
        db.conn.backup(dest, pages=-1, progress=lambda _status, left, total: progress(total - left, total))
        dest.execute("PRAGMA journal_mode = DELETE")  # a backup is one self-contained file
        # Pages are copied as they are: a damaged store makes a damaged copy, which must not pass for a backup (nor
        # push a good one out of those kept).
        if problems := integrity_problems(dest):
            raise BackupError(f"the store is damaged, so a copy of it would be too: {'; '.join(problems[:3])}",
                              hint=RESTORE_HINT)
    finally:
        dest.close()
    fsync(target)  # durable before the caller renames it into place


def disk_error(exc: sqlite3.DatabaseError) -> StoreError | None:
    """What an operator is told when SQLite raised exc for a cause outside the appliance: the database file is
    damaged, there is no room to write, or another process held the write lock too long; None for any other error
    (a bug)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        return StoreDamaged(f"the store's database file is damaged ({exc})", hint=RESTORE_HINT)
    if code == sqlite3.SQLITE_FULL:
        return StoreFull(f"the disk is full: SQLite could not write ({exc})", hint=FULL_HINT)
    if code == sqlite3.SQLITE_BUSY:
        return StoreBusy(f"the store is busy: another process held its write lock for {BUSY_TIMEOUT_MS // 1000} s",
                         hint="try again when it is done: a long import, a compaction, or a program that has the"
                              " database open ('fuser' on appliance.db names it); nothing was changed")
    return None


def integrity_problems(conn: sqlite3.Connection) -> list[str]:
    """What SQLite's integrity check finds wrong with a database (its first few findings); none for a sound one."""
    try:
        found = [row[0] for row in conn.execute("PRAGMA integrity_check(5)")]
    except sqlite3.DatabaseError as exc:  # damage bad enough that the check itself cannot read on
        return [str(exc)]
    return [] if found == ["ok"] else found


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):  # not Linux
        return None
    call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return call


_SYNC_FILE_RANGE = _sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(path: Path) -> None:
    """Have the kernel start writing the file's dirty pages to disk now, without waiting for them.

    A commit must fsync the WAL, and an fsync that finds a whole large blob dirty takes as
    long as the disk needs for all of it, after every other part of the put is done. Started
    while the put goes on, the disk writes beside the crypto and the commit finds little left
    (PostgreSQL's *_flush_after settings do the same). Where sync_file_range is missing this
    does nothing: the commit's fsync still makes the data durable, only later.
    """
    if _SYNC_FILE_RANGE is None:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        _SYNC_FILE_RANGE(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)
    finally:
        os.close(fd)


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
