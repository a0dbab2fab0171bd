"""Backups of the store in one directory: taken online, kept N, checked end to end, restored.

A backup is SQLite's online copy of the database (lifecycle.backup), so its blobs stay
as encrypted as they are in the store and it opens only with the master key that wrapped
the store when it was taken; the fingerprint of that key is in its meta table, so a
backup older than a key rotation can say which key it needs.

verify() reads a backup without touching the live store: SQLite's integrity check, the
schema version, the store secret unwrapped by the master key, every blob decrypted
(streamed, one chunk at a time) and the audit chain walked.

restore() replaces the database of a stopped appliance. The audit head file outside the
database vouches for the live chain, which is ahead of the restored one; a restore is a
rewind the operator chose, so the restored chain gets a `backup.restored` record naming
the head it abandons, and that record's signed head replaces the head file. The copy is
prepared beside the database and renamed over it; the replaced database (with its -wal)
is kept aside.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlite_utils

from appliance import store as store_pkg
from appliance.core import clock, files
from appliance.core.config import Settings
from appliance.core.errors import BackupError, KeyMismatch, StoreError, TamperDetected
from appliance.store import Store, alerts, anchor, audit, blobs, keys, lifecycle, migrations
from appliance.store import db as store_db
from appliance.store.db import transaction

NAME = re.compile(r"appliance-(\d{8}T\d{6}\.\d{6}Z)\.db")
STAMP = "%Y%m%dT%H%M%S.%fZ"
RETRY_S = 300.0  # after a failed scheduled backup, the first next try; each failure after doubles it

log = logging.getLogger("appliance.backups")
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Backup:
    """A backup file as a listing shows it; what could not be read from it is None, with the reason."""

    path: Path
    created_at: datetime
    bytes: int
    schema_version: int | None = None
    key_fingerprint: str | None = None
    audit_records: int | None = None
    store_id: str | None = None
    problem: str | None = None

    def summary(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "path": str(self.path), "created_at": self.created_at.isoformat()}


@dataclass
class Verification:
    """Each check of a backup with its outcome; ok only if every one passed."""

    path: Path
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(passed for _, passed, _ in self.checks)

    @property
    def problems(self) -> list[str]:
        return [f"{name}: {detail}" for name, passed, detail in self.checks if not passed]

    def add(self, name: str, passed: bool, detail: str) -> bool:
        self.checks.append((name, passed, detail))
        return passed


@dataclass(frozen=True)
class Restored:
    backup: Path
    audit_records: int  # in the restored chain, the restore's own record included
    abandoned_head: int | None  # the live chain's head seq that the restore rewound from
    replaced: Path | None  # where the database it replaced was kept
    rewrapped: dict[str, str] | None = None  # the fingerprints the store secret moved from and to, if it moved


# -- taking and keeping ------------------------------------------------------------


def create(store: Store, progress: Progress = lambda done, total: None, *, actor: str | None = None,
           scheduled: bool = False) -> tuple[Backup, list[Path]]:
    """Take a backup into the backup directory, then delete the oldest beyond `backup.keep`."""
    directory = private_dir(store.settings.backup_dir)
    target = directory / f"appliance-{clock.now().strftime(STAMP)}.db"
    copy(store, target, progress, action="backup.created", actor=actor, scheduled=scheduled,
         key_fingerprint=store.master.fingerprint)
    return describe(target), prune(store, actor=actor)


def copy(store: Store, target: Path, progress: Progress = lambda done, total: None, **audited: Any) -> int:
    """lifecycle.backup, the copy verified end to end under the live store's key before it is kept: SQLite's check
    passes a store whose encrypted blobs rotted on the disk, and such a copy must not pass for a backup, nor push a
    good one out of those kept. BackupError naming what failed; the copy's size otherwise."""

    def verified(partial: Path) -> None:
        checked = verify(store.settings, partial, progress=progress, master=store.master)
        if not checked.ok:
            raise BackupError(f"the store is damaged, so a copy of it would be too: {'; '.join(checked.problems)}",
                              hint=store_db.RESTORE_HINT)

    return lifecycle.backup(store, target, progress, check=verified, **audited)


