"""`appliance doctor` on real stores and real sockets: what it finds, the fixes it names, that it writes nothing."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sqlite3
import time
from pathlib import Path

import pytest

from appliance import registry, store
from appliance.core import config
from appliance.daemon import doctor
from appliance.data import datasets
from appliance.store import audit, backups, blobs, keys, lifecycle
from tests.conftest import model_trained_on, run_cli, write_tickets


def _by_name(checks: list[doctor.Check]) -> dict[str, doctor.Check]:
    return {check.name: check for check in checks}


def _tamper(settings: config.Settings, *statements: str) -> None:
    """Change the store behind the appliance's back, as a damaged disk or an intruder would."""
    conn = sqlite3.connect(settings.db_path)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()


@pytest.fixture
def initialised(settings: config.Settings) -> config.Settings:
    """A closed store with a key file and a few audit records."""
    with lifecycle.init(settings) as opened:
        audit.record(opened, "test.step", "one")
    return settings


def test_a_sound_appliance_passes_every_check(initialised: config.Settings) -> None:
    result = run_cli("doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines if line and not line.startswith(("all", " "))] == ["ok"] * 9
    assert "all 9 checks passed" in result.stdout
    found = _by_name(doctor.run(initialised))
    assert "opens store" in found["master key"].detail and "mode 0600" in found["master key"].detail
    assert found["audit log"].detail.startswith("2 records")
    assert "integrity ok" in found["store"].detail


def test_a_key_file_others_can_read_fails_with_the_fix(initialised: config.Settings) -> None:
    initialised.key_file.chmod(0o644)
    result = run_cli("doctor")
    assert result.returncode == 1
    failing = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert failing == [f"FAIL  master key      key file {initialised.key_file} is readable by group or others (mode 0644)"]
    assert f"fix: run 'chmod 600 {initialised.key_file}'" in result.stdout
    assert "skip  audit log" in result.stdout and "1 of 9 checks failed" in result.stdout
    assert "Traceback" not in result.stderr


def test_the_doctor_writes_nothing_beside_the_store(initialised: config.Settings) -> None:
    """Root may run it on the service's store: no -wal or -shm files of root's, no audit record, no migration."""
    def snapshot() -> dict[str, tuple[int, int]]:
        return {path.name: (path.stat().st_size, path.stat().st_mtime_ns) for path in initialised.state_dir.iterdir()}

    before = snapshot()
    assert not doctor.failed(doctor.run(initialised))
    assert snapshot() == before


def test_a_changed_audit_record_fails_the_audit_check(initialised: config.Settings) -> None:
    _tamper(initialised, "DROP TRIGGER audit_no_update", "UPDATE audit SET object = 'two' WHERE seq = 2")
    found = _by_name(doctor.run(initialised))
    assert found["audit log"].status is doctor.Status.FAIL and "record 2 was changed" in found["audit log"].detail
    assert "appliance audit verify" in (found["audit log"].hint or "")
    assert found["store"].status is doctor.Status.OK  # SQLite itself is fine: the tampering is the audit chain's


def test_another_key_fails_as_not_matching(initialised: config.Settings) -> None:
    os.unlink(initialised.key_file)
    keys.write_key_file(initialised.key_file, keys.generate())
    found = _by_name(doctor.run(initialised))
    assert found["master key"].status is doctor.Status.FAIL and "does not match" in found["master key"].detail
    assert found["audit log"].status is doctor.Status.SKIP


def test_a_store_from_a_newer_release_fails_with_a_way_back(initialised: config.Settings) -> None:
    _tamper(initialised, "INSERT INTO schema_version (version, applied_at) VALUES (99, 'later')")
    found = _by_name(doctor.run(initialised))
    assert found["store"].status is doctor.Status.FAIL and "schema version 99" in found["store"].detail
    assert "install that release again" in (found["store"].hint or "")


def test_before_the_first_start_no_store_is_only_a_warning(settings: config.Settings) -> None:
    keys.write_key_file(settings.key_file, keys.generate())
    checks = doctor.run(settings)
    found = _by_name(checks)
    assert found["store"].status is doctor.Status.WARN and found["audit log"].status is doctor.Status.SKIP
    assert not doctor.failed(checks)
    assert not settings.db_path.exists()


def test_no_key_at_all_fails_and_says_how_to_make_one(settings: config.Settings) -> None:
    found = _by_name(doctor.run(settings))
    assert found["master key"].status is doctor.Status.FAIL
    assert "appliance keys init" in (found["master key"].hint or "")


def test_a_port_another_program_holds_fails(initialised: config.Settings) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = dataclasses.replace(initialised, serve=dataclasses.replace(initialised.serve,
                                                                           port=other.getsockname()[1]))
        found = _by_name(doctor.run(taken))
    check = found["inference port"]
    assert check.status is doctor.Status.FAIL and "in use by another program" in check.detail
    assert "serve.port" in (check.hint or "")


def test_a_privileged_port_fails_because_the_service_has_no_capabilities(initialised: config.Settings) -> None:
    low = dataclasses.replace(initialised, serve=dataclasses.replace(initialised.serve, port=80))
    check = _by_name(doctor.run(low))["inference port"]
    assert check.status is doctor.Status.FAIL and "1024" in (check.hint or "")


def _scheduled(settings: config.Settings, every_hours: float) -> config.Settings:
    return dataclasses.replace(settings, backup=dataclasses.replace(settings.backup, every_hours=every_hours))


def test_backups_that_fall_behind_their_schedule_are_a_warning_with_the_way_on(initialised: config.Settings) -> None:
    hourly = _scheduled(initialised, 1)
    assert _by_name(doctor.run(hourly))["backups"].status is doctor.Status.OK  # a new store has none yet
    every_instant = _scheduled(initialised, 0.0001)  # two of its periods (0.72 s) pass before the check
    time.sleep(1)
    behind = _by_name(doctor.run(every_instant))["backups"]
    assert behind.status is doctor.Status.WARN and "no backup in" in behind.detail
    assert "every 0.0001 hours: is it running?" in (behind.hint or "")
    with store.open(initialised) as opened:
        backups.create(opened)
    assert _by_name(doctor.run(hourly))["backups"].status is doctor.Status.OK
    time.sleep(1)
    stale = _by_name(doctor.run(every_instant))["backups"]
    assert stale.status is doctor.Status.WARN and stale.detail.startswith("the newest of 1 in")
    unscheduled = _by_name(doctor.run(_scheduled(every_instant, 0)))["backups"]
    assert unscheduled.status is doctor.Status.OK  # a week may pass between backups taken by hand


def test_a_backup_directory_that_cannot_hold_backups_is_named(initialised: config.Settings, tmp_path: Path) -> None:
    initialised.backup_dir.parent.mkdir(parents=True, exist_ok=True)
    initialised.backup_dir.write_text("not a folder")
    check = _by_name(doctor.run(initialised))["backups"]
    assert check.status is doctor.Status.WARN
    assert check.detail == f"the backup directory {initialised.backup_dir} is a file, not a folder"
    listed = run_cli("backup", "list")
    assert listed.returncode == 1 and "is a file, not a folder" in listed.stderr and "no backups yet" not in listed.stdout


def test_a_newest_backup_that_cannot_be_read_is_named(initialised: config.Settings) -> None:
    with store.open(initialised) as opened:
        taken, _ = backups.create(opened)
    taken.path.write_bytes(b"\0" * 4096)
    check = _by_name(doctor.run(initialised))["backups"]
    assert check.status is doctor.Status.WARN and taken.path.name in check.detail and "cannot be read" in check.detail
    assert f"appliance backup verify {taken.path}" in (check.hint or "")


def test_json_output_for_other_tools(initialised: config.Settings) -> None:
    result = run_cli("doctor", "--json")
    assert result.returncode == 0
    parsed = json.loads(result.stdout)
    assert [item["name"] for item in parsed] == ["hardware", "training plan", "master key", "store", "audit log",
                                                 "served models", "backups", "inference port",
                                                 "disk space"]
    assert {item["status"] for item in parsed} == {"ok"}


def test_a_served_model_that_no_longer_decrypts_fails_the_deep_check(initialised: config.Settings,
                                                                     tmp_path: Path) -> None:
    with store.open(initialised) as opened:
        version = datasets.import_file(opened, write_tickets(tmp_path / "tickets.csv"), name="tickets")
        trained = model_trained_on(opened, version, "tickets")
        ir = os.urandom(3 * 2**20)  # three chunks standing in for an OpenVINO IR
        variant = registry.Variant("int8", "openvino-ir", blobs.put(opened, ir), len(ir), {})
        served = registry.register(opened, "tickets", run_id=trained.run_id, task=trained.task, variants=[variant],
                                   chosen="int8", reason="test")
        registry.deploy(opened, served.ref)
    assert _by_name(doctor.run(initialised))["served models"].status is doctor.Status.OK
    _tamper(initialised, "UPDATE blob_chunks SET data = randomblob(length(data)) WHERE idx = 1 AND storage_id ="
                         f" (SELECT storage_id FROM blobs WHERE id = '{variant.blob_id}')")
    result = run_cli("doctor")
    assert result.returncode == 1
    assert "FAIL  served models" in result.stdout and "tickets:2: blob" in result.stdout
    assert "chunk 1 of 3 was changed" in result.stdout and "rollback" in result.stdout
