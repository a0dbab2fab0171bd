"""Backups as an operator uses them: taken, kept N, checked end to end, refused when they cannot be used."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from appliance import store
from appliance.access import users
from appliance.core import config
from appliance.core.errors import BackupError
from appliance.daemon import doctor
from appliance.store import Store, alerts, audit, backups
from tests.conftest import run_cli
from tests.daemon import Daemon, free_port


def _names(settings: config.Settings) -> list[str]:
    return [backup.path.name for backup in backups.list_backups(settings)]


def test_retention_keeps_the_newest_n_in_a_private_directory(opened: Store) -> None:
    opened.settings = dataclasses.replace(opened.settings, backup=config.BackupSettings(keep=2))
    made = [backups.create(opened)[0].path for _ in range(3)]
    assert _names(opened.settings) == [made[2].name, made[1].name]  # newest first; the oldest is gone
    assert not made[0].exists()
    assert stat.S_IMODE(opened.settings.backup_dir.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in made[1:])
    pruned = [row for row in audit.rows(opened) if row["action"] == "backup.pruned"]
    assert len(pruned) == 1 and made[0].name in pruned[0]["details"]
    assert sum(row["action"] == "backup.created" for row in audit.rows(opened)) == 3


def test_verify_passes_then_names_the_blob_chunk_whose_byte_was_flipped(opened: Store, tickets: str) -> None:
    made, _ = backups.create(opened)
    good = run_cli("backup", "verify", made.path.name)  # a name in the backup directory is enough
    assert good.returncode == 0, good.stderr
    assert "blobs" in good.stdout and f"backup {made.path.name} is good" in good.stdout

    blob_id = opened.db.execute("SELECT id FROM blobs").fetchone()[0]
    with sqlite3.connect(made.path) as db:
        rowid, data = db.execute("SELECT c.rowid, c.data FROM blob_chunks c JOIN blobs b USING (storage_id)"
                                 " WHERE b.id = ? AND c.idx = 0", (blob_id,)).fetchone()
        db.execute("UPDATE blob_chunks SET data = ? WHERE rowid = ?", (bytes([data[0] ^ 1]) + data[1:], rowid))
    bad = run_cli("backup", "verify", str(made.path))
    assert bad.returncode == 1
    assert "FAILED  blobs" in bad.stdout and f"blob {blob_id}: chunk 0 of 1 was changed" in bad.stdout
    assert "ok      integrity" in bad.stdout and "ok      audit" in bad.stdout  # it names what is wrong, only that
    assert "NOT usable" in bad.stdout

    before = opened.settings.db_path.read_bytes()
    refused = run_cli("backup", "restore", str(made.path), "--yes")
    assert refused.returncode == 1 and "failed its check" in refused.stderr and "nothing was changed" in refused.stderr
    assert opened.settings.db_path.read_bytes() == before


def test_a_damaged_store_makes_no_backup_and_the_good_ones_stay(opened: Store, tickets: str) -> None:
    opened.settings = dataclasses.replace(opened.settings, backup=config.BackupSettings(keep=1))
    good, _ = backups.create(opened)
    opened.close()
    path = opened.settings.db_path
    with sqlite3.connect(path) as db:  # what a failing disk does: a page of the stored chunks turned to noise
        (page,) = db.execute("SELECT pageno FROM dbstat WHERE name = 'blob_chunks' ORDER BY pageno LIMIT 1").fetchone()
        size = db.execute("PRAGMA page_size").fetchone()[0]
    with path.open("r+b") as file:
        file.seek((page - 1) * size)
        file.write(random.Random(3).randbytes(size))
    refused = run_cli("backup", "now")
    assert refused.returncode == 1 and "the store is damaged, so a copy of it would be too" in refused.stderr
    assert "restore the newest good backup" in refused.stderr
    assert _names(opened.settings) == [good.path.name]  # kept, not pushed out by a copy of the damage
    reading = run_cli("privacy", "erase", "--subject", "nobody@example.com", "--dry-run")
    assert reading.returncode == 1 and "internal error" not in reading.stderr, reading.stderr
    assert "the store's database file is damaged" in reading.stderr and "appliance backup restore" in reading.stderr
    doctor = run_cli("doctor")
    assert doctor.returncode == 1 and "FAIL  store" in doctor.stdout and "integrity check failed" in doctor.stdout


def test_a_restore_says_what_it_undoes_and_asks_and_waits_for_a_server_started_by_hand(opened: Store,
                                                                                       tmp_path: Path) -> None:
    contractor, _ = users.add(opened, "contractor", "viewer")
    made, _ = backups.create(opened)
    users.revoke(opened, contractor.id)  # done after the backup: the restore brings the user back
    opened.close()
    unasked = run_cli("backup", "restore", made.path.name)
    assert unasked.returncode == 2 and "give --yes" in unasked.stderr  # no terminal to confirm at: nothing done
    assert f"{made.path.name} was taken" in unasked.stdout and "user.revoke 1" in unasked.stdout
    assert "backup.created" not in unasked.stdout and "a revoked key or user comes back" in unasked.stdout
    assert not list(opened.settings.state_dir.glob("appliance.db.replaced-*"))

    port = free_port()
    served = subprocess.Popen([sys.executable, "-m", "appliance", "serve", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        answering = {"APPLIANCE_SERVE_PORT": str(port)}
        deadline = time.monotonic() + 60
        while "answers on" not in (refused := run_cli("backup", "restore", made.path.name, "--yes",
                                                      env=answering)).stderr and time.monotonic() < deadline:
            time.sleep(0.5)
        assert refused.returncode == 1 and f"an appliance server answers on http://127.0.0.1:{port}" in refused.stderr
    finally:
        served.terminate()
        served.wait(30)
    done = run_cli("backup", "restore", made.path.name, "--yes")
    assert done.returncode == 0, done.stderr
    with store.open(opened.settings) as restored:
        assert users.get(restored, contractor.id).revoked_at is None
    aside = backups.left_aside(opened.settings)  # the replaced store: it holds the revoked user, revoked
    assert aside and all(".db.replaced-" in path.name for path in aside)
    [check] = [check for check in doctor.run(opened.settings) if check.name == "backups"]
    assert check.status is doctor.Status.WARN and all(path.name in check.detail for path in aside)
    assert "delete them" in (check.hint or "")


def test_a_store_whose_encrypted_blob_rotted_makes_no_backup_and_the_good_ones_stay(opened: Store,
                                                                                      tickets: str) -> None:
    """A flipped bit inside a chunk's ciphertext: SQLite's own check passes, decryption does not."""
    opened.settings = dataclasses.replace(opened.settings, backup=config.BackupSettings(keep=1))
    good, _ = backups.create(opened)
    blob_id = opened.db.execute("SELECT id FROM blobs").fetchone()[0]
    rowid, data = opened.db.execute("SELECT c.rowid, c.data FROM blob_chunks c JOIN blobs b USING (storage_id)"
                                    " WHERE b.id = ? AND c.idx = 0", (blob_id,)).fetchone()
    opened.db.execute("UPDATE blob_chunks SET data = ? WHERE rowid = ?", (bytes([data[0] ^ 1]) + data[1:], rowid))
    with pytest.raises(BackupError, match=f"the store is damaged, so a copy of it would be too: blobs: blob {blob_id}"):
        backups.create(opened)
    assert _names(opened.settings) == [good.path.name]  # kept: the copy of the damage was not, nor pushed it out
    assert not list(opened.settings.backup_dir.glob("*.partial"))
    assert [row["outcome"] for row in audit.rows(opened) if row["action"] == "backup.created"] == ["ok"]
    copied = run_cli("store", "backup", str(opened.settings.state_dir / "copy.db"))
    assert copied.returncode == 1 and "the store is damaged" in copied.stderr
    assert not (opened.settings.state_dir / "copy.db").exists()

    scheduled = dataclasses.replace(opened.settings, backup=config.BackupSettings(every_hours=0.0001, keep=1))
    stop = threading.Event()
    taker = threading.Thread(target=backups.keep_taking, args=(scheduled, None, stop))
    taker.start()
    try:  # a schedule that fails is an alert an operator sees, not only a line in the daemon's log
        deadline = time.monotonic() + 30
        while not (raised := alerts.listed(opened)) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.set()
        taker.join()
    assert [(alert.source, alert.severity) for alert in raised] == [("backup", "error")]
    assert f"the scheduled backup failed: the store is damaged, so a copy of it would be too: blobs: blob {blob_id}" \
        in raised[0].message and "appliance backup list" in raised[0].message


def test_a_scheduled_backup_that_keeps_failing_is_tried_less_often_up_to_the_schedules_period() -> None:
    """Each try copies and decrypts the whole store: not every five minutes for a damaged one, for days."""
    daily = 24.0
    assert [backups.retry_wait_s(n, daily) / 60 for n in range(1, 10)] == [5, 10, 20, 40, 80, 160, 320, 640, 1280]
    assert backups.retry_wait_s(11, daily) == backups.retry_wait_s(10_000, daily) == daily * 3600
    assert backups.retry_wait_s(3, 0.0001) == backups.RETRY_S  # a schedule shorter than the first wait keeps it


def test_a_backup_from_before_a_key_rotation_names_the_key_it_needs(opened: Store, tmp_path: Path) -> None:
    old_key = tmp_path / "old.key"
    shutil.copy(opened.settings.key_file, old_key)
    old = opened.master.fingerprint
    made, _ = backups.create(opened)
    opened.close()
    rotated = run_cli("keys", "rotate", check=True).stdout
    assert "copy the new key off this box now" in rotated
    assert f"1 backup in {opened.settings.backup_dir} still needs the old key {old}" in rotated  # before it is gone
    new = run_cli("keys", "status", check=True).stdout

    verified = run_cli("backup", "verify", str(made.path))
    assert verified.returncode == 1
    assert f"needs the master key {old}" in verified.stderr and "the key given is" in verified.stderr
    assert "--key-file" in verified.stderr and "nothing was changed" in verified.stderr
    assert "Traceback" not in verified.stderr
    listing = run_cli("backup", "list", check=True).stdout
    assert f"key {old}  (needs another key)" in listing
    current = listing.split("the current master key is ")[1].split()[0]
    assert current != old and current in new

    restored = run_cli("backup", "restore", str(made.path), "--yes")
    assert restored.returncode == 1 and f"needs the master key {old}" in restored.stderr
    assert run_cli("audit", "verify").returncode == 0  # the live store is as it was

    with_old_key = run_cli("backup", "verify", str(made.path), "--key-file", str(old_key))
    assert with_old_key.returncode == 0, with_old_key.stdout + with_old_key.stderr

    # Restored with the key it needs, it is re-wrapped under the appliance's own: every command opens it after.
    current_key = opened.settings.key_file.read_bytes()
    back = run_cli("backup", "restore", str(made.path), "--key-file", str(old_key), "--yes")
    assert back.returncode == 0, back.stderr
    assert f"re-wrapped under this appliance's master key {current} (the backup was under {old})" in back.stdout
    assert opened.settings.key_file.read_bytes() == current_key
    assert json.loads(run_cli("keys", "status", "--json", check=True).stdout)["opens_store"] is True
    assert run_cli("audit", "verify").returncode == 0
    assert run_cli("doctor").returncode == 0
    with store.open(opened.settings) as reopened:
        record = json.loads(audit.rows(reopened, action="backup.restored")[-1]["details"])
    assert record["rewrapped"] == {"from": old, "to": current}


@pytest.mark.parametrize("daemon", [{"APPLIANCE_BACKUP_EVERY_HOURS": "0.0003", "APPLIANCE_BACKUP_KEEP": "2"}],
                         indirect=True)
def test_the_daemon_takes_scheduled_backups_and_a_restore_waits_for_it_to_stop(daemon: Daemon) -> None:
    settings = daemon.settings
    daemon.wait(lambda: _pruned(daemon), 60, "the daemon took no three scheduled backups")
    assert len(_names(settings)) == 2  # kept 2 of them

    refused = daemon.cli("backup", "restore", _names(settings)[0], "--yes")
    assert refused.returncode == 1
    assert "the appliance is running" in refused.stderr and "nothing was changed" in refused.stderr
    assert not (settings.state_dir / "restore.partial").exists()
    assert "backup.restored" not in daemon.cli("audit", "list").stdout

    daemon.stop()
    restored = daemon.cli("backup", "restore", _names(settings)[0], "--yes")
    assert restored.returncode == 0, restored.stderr
    assert daemon.cli("audit", "verify").returncode == 0


def _pruned(daemon: Daemon) -> bool:
    with sqlite3.connect(daemon.settings.db_path) as db:
        actions = [row[0] for row in db.execute("SELECT action FROM audit WHERE actor = 'service:backup'")]
    return actions.count("backup.created") >= 3 and "backup.pruned" in actions


def test_a_new_box_with_only_a_key_lists_the_backups_that_key_opens(opened: Store, tmp_path: Path) -> None:
    made, _ = backups.create(opened)
    opened.close()
    new_box = {"APPLIANCE_STATE_DIR": str(tmp_path / "new"), "APPLIANCE_BACKUP_DIR": str(made.path.parent),
               "APPLIANCE_KEYS_FILE": str(opened.settings.key_file)}
    listed = run_cli("backup", "list", env=new_box, check=True).stdout
    assert f"the current master key is {made.key_fingerprint}" in listed and "needs another key" not in listed
    assert not (tmp_path / "new" / "appliance.db").exists()  # listing made no store


def test_a_restore_on_a_new_box_given_the_old_boxs_checkpoint_explains_that_checkpoint_from_then_on(
    opened: Store, tmp_path: Path
) -> None:
    """The old box went on writing after its last backup; its newest checkpoint, kept off the box, vouches for
    records the restored log never holds. Given to the restore, that gap is on the record, not a tampering alert."""
    made, _ = backups.create(opened)
    audit.record(opened, "test.after", "on the old box, after the backup")
    head = audit.checkpoint(opened)
    old_box = tmp_path / "old-box.json"
    old_box.write_text(json.dumps(head.__dict__))
    opened.close()
    new_box = {"APPLIANCE_STATE_DIR": str(tmp_path / "new"), "APPLIANCE_BACKUP_DIR": str(tmp_path / "new-backups")}
    run_cli("keys", "init", env=new_box, check=True)
    run_cli("audit", "checkpoint", "-o", str(tmp_path / "new-box.json"), env=new_box, check=True)
    restore = ("backup", "restore", str(made.path), "--key-file", str(opened.settings.key_file), "--yes")

    mixed_up = run_cli(*restore, "--checkpoint", str(tmp_path / "new-box.json"), env=new_box)
    assert mixed_up.returncode == 1 and "is of another store" in mixed_up.stderr
    assert "nothing was changed" in mixed_up.stderr and "Traceback" not in mixed_up.stderr
    assert "backup.restored" not in run_cli("audit", "list", env=new_box, check=True).stdout

    restored = run_cli(*restore, "--checkpoint", str(old_box), env=new_box)
    assert restored.returncode == 0, restored.stderr
    assert f"(it stood at {head.seq} before)" in restored.stdout
    checked = run_cli("audit", "verify", "--checkpoint", str(old_box), env=new_box)
    assert checked.returncode == 0, checked.stderr
    assert f"vouches for record {head.seq} of a log that the backup.restored on record" in checked.stderr
    open_alerts = json.loads(run_cli("alerts", "--json", env=new_box, check=True).stdout)
    assert not [alert for alert in open_alerts if alert["source"] == "audit"]


def test_a_key_file_that_is_a_pipe_is_named_not_waited_on(opened: Store, tmp_path: Path) -> None:
    made, _ = backups.create(opened)
    opened.close()
    os.mkfifo(tmp_path / "key.pipe", 0o600)
    refused = run_cli("backup", "verify", str(made.path), "--key-file", str(tmp_path / "key.pipe"), timeout=60)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert f"the master key file {tmp_path / 'key.pipe'} is a named pipe (FIFO), not a regular file" in refused.stderr


def test_a_backup_that_is_no_regular_file_is_named_for_what_it_is(opened: Store) -> None:
    """'/dev/zero' was 'no backup file'; a pipe would have been read by SQLite without end."""
    opened.close()
    for command in (("verify", "/dev/zero"), ("restore", "/dev/zero", "--yes")):
        refused = run_cli("backup", *command)
        assert refused.returncode == 1 and "the backup /dev/zero is a character device, not a regular file" \
            in refused.stderr, refused.stderr
