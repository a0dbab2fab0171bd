"""`appliance daemon` and `appliance stop`: the long-running service, in the foreground or stopped."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import click

from appliance.cli.base import FiniteRange, cli, load_settings, log_as_service, log_format_option
from appliance.core.config import Settings
from appliance.core.errors import DaemonError
from appliance.daemon import client


@cli.command("daemon")
@log_format_option
def daemon(log_format: str) -> None:
    """Run the service: control API, inference server and job worker, until SIGTERM."""
    from appliance.daemon import service

    log_as_service(log_format)
    service.run(load_settings(), os.environ.get("APPLIANCE_PASSPHRASE"))


@cli.command("stop")
@click.option("--timeout", type=FiniteRange(1), default=120, show_default=True,
              help="Seconds to wait for the running job to checkpoint and the daemon to exit.")
def stop(timeout: float) -> None:
    """Stop a daemon started by hand or by quickstart (under systemd: 'systemctl stop appliance')."""
    settings = load_settings()
    pid = _daemon_pid(settings)
    os.kill(pid, signal.SIGTERM)
    click.echo(f"asked the daemon (pid {pid}) to stop; a running job checkpoints first", err=True)
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            raise DaemonError(f"the daemon (pid {pid}) is still stopping after {timeout:.0f} s",
                              hint="wait longer, or see its log; 'kill -9' loses only the work since the checkpoint")
        time.sleep(0.2)
    click.echo("the daemon stopped")


def _daemon_pid(settings: Settings) -> int:
    if not client.daemon_running(settings):
        raise DaemonError("no daemon is running", hint=f"nothing answers on {settings.socket_path}")
    try:
        return int(settings.pid_path.read_text())
    except (OSError, ValueError) as exc:
        raise DaemonError(f"a daemon answers but its pid file {settings.pid_path} is unreadable",
                          hint="a daemon run by systemd is stopped with 'systemctl stop appliance'") from exc


def _alive(pid: int) -> bool:
    """Running: not gone, and not a zombie waiting for its parent to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
