"""The store's disk space: what takes it, free pages given back to the disk, growth and the doctor's warning."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import threading
from datetime import timedelta

import pytest
import torch

from appliance import store
from appliance.core import clock
from appliance.core.config import Settings
from appliance.daemon import doctor
from appliance.data import datasets
from appliance.store import Store, audit, blobs, lifecycle, space
from appliance.train import checkpoint, runs
from tests.conftest import run_cli, write_tickets

MiB = 2**20


def finished_run(opened: Store, tmp_path: os.PathLike[str], model_bytes: int) -> str:
    version = datasets.import_file(opened, write_tickets(tmp_path / "tickets.csv"), name="tickets")
    run_id = runs.create(opened, dataset_id=version.id, base_model="tiny-bert", task=version.task,
                         params={"epochs": 1}, plan={"device": "cpu"})
    runs.finish(opened, run_id, blobs.put(opened, os.urandom(model_bytes)), {"accuracy": 0.9})
    return run_id


def pages(opened: Store) -> int:
    return opened.db.execute("PRAGMA page_count").fetchone()[0]


def test_the_store_says_what_takes_its_space_and_gives_a_discarded_checkpoint_back_to_the_disk(
        opened: Store, tmp_path: os.PathLike[str]) -> None:
    run_id = finished_run(opened, tmp_path, 3 * MiB)
    checkpoint.save(opened, run_id, 10, {"weights": torch.rand(2 * MiB)})  # 8 MiB of float32
    used = space.usage(opened)
    assert used.reclaims and used.free_bytes == 0
    assert used.by_kind["models"] == 3 * MiB
    assert 8 * MiB <= used.by_kind["checkpoints"] < 9 * MiB
    assert 0 < used.by_kind["datasets"] < MiB and used.by_kind["audit log"] > 0
    assert sum(used.by_kind.values()) + used.free_bytes == used.file_bytes

    full = pages(opened)
    blob = opened.db.execute("SELECT blob_id FROM checkpoints WHERE run_id = ?", (run_id,)).fetchone()[0]
    assert runs.drop_checkpoint(opened, run_id) >= 8 * MiB
    [record] = audit.rows(opened, action="checkpoint.discard")
    assert json.loads(record["details"])["blob"] == blob  # the run's lineage keeps what it resumed from
    freed = space.usage(opened)
    assert freed.by_kind["checkpoints"] == 0 and freed.free_bytes >= 8 * MiB

    given = space.reclaim(opened)
    assert given >= 8 * MiB
    assert space.usage(opened).free_bytes == 0
    assert pages(opened) <= full - 8 * MiB // 65536


def test_store_info_shows_the_space_by_kind_and_where_free_pages_go(opened: Store,
                                                                    tmp_path: os.PathLike[str]) -> None:
    finished_run(opened, tmp_path, 2 * MiB)
    opened.close()
    shown = run_cli("store", "info", check=True).stdout
    for line in ("datasets", "models", "checkpoints", "prediction texts", "audit log", "other"):
        assert f"\n  {line} " in shown
    assert "not known yet: the daemon records the size once a day" in shown
    details = json.loads(run_cli("store", "info", "--json", check=True).stdout)
    assert details["space"]["by_kind"]["models"] == 2 * MiB and details["space"]["free_pages_go_back"] is True


def test_a_store_made_before_incremental_vacuum_is_compacted_once_and_then_gives_space_back(
        settings: Settings) -> None:
    settings.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    older = sqlite3.connect(settings.db_path)  # as the versions before made it: large pages, no auto-vacuum
    older.execute("PRAGMA page_size = 65536")
    older.execute("CREATE TABLE placeholder (x)")
    older.execute("DROP TABLE placeholder")
    older.close()
    os.chmod(settings.db_path, 0o600)
    with lifecycle.init(settings) as opened:
        blob = blobs.put(opened, os.urandom(6 * MiB))
        blobs.delete(opened, blob)
        assert space.reclaim(opened) == 0  # nothing to give back with: SQLite keeps no map of free pages
        assert not space.usage(opened).reclaims and space.usage(opened).free_bytes >= 6 * MiB
    assert "'appliance store compact' gives them back to the disk" in run_cli("store", "info", check=True).stdout
    before = settings.db_path.stat().st_size

    compacted = run_cli("store", "compact", check=True)
    assert "compacted:" in compacted.stdout
    assert settings.db_path.stat().st_size <= before - 5 * MiB  # the blob's pages, less what the WAL held
    with store.open(settings) as reopened:
        assert space.usage(reopened).reclaims and space.usage(reopened).free_bytes == 0
        details = json.loads(audit.rows(reopened, action="store.compact")[-1]["details"])
        assert details["bytes_before"] - details["bytes_after"] >= 5 * MiB
        assert audit.verify(reopened).ok
        blobs.delete(reopened, blobs.put(reopened, os.urandom(2 * MiB)))
        assert space.reclaim(reopened) >= 2 * MiB


def test_the_upkeep_thread_gives_free_pages_back_and_records_the_day_s_size(opened: Store, settings: Settings) -> None:
    blobs.delete(opened, blobs.put(opened, os.urandom(4 * MiB)))
    assert space.usage(opened).free_bytes >= 4 * MiB
    stop = threading.Event()
    upkeep = threading.Thread(target=space.keep_tidy, args=(settings, None, stop))
    upkeep.start()
    try:
        for _ in range(200):
            if opened.db.execute("SELECT COUNT(*) FROM store_sizes").fetchone()[0]:
                break
            stop.wait(0.05)
    finally:
        stop.set()
        upkeep.join(timeout=30)
    assert not upkeep.is_alive()
    assert space.usage(opened).free_bytes == 0
    [(day, used)] = opened.db.execute("SELECT day, used_bytes FROM store_sizes").fetchall()
    assert day == clock.now().date().isoformat() and 0 < used < 4 * MiB


def days_ago(days: int) -> str:
    return (clock.now() - timedelta(days=days)).date().isoformat()


@pytest.mark.parametrize("fills_in_days", [2, None])
def test_the_doctor_warns_when_the_store_s_growth_fills_the_disk_within_a_week(
        opened: Store, settings: Settings, fills_in_days: int | None) -> None:
    free = shutil.disk_usage(settings.state_dir).free
    per_day = free // fills_in_days if fills_in_days else 1 * MiB
    opened.db.conn.executemany("INSERT INTO store_sizes (day, used_bytes) VALUES (?, ?)",
                               [(days_ago(3), 10 * MiB), (days_ago(0), 10 * MiB + 3 * per_day)])
    opened.close()
    [disk] = [check for check in doctor.run(settings) if check.name == "disk space"]
    assert "the store grows by" in disk.detail and "over the last 3 days" in disk.detail
    if fills_in_days:
        assert disk.status is doctor.Status.WARN and "full in about 2 days" in disk.detail
        assert "appliance store info" in (disk.hint or "")
    else:
        assert disk.status in (doctor.Status.OK, doctor.Status.WARN)  # the disk itself may be small here
        assert "full in about" in disk.detail and int(disk.detail.rsplit("full in about ", 1)[1].split()[0]) > 7
