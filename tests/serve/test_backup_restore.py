"""Backup, destroy, restore: the appliance serves the same model and its audit chain verifies."""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
from pathlib import Path
from typing import Any

import httpx

from tests.daemon import Daemon, environment, settings_of
from tests.serve.conftest import State

TEXTS = ["refund for the invoice charge please", "the courier lost my parcel delivery"]


def _copy(state: State, target: Path) -> None:
    """The session's served state, copied so this test may destroy it (SQLite's backup API: a consistent copy)."""
    target.mkdir(mode=0o700)
    with sqlite3.connect(state.settings.db_path) as source, sqlite3.connect(target / "appliance.db") as copy:
        source.backup(copy)
    for name in ("master.key", "audit-head.json"):
        shutil.copy2(state.settings.state_dir / name, target / name)


def _predict(daemon: Daemon, token: str) -> dict[str, Any] | None:
    try:
        answer = httpx.post(f"{daemon.settings.inference_url}/v1/models/tickets:predict",
                            json={"instances": TEXTS}, headers={"X-API-Key": token}, timeout=30)
    except httpx.TransportError:
        return None
    return answer.json() if answer.status_code == 200 else None


def test_backup_destroy_restore_serves_the_same_model_and_the_same_chain(
    state: State, tiny_base: Path, tmp_path: Path
) -> None:
    _copy(state, tmp_path / "var")
    env = environment(tmp_path / "var", tiny_base)
    daemon = Daemon(env, settings_of(env))
    daemon.start()
    try:
        before = daemon.wait(lambda: _predict(daemon, state.token), 60, "the model was not served")
        made = daemon.cli("backup", "now")  # online, while the daemon runs
        assert made.returncode == 0, made.stderr
        backup = Path(made.stdout.split("backup written to ")[1].split()[0])
        chain = daemon.cli("audit", "list", "--json")
        assert daemon.stop() == 0
    finally:
        if daemon.process is not None:
            daemon.stop(signal.SIGKILL)

    for suffix in ("", "-wal", "-shm"):  # the disaster
        daemon.settings.db_path.with_name(daemon.settings.db_path.name + suffix).unlink(missing_ok=True)
    restored = daemon.cli("backup", "restore", backup.name, "--yes")
    assert restored.returncode == 0, restored.stderr
    verified = daemon.cli("audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr

    daemon.start()
    try:
        after = daemon.wait(lambda: _predict(daemon, state.token), 60, "the restored model was not served")
    finally:
        daemon.stop()
    assert after["model_version"] == before["model_version"]
    assert [p["label"] for p in after["predictions"]] == [p["label"] for p in before["predictions"]]

    records = {row["seq"]: row for row in json.loads(daemon.cli("audit", "list", "--json").stdout)}
    rewind = next(row for row in records.values() if row["action"] == "backup.restored")
    assert rewind["details"]["backup"] == str(backup)
    upto = rewind["details"]["backup_head"]["seq"]
    assert rewind["seq"] == upto + 1 and rewind["details"]["abandoned_head"]["seq"] > upto  # the rewind, on record
    original = {row["seq"]: row["hash"] for row in json.loads(chain.stdout)}
    assert all(records[seq]["hash"] == original[seq] for seq in range(1, upto + 1))  # the same chain up to it
    assert daemon.cli("audit", "verify").returncode == 0