def prune(store: Store, *, actor: str | None = None) -> list[Path]:
    """Delete the backups beyond the newest `backup.keep`; the deletion is on the record."""
    old = _files(store.settings)[store.settings.backup.keep:]
    if old:
        with audit.operation(store, "backup.pruned", str(store.settings.backup_dir), actor=actor,
                             deleted=[path.name for path in old], keep=store.settings.backup.keep):
            for path in old:
                path.unlink(missing_ok=True)
    return old


def list_backups(settings: Settings) -> list[Backup]:
    """The backups in the backup directory, newest first."""
    return [describe(path) for path in _files(settings)]


def _files(settings: Settings) -> list[Path]:
    """The backup files, newest first (their names hold the time they were taken)."""
    directory = settings.backup_dir
    if directory.exists() and not directory.is_dir():
        raise BackupError(f"the backup directory {directory} is a file, not a folder",
                          hint="set backup.dir to a folder, or move that file away")
    found = [path for path in directory.glob("appliance-*.db") if NAME.fullmatch(path.name)]
    return sorted(found, key=lambda path: path.name, reverse=True)


def describe(path: Path) -> Backup:
    """What a backup says about itself, read without any key."""
    backup = Backup(path, _taken_at(path), path.stat().st_size)
    try:
        database = store_db.connect_read_only(path)
    except StoreError as exc:
        return dataclasses.replace(backup, problem=exc.message)
    try:
        return dataclasses.replace(
            backup, schema_version=migrations.current_version(database),
            key_fingerprint=keys.stored_fingerprint(database), store_id=keys.stored_id(database),
            audit_records=database.execute("SELECT COALESCE(MAX(seq), 0) FROM audit").fetchone()[0])
    except sqlite3.DatabaseError as exc:
        return dataclasses.replace(backup, problem=f"not a readable appliance database: {exc}")
    finally:
        database.conn.close()


def _taken_at(path: Path) -> datetime:
    match = NAME.fullmatch(path.name)
    return (datetime.strptime(match.group(1), STAMP).replace(tzinfo=UTC) if match
            else datetime.fromtimestamp(path.stat().st_mtime, UTC))


def due_in_s(settings: Settings, since: datetime) -> float | None:
    """Seconds until the next scheduled backup (<= 0: now); None when the schedule is off.

    The next one is due `every_hours` after the newest backup, or after `since` (the
    daemon's start) when there is none yet.
    """
    if not settings.backup.every_hours:
        return None
    found = _files(settings)
    last = _taken_at(found[0]) if found else since
    due = last + timedelta(hours=settings.backup.every_hours)
    return (due - clock.now()).total_seconds()


def _alert_failed(store: Store, exc: Exception) -> None:
    """A scheduled backup that failed is an operator's business, not only a log line: until one is taken, the last
    good one ages."""
    with contextlib.suppress(Exception):  # the store may be what failed
        alerts.raise_alert(store, "backup", str(store.settings.backup_dir), "error",
                           f"the scheduled backup failed: {getattr(exc, 'message', exc)}"
                           + (f" ({exc.hint})" if getattr(exc, "hint", None) else "")
                           + "; 'appliance backup list' shows the last good one")


