"""The database: pragmas on every open, all-or-nothing transactions, schema versions."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from appliance import store
from appliance.core.config import Settings
from appliance.core.errors import SchemaTooNew
from appliance.store import Store, audit, blobs, lifecycle, migrations
from appliance.store.db import transaction
from tests.conftest import run_cli


def test_pragmas_hold_on_every_open(opened: Store, settings: Settings) -> None:
    opened.close()
    with store.open(settings) as reopened:
        db = reopened.db
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1


def test_sqlites_temporary_files_go_beside_the_store_not_to_var_tmp(opened: Store, settings: Settings) -> None:
    """A statement's journal or VACUUM's copy holds the store's pages: in its private folder, on its disk. In a
    process of its own, as every command and the daemon are (the setting is the process's first store's)."""
    opened.close()
    script = ("import sys; from appliance import store; from appliance.core import config\n"
              "with store.open(config.load()) as s:\n"
              "    print(s.db.execute('PRAGMA temp_store_directory').fetchone()[0])")
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert shown.stdout.strip() == str(settings.state_dir.absolute())


def test_a_transaction_is_all_or_nothing_and_nests(opened: Store) -> None:
    db = opened.db
    with pytest.raises(RuntimeError), transaction(db):
        db.execute("INSERT INTO meta (key, value) VALUES ('a', 1)")
        raise RuntimeError
    with transaction(db):
        db.execute("INSERT INTO meta (key, value) VALUES ('b', 1)")
        with pytest.raises(RuntimeError), transaction(db):
            db.execute("INSERT INTO meta (key, value) VALUES ('c', 1)")
            raise RuntimeError
    names = {row[0] for row in db.execute("SELECT key FROM meta")}
    assert "b" in names and "a" not in names and "c" not in names


def test_a_new_database_gets_the_latest_schema(opened: Store) -> None:
    assert migrations.current_version(opened.db) == migrations.LATEST
    assert {"meta", "blobs", "blob_chunks", "audit", "schema_version"} <= set(opened.db.table_names())


def test_a_database_from_a_newer_appliance_is_refused(opened: Store, settings: Settings) -> None:
    opened.db.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, 'later')", (migrations.LATEST + 1,))
    opened.close()
    with pytest.raises(SchemaTooNew):
        store.open(settings)
    result = run_cli("store", "info")
    assert result.returncode == 1
    assert f"schema version {migrations.LATEST + 1}" in result.stderr
    assert "upgrade the appliance" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_file_that_is_not_a_database_gets_a_clear_message(settings: Settings) -> None:
    settings.state_dir.mkdir(parents=True)
    settings.db_path.write_bytes(b"this is not sqlite" * 100)
    result = run_cli("store", "info")
    assert result.returncode == 1
    assert f"cannot open the database {settings.db_path}" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_audit_table_refuses_updates_and_deletes(opened: Store) -> None:
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        opened.db.execute("UPDATE audit SET actor = 'x'")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        opened.db.execute("DELETE FROM audit")


def test_an_older_database_is_migrated_in_place_keeping_its_data(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(migrations, "LATEST", 1)
    with lifecycle.init(settings) as old:
        blob_id = blobs.put(old, b"kept across the upgrade")
        assert "datasets" not in old.db.table_names()
    monkeypatch.undo()

    with store.open(settings) as upgraded:
        assert migrations.current_version(upgraded.db) == migrations.LATEST
        assert "datasets" in upgraded.db.table_names()
        assert blobs.read(upgraded, blob_id) == b"kept across the upgrade"
        assert audit.verify(upgraded).ok


def test_the_wal_is_folded_into_the_database_in_the_background(opened: Store, settings: Settings) -> None:
    import os
    import time

    before = settings.db_path.stat().st_size
    blobs.put(opened, os.urandom(64 << 20))  # the writer does not checkpoint...
    deadline = time.monotonic() + 30
    while settings.db_path.stat().st_size < before + (64 << 20) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert settings.db_path.stat().st_size >= before + (64 << 20)  # ...the checkpointer thread did
    opened.close()
    wal = settings.db_path.with_name(settings.db_path.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0


def test_the_wal_stays_bounded_under_writes_that_never_pause(opened: Store, settings: Settings,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A training run saving checkpoints back to back once grew the WAL by gigabytes, never folded in whole."""
    import os

    from appliance.store import db

    bound = 16 << 20
    monkeypatch.setattr(db, "WAL_BOUND_BYTES", bound)
    opened.close()  # reopened so that its checkpointer reads the bound
    with store.open(settings) as writing:
        sizes = []
        for _ in range(150):
            with transaction(writing.db):  # as a checkpoint is saved: the put wakes the checkpointer mid-transaction
                blobs.put(writing, os.urandom(1 << 20))
            sizes.append(settings.wal_path.stat().st_size)
    assert max(sizes) < 2 * bound, f"the WAL grew to {max(sizes) >> 20} MiB"


