"""A rewound audit log (its tail cut, or an older database put back) stops every write until accepted in the open."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from appliance import store
from appliance.access import auth
from appliance.core.config import Settings
from appliance.core.errors import AuditDiverged
from appliance.store import Store, audit, blobs
from tests.conftest import run_cli


def _cut_tail(settings: Settings, after: int) -> None:
    conn = sqlite3.connect(settings.db_path)
    conn.execute("DROP TRIGGER IF EXISTS audit_no_delete")  # an insider with the file can, of course
    conn.execute("DELETE FROM audit WHERE seq > ?", (after,))
    conn.commit()
    conn.close()


def _records(settings: Settings) -> int:
    conn = sqlite3.connect(settings.db_path)
    try:
        return conn.execute("SELECT COUNT(*) FROM audit").fetchone()[0]
    finally:
        conn.close()


def test_after_a_cut_tail_no_operation_writes_and_verify_keeps_failing(logged: Settings) -> None:
    _cut_tail(logged, 7)
    with store.open(logged) as reopened:
        for n in range(20):  # many ordinary operations: none may reuse the lost numbers and heal the chain
            with pytest.raises(AuditDiverged, match="rewound: its head file vouches for record 10, the log ends at 7"):
                audit.record(reopened, "test.after", f"x-{n}")
        with pytest.raises(AuditDiverged), audit.operation(reopened, "dataset.import", "y"):
            blob_id = blobs.put(reopened, b"data that must not be stored")
        assert not blobs.exists(reopened, blob_id)
        with pytest.raises(AuditDiverged):
            auth.create(reopened, "mallory")
        assert not auth.list_keys(reopened), "a key was created past a rewound log"
        result = audit.check(reopened)
    assert not result.ok and result.first_bad == 8
    assert _records(logged) == 7


def test_a_whole_database_put_back_is_refused_and_a_revoked_key_stays_revoked(
    opened: Store, settings: Settings, tmp_path: Path
) -> None:
    key, _token = auth.create(opened, "shop")
    opened.close()
    snapshot = tmp_path / "snapshot.db"
    shutil.copy(settings.db_path, snapshot)  # closed: the WAL is folded in
    with store.open(settings) as reopened:
        auth.revoke(reopened, key.id)
        audit.record(reopened, "test.later", "z")
    shutil.copy(snapshot, settings.db_path)  # an insider puts the older copy back: the key is live in it again
    with store.open(settings) as rolled_back:
        with pytest.raises(AuditDiverged, match="rewritten|rewound"):
            audit.record(rolled_back, "test.after", "x")
        assert not audit.verify(rolled_back).ok
    daemon = run_cli("daemon")
    assert daemon.returncode == 1 and "refusing to start" in daemon.stderr and "Traceback" not in daemon.stderr
    assert "accept-rewind" in daemon.stderr
    refused = run_cli("api-keys", "create", "again")
    assert refused.returncode == 1 and "nothing was written" in refused.stderr


def test_an_accepted_rewind_is_on_the_record_and_old_checkpoints_are_explained(logged: Settings, tmp_path: Path) -> None:
    with store.open(logged) as reopened:
        head = audit.checkpoint(reopened)  # record 11, kept somewhere safe
    checkpoint = tmp_path / "checkpoint.json"
    checkpoint.write_text(json.dumps(head.__dict__))
    _cut_tail(logged, 6)

    verify = run_cli("audit", "verify")
    assert verify.returncode == 1 and "truncated" in verify.stderr
    accepted = run_cli("audit", "accept-rewind", "--reason", "restored the VM from last night's snapshot", "--yes")
    assert accepted.returncode == 0, accepted.stderr
    assert "records after 6 up to 11 are gone for good" in accepted.stdout

    with store.open(logged) as reopened:
        assert audit.verify(reopened).ok
        assert audit.verify(reopened, checkpoint).ok  # it vouches for a record the accepted rewind gave up
        record = audit.rows(reopened, action="audit.rewind_accepted")[0]
        details = json.loads(record["details"])
        assert record["seq"] == 7 and details["abandoned_head"]["seq"] == 11 and details["log_tail"]["seq"] == 6
        assert details["reason"] == "restored the VM from last night's snapshot"
        audit.record(reopened, "test.after", "writes again")
        assert audit.verify(reopened).ok
    assert run_cli("audit", "accept-rewind", "--reason", "again", "--yes").stdout.startswith(
        "the audit log agrees with its head file")
    held = run_cli("audit", "verify", "--checkpoint", str(checkpoint))
    assert held.returncode == 0 and "audit log OK" in held.stdout
    assert "vouches for record 11 of a log that the audit.rewind_accepted on record 7 (" in held.stderr


def test_a_checkpoint_a_rewind_passes_over_names_that_rewind_so_a_forged_one_shows(logged: Settings,
                                                                                  tmp_path: Path) -> None:
    """Whoever holds the store's secret can write a rewind record as the appliance does: the checkpoint kept off
    the box is the one thing they cannot rewrite, and what it no longer vouches for is said, never passed over."""
    with store.open(logged) as reopened:
        head = audit.checkpoint(reopened)
    checkpoint = tmp_path / "checkpoint.json"
    checkpoint.write_text(json.dumps(head.__dict__))
    _cut_tail(logged, 3)
    with store.open(logged) as insider:  # a rewind nobody made on purpose, covering every record there will be
        audit.record_rewind(insider, "audit.rewind_accepted", insider.store_id, actor="admin", reason="routine",
                            problem="none", log_tail=None, abandoned_head={"seq": 10**9, "hash": "0" * 64})
    checked = run_cli("audit", "verify", "--checkpoint", str(checkpoint))
    assert f"vouches for record {head.seq} of a log that the audit.rewind_accepted on record 4" in checked.stderr
    assert "by admin" in checked.stderr and "check that this rewind was made on purpose" in checked.stderr
    with store.open(logged) as reopened:
        assert "audit.rewind_accepted on record 4" in audit.rows(reopened, action="audit.verify")[-1]["details"]


def test_a_missing_head_file_stops_writes_to_a_log_that_has_records(logged: Settings) -> None:
    logged.audit_head_path.unlink()
    with store.open(logged) as reopened, pytest.raises(AuditDiverged, match="missing"):
        audit.record(reopened, "test.after", "x")


def test_a_head_file_that_lags_after_a_crash_is_not_a_rewind(opened: Store, settings: Settings) -> None:
    """The head is written just after each commit: a crash between the two leaves it one record behind."""
    lagging = settings.audit_head_path.read_text()
    audit.record(opened, "test.step", "committed, head not yet moved")
    settings.audit_head_path.write_text(lagging)
    audit.record(opened, "test.after", "fine")
    assert audit.verify(opened).ok


def test_exports_and_checkpoints_are_private_files(logged: Settings, tmp_path: Path) -> None:
    run_cli("audit", "export", "-o", str(tmp_path / "audit.jsonl"), check=True)
    run_cli("audit", "checkpoint", "-o", str(tmp_path / "head.json"), check=True)
    for path in (tmp_path / "audit.jsonl", tmp_path / "head.json", logged.audit_head_path):
        assert path.stat().st_mode & 0o777 == 0o600, path


def test_a_checkpoint_that_is_a_pipe_or_outsized_is_refused_at_once(tmp_path: Path) -> None:
    """Given as --checkpoint, a pipe would hang verify and a huge file fill the memory: refused as a wrong file
    (exit 2, as one that is no checkpoint), before any store is opened."""
    os.mkfifo(tmp_path / "pipe.json")
    huge = tmp_path / "huge.json"
    huge.touch()
    os.truncate(huge, 3 * 2**30)  # sparse: nothing is written
    piped = run_cli("audit", "verify", "--checkpoint", str(tmp_path / "pipe.json"), timeout=60)
    assert piped.returncode == 2 and "pipe.json is a named pipe (FIFO), not a regular file" in piped.stderr
    outsized = run_cli("audit", "verify", "--checkpoint", str(huge), timeout=60)
    assert outsized.returncode == 2 and "huge.json holds 3,221,225,472 bytes, over its limit of 65,536" in outsized.stderr


def test_a_head_file_replaced_by_a_pipe_or_a_huge_file_reads_as_forged_at_once(logged: Settings) -> None:
    """Whoever can write the state directory must not be able to hang or exhaust verify through the head file."""
    logged.audit_head_path.unlink()
    os.mkfifo(logged.audit_head_path)
    piped = run_cli("audit", "verify", timeout=60)
    assert piped.returncode == 1 and "is not signed by this store" in piped.stderr
    logged.audit_head_path.unlink()
    logged.audit_head_path.touch()
    os.truncate(logged.audit_head_path, 3 * 2**30)  # sparse: nothing is written
    outsized = run_cli("audit", "verify", timeout=60)
    assert outsized.returncode == 1 and "is not signed by this store" in outsized.stderr
