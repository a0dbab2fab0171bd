"""The `appliance` command as an operator uses it: help, exit codes, backup and restore."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import pytest

from appliance import store
from appliance.cli import cli
from appliance.core import config
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
    # Options that say nothing together, once silently ignored (the last one, or one of two, won).
    for args, said in ((("train", "--data", "t", "--fallback"), "--fallback says what to do when a burst fails"),
                       (("usage", "--csv", "--json"), "give --csv or --json, not both"),
                       (("jobs", "submit", "train", "-p", 'dataset="a"', "-p", 'dataset="b"'),
                        "dataset given more than once")):
        refused = run_cli(*args)
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr


@pytest.mark.slow
def test_quickstart_serves_the_bundled_model_through_the_daemon_and_reuses_it_next_time(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        env = {"APPLIANCE_SERVE_PORT": str(probe.getsockname()[1])}
    try:
        first = run_cli("quickstart", env=env, check=True)
        assert "created the master key" in first.stdout and "started the daemon" in first.stdout
        assert "deployed sample-tickets:2" in first.stdout  # registered as :1, optimised as :2
        accuracy = float(first.stdout.split("validation accuracy ")[1].split()[0])
        assert accuracy > 0.8  # four classes: chance is 0.25
        label = first.stdout.split("live prediction for ")[1].split(": ")[1].split(" ")[0]
        assert label == "billing"  # "I was charged twice for my subscription this month"
        assert "curl -s" in first.stdout and "/v1/models/sample-tickets:predict" in first.stdout
        assert "Traceback" not in first.stderr and "LOAD REPORT" not in first.stderr
        for name in ("master.key", "quickstart.key", "cli.token", "daemon.log", "daemon.pid", "audit-head.json"):
            assert stat.S_IMODE((tmp_path / "var" / name).stat().st_mode) == 0o600

        second = run_cli("quickstart", env=env, check=True)
        assert "created the master key" not in second.stdout
        assert "using the running daemon" in second.stdout and "reusing job" in second.stdout
        assert "live prediction for" in second.stdout and "billing" in second.stdout
    finally:
        stopped = run_cli("stop", env=env)
    assert stopped.returncode == 0 and "the daemon stopped" in stopped.stdout


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


def test_a_config_file_that_is_a_pipe_a_device_or_huge_is_named_for_what_it_is(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.toml")
    huge = tmp_path / "huge.toml"
    huge.touch()
    os.truncate(huge, 3 * 2**30)  # sparse: nothing is written
    for given, wrong in ((tmp_path / "pipe.toml", "is a named pipe (FIFO), not a regular file"),
                         (Path("/dev/null"), "is a character device, not a regular file"),
                         (huge, "holds 3,221,225,472 bytes, over its limit of 1,048,576")):
        result = run_cli("--config", str(given), "data", "list", timeout=60)
        assert result.returncode == 1 and f"error: config file {given} {wrong}" in result.stderr


def test_commands_before_keys_init_say_what_to_do_and_leave_nothing_behind() -> None:
    result = run_cli("audit", "list")
    assert result.returncode == 1
    assert "no master key" in result.stderr and "appliance keys init" in result.stderr
    assert not config.load().db_path.exists()  # a mistyped APPLIANCE_STATE_DIR gets no stray store


def test_a_state_directory_that_is_a_file_is_named_with_what_to_check(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("not a folder")
    for where in ("state", "state/inner"):
        result = run_cli("keys", "init", env={"APPLIANCE_STATE_DIR": str(tmp_path / where)})
        assert result.returncode == 1 and "internal error" not in result.stderr, result.stderr
        assert f"error: cannot use {tmp_path / where}: " in result.stderr and "check APPLIANCE_STATE_DIR" in result.stderr


def test_a_store_whose_key_is_gone_is_told_to_get_that_key_back() -> None:
    run_cli("keys", "init", check=True)
    config.load().key_file.unlink()
    result = run_cli("audit", "list")
    assert result.returncode == 1 and "no master key" in result.stderr
    assert "this store's key was made before: put its key file back" in result.stderr
    assert "keys init" not in result.stderr  # which would refuse: the store has a key


def test_an_error_shows_what_the_user_typed_bounded_and_without_a_terminals_controls() -> None:
    run_cli("keys", "init", check=True)
    for typed in ("x\x1b]0;owned\x07y", "a" * 10_000):
        refused = run_cli("deploy", f"{typed}:1")
        assert refused.returncode == 1 and "\x1b" not in refused.stderr and "\x07" not in refused.stderr
        assert len(refused.stderr) < 2_000, refused.stderr[:200]


@pytest.mark.parametrize("option", [("stop", "--timeout"), ("train", "--data", "x", "--max-minutes"),
                                    ("deploy", "m:1", "--canary")])
def test_nan_and_inf_are_no_numbers_an_option_takes(option: tuple[str, ...]) -> None:
    for value in ("nan", "inf"):
        refused = run_cli(*option, value)
        assert refused.returncode == 2 and f"Invalid value for '{option[-1]}'" in refused.stderr, refused.stderr


def test_ctrl_c_while_a_command_loads_says_aborted_and_exits_130(tmp_path: Path) -> None:
    """The first second of a command is spent loading torch and OpenVINO: Ctrl-C then printed a traceback."""
    (tmp_path / "loading.py").write_text("raise KeyboardInterrupt  # as Ctrl-C does while the module loads\n")
    interrupted = subprocess.run([sys.executable, "-c", "from appliance import launch; launch.run('loading')"],
                                 env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True,
                                 timeout=60, check=False)
    assert (interrupted.returncode, interrupted.stderr) == (130, "aborted\n")
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"appliance": "appliance.launch:main", "appliance-tui": "tui:main"}