def private_dir(directory: Path) -> Path:
    """The backup directory, created 0700; one that others may enter is refused."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if directory.stat().st_mode & 0o077:
        raise BackupError(f"the backup directory {directory} is open to other users (mode "
                          f"{directory.stat().st_mode & 0o777:04o})", hint=f"run 'chmod 700 {directory}'")
    return directory


# -- checking ------------------------------------------------------------------------


def verify(settings: Settings, path: Path, passphrase: str | None = None,
           progress: Progress = lambda done, total: None, *, master: keys.MasterKey | None = None) -> Verification:
    """Check a backup end to end, reading only the backup file and the master key (master, or the configured one).

    A backup the master key does not open raises KeyMismatch naming the key it needs.
    """
    result = Verification(path)
    if not path.exists():
        raise BackupError(f"there is no backup file {path}", hint="'appliance backup list' shows the backups")
    files.regular_file(path, "the backup", error=BackupError)  # SQLite would read a pipe or a device without end
    try:
        database = store_db.connect_read_only(path)
    except StoreError as exc:
        result.add("sqlite", False, exc.message)
        return result
    try:
        _check(settings, database, path, master or keys.find(settings, database, passphrase), progress, result)
    except sqlite3.DatabaseError as exc:
        result.add("sqlite", False, f"the file is damaged: {exc}")
    finally:
        database.conn.close()
    return result


def _check(settings: Settings, database: sqlite_utils.Database, path: Path, master: keys.MasterKey,
           progress: Progress, result: Verification) -> None:
    damage = store_db.integrity_problems(database.conn)
    if not result.add("integrity", not damage, "; ".join(damage) or "ok"):
        return
    version = migrations.current_version(database)
    if not result.add("schema", 0 < version <= migrations.LATEST,
                      f"version {version}" + ("" if version <= migrations.LATEST
                                              else f", newer than this appliance knows ({migrations.LATEST})")):
        return
    if not keys.is_initialised(database):
        result.add("key", False, "the backup holds no store secret")
        return
    opened = _unlocked(settings, database, path, master)
    result.add("key", True, f"the master key {opened.master.fingerprint} opens the store secret")
    total = database.execute("SELECT COALESCE(SUM(size), 0) FROM blobs").fetchone()[0]
    done, bad = 0, []
    for blob_id, size in database.execute("SELECT id, size FROM blobs ORDER BY id").fetchall():
        try:
            for chunk in blobs.get(opened, blob_id):
                done += len(chunk)
                progress(done, total)
        except TamperDetected as exc:
            bad.append(exc.message)
            done += size
    count = database.execute("SELECT COUNT(*) FROM blobs").fetchone()[0]
    result.add("blobs", not bad, "; ".join(bad) if bad else f"all {count} decrypt and match their ids ({total} bytes)")
    chain = audit.verify(opened, head_file=False)
    result.add("audit", chain.ok, chain.problem or f"the chain of {chain.records} records is intact")


def _unlocked(settings: Settings, database: sqlite_utils.Database, path: Path, master: keys.MasterKey) -> Store:
    """The backup as a read-only store under the master key, or KeyMismatch naming the key it needs."""
    try:
        secret = keys.open_secret(database, master)
    except KeyMismatch:
        needed = keys.stored_fingerprint(database) or "unknown (the backup predates key fingerprints)"
        raise KeyMismatch(
            f"the backup {path.name} needs the master key {needed}; the key given is {master.fingerprint}"
            f" ({master.source}), so it cannot be read",
            hint="give the key file it was taken under with --key-file (a restore then re-wraps it under this"
                 " appliance's key), or the passphrase it was taken under as APPLIANCE_PASSPHRASE, exactly as typed"
                 " then; 'appliance backup list' shows the key each backup needs; nothing was changed",
        ) from None
    store_id = keys.stored_id(database)
    return Store(database, settings, master, store_id, secret, read_only=True)


# -- restoring -----------------------------------------------------------------------


@dataclass(frozen=True)
class Undone:
    """What restoring a backup over the live store takes back, read without a key: to be confirmed first."""

    backup: Backup
    other_store: str | None  # the backup's store id, where it is not the live store's
    live_records: int  # the live chain's length
    actions: dict[str, int]  # audited actions after the backup's last record, by name: undone by the restore


def undone_by(settings: Settings, path: Path) -> Undone:
    """What a restore of the backup at path would undo in the live store (nothing where there is none yet)."""
    backup = describe(path)
    if backup.problem is not None:
        raise BackupError(f"the backup {path.name} cannot be read: {backup.problem}",
                          hint="'appliance backup list' shows the other backups; nothing was changed")
    if not settings.db_path.exists():
        return Undone(backup, None, 0, {})
    database = store_db.connect_read_only(settings.db_path)
    try:
        live_id = keys.stored_id(database)
        live_records = database.execute("SELECT COALESCE(MAX(seq), 0) FROM audit").fetchone()[0]
        actions = dict(database.execute(  # the backup's own record comes after the copy: it undoes nothing
            "SELECT action, COUNT(*) FROM audit WHERE seq > ? AND NOT (action = 'backup.created' AND object = ?)"
            " GROUP BY action ORDER BY action", (backup.audit_records or 0, str(path.absolute()))).fetchall())
    finally:
        database.conn.close()
    other = backup.store_id if backup.store_id and live_id and backup.store_id != live_id else None
    return Undone(backup, other, live_records, {} if other else actions)


def restore(settings: Settings, path: Path, passphrase: str | None = None, progress: Progress = lambda d, t: None,
            *, actor: str | None = None, backup_key: keys.MasterKey | None = None, checkpoint: Path | None = None,
            confirm: Callable[[Undone], None] = lambda undone: None) -> Restored:
    """Replace the database of a stopped appliance with a verified backup; the caller checked that none runs.

    backup_key: the key the backup was taken under, where it is not the one this appliance is configured with (the
    key before a rotation, another box's): the restored store is re-wrapped under the configured key, so that it
    opens as the appliance is set up to open it. checkpoint: one of the backup's own log taken after it (the old
    box's newest, on a new box), so that the restore's record says how far the log it gives up went and that
    checkpoint is explained by it from then on. confirm is shown what the restore undoes once the backup passed its
    check, and raises to change nothing."""
    path = path.absolute()
    checked = verify(settings, path, passphrase, progress, master=backup_key)
    if not checked.ok:
        raise BackupError(f"the backup {path.name} failed its check: {'; '.join(checked.problems)}",
                          hint="nothing was changed; 'appliance backup list' shows the other backups")
    undone = undone_by(settings, path)
    given_up = _checkpoint_of(undone.backup, checkpoint) if checkpoint is not None else None
    confirm(undone)
    staging = settings.state_dir / "restore.partial"
    shutil.rmtree(staging, ignore_errors=True)  # left by a restore that was interrupted
    staging.mkdir(mode=0o700, parents=True)
    try:
        staged = dataclasses.replace(settings, state_dir=staging)
        _copy_private(path, staged.db_path)
        rewrapped = _under_configured_key(staged, backup_key, passphrase) if backup_key is not None else None
        abandoned = anchor.read_head(settings.audit_head_path)
        stamp = clock.now().strftime(STAMP)
        replaced = settings.db_path.with_name(f"{settings.db_path.name}.replaced-{stamp}")
        with store_pkg.open(staged, passphrase) as restored:  # migrates a backup of an older schema
            head = restored.db.execute("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
            if given_up is not None and _reaches_further(restored, given_up, abandoned):
                abandoned = given_up
            audit.record_rewind(  # a rewind by choice: the head moves to this log
                restored, "backup.restored", str(settings.db_path), actor=actor, backup=str(path),
                backup_head={"seq": head[0], "hash": head[1]} if head else None,
                abandoned_head=({"seq": abandoned.seq, "hash": abandoned.hash, "store_id": abandoned.store_id}
                                if abandoned else None),
                replaced=str(replaced) if settings.db_path.exists() else None, rewrapped=rewrapped)
            records = restored.db.execute("SELECT MAX(seq) FROM audit").fetchone()[0]
        store_db.fsync(staged.db_path)  # closing folded the WAL in
        kept = _set_aside(settings.db_path, replaced)
        os.replace(staged.db_path, settings.db_path)
        keys.fsync_dir(settings.state_dir)
        # The restored chain's head, signed when its record was written, now vouches for the store.
        os.replace(staged.audit_head_path, settings.audit_head_path)
        keys.fsync_dir(settings.state_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Restored(path, records, abandoned.seq if abandoned else None, kept, rewrapped)


def _under_configured_key(staged: Settings, backup_key: keys.MasterKey, passphrase: str | None) -> dict[str, str] | None:
    """Re-wrap a restored copy, which backup_key opens, under the key the appliance is configured with (its
    credential or key file, else a new salt for its passphrase): what moved, or None where it is that key already."""
    database = store_db.connect(staged.db_path)
    try:
        configured = keys.stored_key(staged)
        if configured is None and passphrase is None:
            raise keys.missing(staged, made=True)
        if configured is not None and configured.fingerprint == backup_key.fingerprint:
            return None
        new = configured or keys.new_passphrase_key(passphrase or "")
        with transaction(database):
            keys.rewrap_all(database, backup_key, new)
    finally:
        database.conn.close()
    return {"from": backup_key.fingerprint, "to": new.fingerprint}


def _checkpoint_of(backup: Backup, path: Path) -> anchor.Head:
    """The signed head in path, refused unless it is a checkpoint of the backup's store."""
    head = anchor.signed_checkpoint(path)
    if head is None:
        raise BackupError(f"{path} is not a signed audit checkpoint",
                          hint="give a file written by 'appliance audit checkpoint'; nothing was changed")
    if head.store_id != backup.store_id:
        raise BackupError(f"the checkpoint {path.name} is of another store ({head.store_id}) than the backup's"
                          f" ({backup.store_id})", hint="give one taken on the box the backup came from, after the"
                          " backup; nothing was changed")
    return head


def _reaches_further(restored: Store, given_up: anchor.Head, live: anchor.Head | None) -> bool:
    """Whether the checkpoint, signed by the restored store's key, vouches for more of its log than the backup and
    this box's head file hold; BackupError for one the backup contradicts (forged, or of a log rewritten since)."""
    if not given_up.is_signed_by(anchor.public_key(restored)):
        raise BackupError("the checkpoint is not signed by the backup's store", hint="give one written by 'appliance"
                          " audit checkpoint' on the box the backup came from; nothing was changed")
    held = restored.db.execute("SELECT hash FROM audit WHERE seq = ?", (given_up.seq,)).fetchone()
    if held is not None:
        if held[0] != given_up.hash:
            raise BackupError(f"the checkpoint vouches for a record {given_up.seq} other than the backup's",
                              hint="the backup's log or the checkpoint's was rewritten: check both ('appliance audit"
                                   " verify --checkpoint' on the box it came from); nothing was changed")
        return False  # the backup holds what it vouches for: nothing past it is given up
    return live is None or live.store_id != given_up.store_id or live.seq < given_up.seq


def _copy_private(source: Path, target: Path) -> None:
    with source.open("rb") as src, os.fdopen(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
        dst.flush()
        os.fsync(dst.fileno())


def left_aside(settings: Settings) -> list[Path]:
    """What restores left beside the store: each database they replaced (with its -wal and -shm), and the staging
    folder of one that was killed; the next restore clears the latter, the former wait for the operator."""
    found = sorted(settings.state_dir.glob(f"{settings.db_path.name}.replaced-*"))
    staging = settings.state_dir / "restore.partial"
    return found + ([staging] if staging.exists() else [])


def _set_aside(database: Path, aside: Path) -> Path | None:
    """Keep the database being replaced, with its -wal and -shm, under another name; None if there was none.

    The database is linked first, so there is always a file at its name; the -wal must go
    before the new database arrives, or SQLite would replay it onto the wrong file.
    """
    kept = None
    if database.exists():
        os.link(database, aside)
        kept = aside
    for suffix in ("-wal", "-shm"):
        journal = database.with_name(database.name + suffix)
        if journal.exists():
            os.replace(journal, aside.with_name(aside.name + suffix))
    return kept


# -- the schedule ------------------------------------------------------------------------------


def keep_taking(settings: Settings, passphrase: str | None, stop: threading.Event) -> None:
    """Scheduled online backups until stop is set; a thread with its own connection, so jobs never wait on one."""
    started = clock.now()
    if due_in_s(settings, started) is None:
        return
    failures, retry_at = 0, started
    with store_pkg.open(settings, passphrase) as opened:
        while True:
            wait = max(due_in_s(settings, started) or 0.0, (retry_at - clock.now()).total_seconds())
            if wait <= 0:
                try:
                    made, pruned = create(opened, actor="service:backup", scheduled=True)
                    log.info("backup %s taken (%d bytes); %d old ones deleted", made.path, made.bytes, len(pruned))
                    failures, wait = 0, 1.0
                except Exception as exc:  # noqa: BLE001  a full disk must not stop the daemon: say so, try again later
                    failures += 1
                    wait = retry_wait_s(failures, settings.backup.every_hours)
                    retry_at = clock.now() + timedelta(seconds=wait)
                    log.error("scheduled backup failed: %s; the next try in %.0f minutes",
                              getattr(exc, "message", exc), wait / 60)
                    _alert_failed(opened, exc)
            if stop.wait(min(wait, RETRY_S)):  # a manual backup in between moves the next one
                return


def retry_wait_s(failures: int, every_hours: float) -> float:
    """How long after its failures-th failure in a row a scheduled backup is tried again: RETRY_S, doubled by each
    failure after the first, at most the schedule's period. Each try copies and decrypts the whole store, so a
    damaged one is not read end to end every five minutes until someone repairs it; the alert is up at once."""
    return max(RETRY_S, min(RETRY_S * 2 ** min(failures - 1, 32), every_hours * 3600))