def test_a_store_this_user_may_only_read_is_refused_with_what_to_do(opened: Store, settings: Settings) -> None:
    """SQLite would open it read-only and fail at the first write (a background checkpoint's traceback, once)."""
    opened.close()
    settings.db_path.chmod(0o400)
    as_user = ([] if os.geteuid() else  # root may write anything: run without that privilege
               ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"])
    if as_user and shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to drop root's privilege over file modes")
    result = subprocess.run([*as_user, sys.executable, "-m", "appliance", "keys", "status"], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"the database {settings.db_path} cannot be written by this user" in result.stderr


def test_a_full_disk_is_named_as_one_not_a_bug(opened: Store, settings: Settings, tmp_path: Path) -> None:
    """SQLite's 'database or disk is full', and a write the disk refuses, reach the operator as StoreFull."""
    from appliance.core.errors import StoreFull
    from appliance.store import db as store_db

    small = sqlite3.connect(tmp_path / "small.db")
    small.execute("CREATE TABLE t (x BLOB)")
    small.execute("PRAGMA max_page_count = 3")  # a disk with room for three pages
    with pytest.raises(sqlite3.DatabaseError) as raised:
        small.execute("INSERT INTO t VALUES (?)", (os.urandom(65536),))
    found = store_db.disk_error(raised.value)
    assert isinstance(found, StoreFull) and "the disk is full" in found.message and "df -h" in (found.hint or "")
    opened.close()
    with open("/dev/full", "w") as full:  # a disk with no room at all
        answer = subprocess.run([sys.executable, "-m", "appliance", "audit", "export"], stdout=full,
                                stderr=subprocess.PIPE, text=True, check=False)
    assert answer.returncode == 1 and "error: no space left on the disk" in answer.stderr
    assert "internal error" not in answer.stderr


def test_a_transaction_sqlite_rolled_back_itself_reports_the_cause_not_a_failed_rollback(opened: Store) -> None:
    """On a full disk SQLite ends the transaction itself; ROLLBACK then failed ('no transaction is active') and
    that hid the full disk behind an internal error."""
    with pytest.raises(ValueError, match="the cause"), transaction(opened.db):
        opened.db.execute("INSERT INTO meta (key, value) VALUES ('x', 'y')")
        opened.db.conn.execute("ROLLBACK")  # as SQLite does on SQLITE_FULL
        raise ValueError("the cause")
    with pytest.raises(ValueError, match="the cause"), transaction(opened.db), transaction(opened.db):
        opened.db.conn.execute("ROLLBACK")
        raise ValueError("the cause")
    assert opened.db.execute("SELECT 1 FROM meta WHERE key = 'x'").fetchone() is None


def test_a_store_another_process_keeps_locked_is_named_busy_not_a_bug(opened: Store, settings: Settings) -> None:
    from appliance.core.errors import StoreBusy
    from appliance.store import db as store_db

    holder = sqlite3.connect(settings.db_path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        waiting = sqlite3.connect(settings.db_path, timeout=0.1)
        with pytest.raises(sqlite3.OperationalError) as raised:
            waiting.execute("INSERT INTO meta (key, value) VALUES ('x', 'y')")
        waiting.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    found = store_db.disk_error(raised.value)
    assert isinstance(found, StoreBusy) and "another process held its write lock" in found.message
    assert "nothing was changed" in (found.hint or "")
