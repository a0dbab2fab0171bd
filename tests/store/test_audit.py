"""The audit log: any edit, deletion, insertion, reordering or cut tail is named."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from appliance import store
from appliance.core.config import Settings
from appliance.core.errors import AuditWriteFailed
from appliance.store import Store, alerts, audit, blobs
from tests.conftest import run_cli

FIELDS = audit.FIELDS


def _tamper(settings: Settings, *statements: tuple[str, tuple]) -> None:
    """Change the database file the way an attacker with file access would."""
    conn = sqlite3.connect(settings.db_path)
    conn.execute("DROP TRIGGER IF EXISTS audit_no_update")
    conn.execute("DROP TRIGGER IF EXISTS audit_no_delete")
    for sql, params in statements:
        conn.execute(sql, params)
    conn.commit()
    conn.close()


def _verify(settings: Settings, checkpoint: Path | None = None) -> audit.Verification:
    with store.open(settings) as reopened:
        return audit.verify(reopened, checkpoint)


def _row(settings: Settings, seq: int) -> dict:
    conn = sqlite3.connect(settings.db_path)
    row = conn.execute(f"SELECT {', '.join(FIELDS)} FROM audit WHERE seq = ?", (seq,)).fetchone()
    conn.close()
    return dict(zip(FIELDS, row))


def test_an_untouched_log_verifies(logged: Settings) -> None:
    result = _verify(logged)
    assert result.ok and result.records == 10


@pytest.mark.parametrize("field", ["ts", "actor", "action", "object", "outcome", "details", "prev_hash", "hash", "mac"])
def test_editing_any_field_of_any_record_is_detected(logged: Settings, field: str) -> None:
    for seq in (1, 5, 10):
        original = _row(logged, seq)[field]
        forged = "f" * 64 if field in ("prev_hash", "hash", "mac") else original + "x"
        _tamper(logged, (f"UPDATE audit SET {field} = ? WHERE seq = ?", (forged, seq)))
        result = _verify(logged)
        assert not result.ok and result.first_bad == seq, result
        _tamper(logged, (f"UPDATE audit SET {field} = ? WHERE seq = ?", (original, seq)))
    assert _verify(logged).ok


def test_a_check_that_fails_raises_an_alert_until_someone_acknowledges_it(logged: Settings) -> None:
    with store.open(logged) as reopened:
        assert alerts.check_audit(reopened, actor="user:ops").ok and alerts.open_count(reopened) == 0
    _tamper(logged, ("UPDATE audit SET object = 'forged' WHERE seq = 2", ()))
    with store.open(logged) as reopened:
        assert not alerts.check_audit(reopened, actor="user:ops").ok
        (alert,) = alerts.listed(reopened)
        checks = [row["outcome"] for row in audit.rows(reopened, action="audit.verify")]
    assert (alert.source, alert.severity) == ("audit", "error") and "record 2 was changed" in alert.message
    assert checks == ["ok", "failed"]  # as `audit list` shows them: a check that found tampering did not pass


def test_changing_a_byte_of_an_audit_row_is_detected(logged: Settings) -> None:
    details = _row(logged, 4)["details"]
    _tamper(logged, ("UPDATE audit SET details = ? WHERE seq = 4", (details.replace('"n":2', '"n":3'),)))
    result = _verify(logged)
    assert result.first_bad == 4
    assert "record 4 was changed" in result.problem


def test_a_deleted_record_is_named(logged: Settings) -> None:
    _tamper(logged, ("DELETE FROM audit WHERE seq = 6", ()))
    result = _verify(logged)
    assert result.first_bad == 6
    assert "record 6 is missing" in result.problem


def test_an_inserted_record_is_detected(logged: Settings) -> None:
    # Make room by shifting the tail up, then put a plausible record in the gap.
    conn = sqlite3.connect(logged.db_path)
    rows = [dict(zip(FIELDS, r)) for r in conn.execute(f"SELECT {', '.join(FIELDS)} FROM audit ORDER BY seq")]
    conn.close()
    statements = [("DELETE FROM audit WHERE seq > 5", ())]
    fake = {**rows[5], "seq": 6, "object": "inserted", "prev_hash": rows[4]["hash"]}
    for row in [fake] + [{**r, "seq": r["seq"] + 1} for r in rows[5:]]:
        statements.append((f"INSERT INTO audit ({', '.join(FIELDS)}) VALUES ({', '.join('?' * len(FIELDS))})", tuple(row[f] for f in FIELDS)))
    _tamper(logged, *statements)
    result = _verify(logged)
    assert not result.ok and result.first_bad == 6


def test_an_appended_forgery_is_detected(logged: Settings) -> None:
    last = _row(logged, 10)
    forged = {**last, "seq": 11, "prev_hash": last["hash"], "action": "keys.rotate"}
    forged["hash"] = audit._hash(forged)  # the attacker can hash, but has no MAC key
    _tamper(logged, (f"INSERT INTO audit ({', '.join(FIELDS)}) VALUES ({', '.join('?' * len(FIELDS))})", tuple(forged[f] for f in FIELDS)))
    result = _verify(logged)
    assert result.first_bad == 11
    assert "forged" in result.problem


def test_reordered_records_are_detected(logged: Settings) -> None:
    third, fourth = _row(logged, 3), _row(logged, 4)
    swap = [f for f in FIELDS if f != "seq"]
    _tamper(
        logged,
        (f"UPDATE audit SET {', '.join(f + ' = ?' for f in swap)} WHERE seq = 3", tuple(fourth[f] for f in swap)),
        (f"UPDATE audit SET {', '.join(f + ' = ?' for f in swap)} WHERE seq = 4", tuple(third[f] for f in swap)),
    )
    result = _verify(logged)
    assert result.first_bad == 3


def test_a_truncated_tail_is_detected_by_the_head_file(logged: Settings) -> None:
    _tamper(logged, ("DELETE FROM audit WHERE seq > 7", ()))
    result = _verify(logged)
    assert not result.ok and result.first_bad == 8
    assert "truncated" in result.problem and "ends at 7" in result.problem


def test_a_forged_head_file_is_detected(logged: Settings) -> None:
    head = json.loads(logged.audit_head_path.read_text())
    head["seq"] = 3
    logged.audit_head_path.write_text(json.dumps(head))
    result = _verify(logged)
    assert not result.ok and "not signed by this store" in result.problem


def test_a_missing_head_file_fails_verification(logged: Settings) -> None:
    logged.audit_head_path.unlink()
    result = _verify(logged)
    assert not result.ok and "missing" in result.problem


def test_a_checkpoint_catches_truncation_even_with_an_old_head_file_replayed(logged: Settings, tmp_path: Path) -> None:
    old_head = logged.audit_head_path.read_text()  # an attacker kept a copy of an older head
    with store.open(logged) as reopened:
        head = audit.checkpoint(reopened)
        audit.record(reopened, "test.after", "x")
    checkpoint = tmp_path / "checkpoint.json"
    checkpoint.write_text(json.dumps(head.__dict__))

    _tamper(logged, ("DELETE FROM audit WHERE seq > 10", ()))
    logged.audit_head_path.write_text(old_head)
    assert _verify(logged).ok  # the replayed head alone is fooled...
    result = _verify(logged, checkpoint)  # ...the checkpoint kept elsewhere is not
    assert not result.ok and result.first_bad == 11 and "checkpoint" in result.problem


def test_an_operation_whose_record_cannot_be_written_does_not_happen(opened: Store) -> None:
    opened.db.execute("CREATE TRIGGER fail_audit BEFORE INSERT ON audit BEGIN SELECT RAISE(ABORT, 'disk full'); END")
    with pytest.raises(AuditWriteFailed, match="nothing was changed"), audit.operation(opened, "dataset.import",
                                                                                      "customers.csv"):
        blob_id = blobs.put(opened, b"customer rows")
    assert not blobs.exists(opened, blob_id)


def test_a_failed_operation_is_rolled_back_and_recorded_as_failed(opened: Store) -> None:
    with pytest.raises(ValueError), audit.operation(opened, "dataset.import", "bad.csv"):
        blob_id = blobs.put(opened, b"half an import")
        raise ValueError("line 3: missing label")
    assert not blobs.exists(opened, blob_id)
    last = audit.rows(opened, limit=1)[0]
    assert (last["action"], last["outcome"]) == ("dataset.import", "failed")
    assert json.loads(last["details"])["error"] == "line 3: missing label"
    assert audit.verify(opened).ok


def test_list_filters_by_actor_action_and_time(opened: Store) -> None:
    audit.record(opened, "model.deploy", "m1", actor="user:alice")
    audit.record(opened, "model.rollback", "m1", actor="user:bob")
    assert [r["actor"] for r in audit.rows(opened, action="model.*")] == ["user:alice", "user:bob"]
    assert [r["action"] for r in audit.rows(opened, actor="user:bob")] == ["model.rollback"]
    from datetime import UTC, datetime, timedelta

    assert audit.rows(opened, since=datetime.now(UTC) + timedelta(minutes=1)) == []


def test_cli_verify_names_the_first_bad_record_and_exits_1(logged: Settings) -> None:
    _tamper(logged, ("UPDATE audit SET actor = 'user:mallory' WHERE seq = 7", ()))
    result = run_cli("audit", "verify")
    assert result.returncode == 1
    assert "record 7 was changed" in result.stderr
    assert "first bad record: 7" in result.stderr


def test_cli_export_writes_every_record_as_a_json_line(logged: Settings, tmp_path: Path) -> None:
    out = tmp_path / "audit.jsonl"
    run_cli("audit", "export", "--format", "jsonl", "-o", str(out), check=True)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["seq"] for line in lines] == list(range(1, 11))
    assert lines[3]["details"] == {"n": 2}
    listed = json.loads(run_cli("audit", "list", "--json", "--action", "audit.export", check=True).stdout)
    assert listed[-1]["object"] == str(out)


def test_cli_verify_says_a_file_is_no_checkpoint_rather_than_crying_tamper(logged: Settings, tmp_path: Path) -> None:
    (tmp_path / "empty.csv").write_text("")
    result = run_cli("audit", "verify", "--checkpoint", str(tmp_path / "empty.csv"))
    assert result.returncode == 2
    assert "is not a signed audit checkpoint" in result.stderr and "TAMPERED" not in result.stderr
    with store.open(logged) as reopened:
        assert alerts.open_count(reopened) == 0 and audit.verify(reopened).ok


@pytest.mark.parametrize("command", ["export", "checkpoint"])
def test_cli_export_into_a_missing_folder_names_it_and_writes_nothing(logged: Settings, tmp_path: Path,
                                                                      command: str) -> None:
    target = tmp_path / "missing" / "audit.out"
    result = run_cli("audit", command, "-o", str(target))
    assert result.returncode == 1 and "internal error" not in result.stderr
    assert f"cannot create {target}: No such file or directory; name a new file in a folder that exists" in result.stderr
    assert not target.parent.exists()
    with store.open(logged) as reopened:
        assert audit.rows(reopened, action=f"audit.{command}") == []  # nothing on record that did not happen


@pytest.mark.parametrize(("since", "says"), [("99999999999d", "reaches back before the year 1"),
                                             ("soon", "is neither a date (2026-11-01) nor an age")])
def test_a_moment_that_cannot_be_is_named_as_such(since: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"{since!r} {says}")):
        audit.parse_since(since)
