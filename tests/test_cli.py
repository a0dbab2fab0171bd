"""The `appliance` command as an operator uses it: help, exit codes, backup and restore."""

from __future__ import annotations

import dataclasses
import json
import shutil
import stat
from pathlib import Path

import click
import pytest

from appliance import config, store
from appliance.cli import cli
from appliance.store import blobs, lifecycle, migrations
from tests.conftest import run_cli


def _all_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [prefix]
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += _all_commands(command, (*prefix, name))
        else:
            found.append((*prefix, name))
    return found


@pytest.mark.parametrize("command", _all_commands(cli), ids=lambda c: " ".join(c) or "appliance")
def test_every_command_has_help(command: tuple[str, ...]) -> None:
    result = run_cli(*command, "--help")
    assert result.returncode == 0
    assert "Usage: appliance" in result.stdout


def test_version() -> None:
    assert run_cli("version", check=True).stdout.startswith("appliance 0.1.0")


def test_usage_errors_exit_2() -> None:
    assert run_cli("no-such-command").returncode == 2
    assert run_cli("audit", "list", "--limit", "0").returncode == 2


@pytest.mark.slow
def test_quickstart_fine_tunes_and_optimises_the_bundled_model_and_reuses_it_next_time(tmp_path: Path) -> None:
    first = run_cli("quickstart", check=True)
    assert "created the master key" in first.stdout
    assert "dataset sample-tickets:1: 300 examples" in first.stdout
    accuracy = float(first.stdout.split("validation accuracy ")[1].split(",")[0])
    assert accuracy > 0.8  # four classes: chance is 0.25
    assert "sample-tickets:2  (candidate, production)" in first.stdout  # registered, optimised, deployed
    served = first.stdout.split("chosen: ")[1].split(" ")[0]
    assert served in ("fp32", "int8", "int8-gentle") and "int8 " in first.stdout
    assert "audit log OK" in first.stdout
    assert "Traceback" not in first.stderr and "LOAD REPORT" not in first.stderr
    assert stat.S_IMODE((tmp_path / "var" / "master.key").stat().st_mode) == 0o600

    second = run_cli("quickstart", check=True)
    assert "created the master key" not in second.stdout
    assert "reusing the finished run" in second.stdout
    assert "reusing the optimised version sample-tickets:2" in second.stdout


def test_store_info_reports_counts_and_integrity() -> None:
    run_cli("keys", "init", check=True)
    info = json.loads(run_cli("store", "info", "--json", check=True).stdout)
    assert info["integrity_check"] == "ok"
    assert info["schema_version"] == migrations.LATEST
    assert info["audit_records"] == 1


def test_a_backup_restores_and_opens_with_the_same_key(tmp_path: Path) -> None:
    settings = config.load()
    with lifecycle.init(settings) as opened:
        blob_id = blobs.put(opened, b"model weights" * 1000)
    backup = tmp_path / "backup.db"
    result = run_cli("store", "backup", str(backup), check=True)
    assert "backup written" in result.stdout
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600

    restored_dir = tmp_path / "restored"
    restored_dir.mkdir(mode=0o700)
    shutil.copy(backup, restored_dir / "appliance.db")
    restored = dataclasses.replace(settings, state_dir=restored_dir)
    with store.open(restored) as reopened:
        assert blobs.read(reopened, blob_id) == b"model weights" * 1000
        assert reopened.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    again = run_cli("store", "backup", str(backup))
    assert again.returncode == 1 and "already exists" in again.stderr
    assert "store.backup" in run_cli("audit", "list", check=True).stdout


def test_a_backup_into_a_missing_directory_is_refused_cleanly(tmp_path: Path) -> None:
    run_cli("keys", "init", check=True)
    result = run_cli("store", "backup", str(tmp_path / "no" / "such" / "b.db"))
    assert result.returncode == 1
    assert "does not exist" in result.stderr and "Traceback" not in result.stderr


def test_commands_before_keys_init_say_what_to_do() -> None:
    result = run_cli("audit", "list")
    assert result.returncode == 1
    assert "no master key" in result.stderr and "appliance keys init" in result.stderr
