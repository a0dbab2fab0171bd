"""The service: the control API, the inference server and the job supervisor in one process.

start: refuse a diverged audit log, write the local admin's token, put jobs an earlier
daemon left running (it crashed, or was killed with -9) back in the queue, bind the
control socket. run: both servers on one event loop, the supervisor (supervisor.py:
jobs in child processes, serving first), the backup schedule (store/backups.py:
every `backup.every_hours`, audited as `backup.created`) and the store's upkeep
(store/space.py: free pages back to the disk, the day's size) on their own threads, the
audit log checked every second. stop: drain the running job, then the servers.

systemd: READY=1 once both servers listen, STATUS= with what runs, WATCHDOG=1 while
the event loop and the supervisor are alive, STOPPING=1 on SIGTERM. SIGTERM drains:
the running job checkpoints and is requeued, then the servers stop. SIGHUP re-reads
the configuration: the daemon.* and autopilot.* settings apply at once, serve.* ones at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn
import uvloop

from appliance import store
from appliance.access import users
from appliance.core import clock, config, sdnotify
from appliance.core.errors import ApplianceError, DaemonError
from appliance.daemon import api
from appliance.daemon.supervisor import Supervisor
from appliance.operations import jobs
from appliance.serve.metrics import Metrics
from appliance.store import audit, backups, events, space

log = logging.getLogger("appliance.daemon")

# -- the process -------------------------------------------------------------------


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to the daemon, which runs two of them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def run(settings: config.Settings, passphrase: str | None) -> None:
    """Run the daemon until SIGTERM or SIGINT; raises ApplianceError when it cannot start."""
    with store.open(settings, passphrase) as opened:
        if problem := audit.divergence(opened):
            raise DaemonError(f"refusing to start: {problem}", hint=audit.REWIND_HINT)
        users.local_admin_token(opened, settings.cli_token_path)
        for job_id in jobs.recover(opened):
            log.warning("job %s was running when the previous daemon stopped; it is queued again", job_id)
        events.prune_progress(opened)
    listener = _bind(settings.socket_path)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:  # as uvicorn picks for `appliance serve`
            runner.run(_serve(settings, passphrase, listener))
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            settings.socket_path.unlink()
        with contextlib.suppress(FileNotFoundError):
            settings.pid_path.unlink()


async def _serve(settings: config.Settings, passphrase: str | None, listener: socket.socket) -> None:
    from appliance.serve import app as serve_app  # openvino loads here, not for `appliance --help`
    from appliance.serve import tls
    from appliance.serve.runtime import Runtime

    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    diverged: str | None = None
    metrics = Metrics()
    supervisor = Supervisor(settings, passphrase, metrics)
    started_at, started = clock.stamp(), time.monotonic()

    def status() -> dict[str, Any]:
        return {"pid": os.getpid(), "started_at": started_at, "uptime_s": round(time.monotonic() - started),
                "socket": str(settings.socket_path),
                "inference": settings.inference_url, **supervisor.describe()}

    def reload() -> None:
        try:
            fresh = config.load(settings.config_file)
        except ApplianceError as exc:
            log.error("config not reloaded: %s", exc.message)
            return
        supervisor.settings = dataclasses.replace(supervisor.settings, daemon=fresh.daemon, autopilot=fresh.autopilot)
        note = "; serve.* changes apply at the next start" if fresh.serve != settings.serve else ""
        log.info("configuration reloaded from %s%s", settings.config_file or "the environment", note)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    loop.add_signal_handler(signal.SIGHUP, reload)

    with store.open(settings, passphrase) as api_store:
        runtime = Runtime(settings, metrics, passphrase)
        shared = api.SharedStore(api_store)
        control_app = api.create_app(shared, status, runtime)
        options: dict[str, Any] = {"log_level": "warning", "log_config": None, "access_log": False, "lifespan": "off",
                                   **serve_app.hardened_options(settings.serve, serve_app.Uploads(
                                       frozenset(api.UPLOAD_PATHS), api.UPLOAD_BODY_TIMEOUT_S))}
        control = _Server(uvicorn.Config(control_app, **options))
        inference = _Server(serve_app.server_config(settings, runtime))
        listening = [control, inference]
        servers = [asyncio.create_task(control.serve(sockets=[listener])), asyncio.create_task(inference.serve())]
        if settings.daemon.tcp_port:  # for a TUI on another machine: always TLS, the same tokens and roles
            remote = _Server(uvicorn.Config(control_app, host=settings.daemon.tcp_host, port=settings.daemon.tcp_port,
                                            **options, **tls.uvicorn_options(settings)))
            listening.append(remote)
            servers.append(asyncio.create_task(remote.serve()))
        stop_supervisor = threading.Event()
        worker = threading.Thread(target=supervisor.run, args=(stop_supervisor,), name="supervisor")
        backup_taker = threading.Thread(target=backups.keep_taking, args=(settings, passphrase, stop_supervisor),
                                        name="backups")
        upkeep = threading.Thread(target=space.keep_tidy, args=(settings, passphrase, stop_supervisor),
                                  name="store-upkeep")
        try:
            while not all(server.started for server in listening):
                if any(task.done() for task in servers):
                    raise DaemonError(
                        f"could not listen on {settings.serve.host}:{settings.serve.port} (inference)"
                        + (f" or {settings.daemon.tcp_host}:{settings.daemon.tcp_port} (control)"
                           if settings.daemon.tcp_port else ""),
                        hint="another program uses that port: stop it, or set serve.port / daemon.tcp_port")
                await asyncio.sleep(0.05)
            worker.start()
            backup_taker.start()
            upkeep.start()
            settings.pid_path.write_text(f"{os.getpid()}\n")
            log.info("ready: control API on %s, inference on %s", settings.socket_path, settings.inference_url)
            sdnotify.notify(READY=1, STATUS="idle")
            watchdog = sdnotify.watchdog_interval()
            while not stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), timeout=min(watchdog or 1.0, 1.0))
                if watchdog and worker.is_alive() and time.monotonic() - supervisor.last_tick < 60:
                    sdnotify.notify(WATCHDOG=1)
                await asyncio.to_thread(_flush_refusals, shared)
                control_app.state.traffic.sample()  # so the Serving screen's rates cover the last minute
                if diverged := await asyncio.to_thread(_divergence, shared):
                    log.error("stopping: %s", diverged)
                    break
            sdnotify.notify(STOPPING=1, STATUS="stopping: the running job checkpoints")
            log.info("stopping: draining the running job")
        finally:
            stop_supervisor.set()
            for thread in (worker, backup_taker, upkeep):
                if thread.is_alive():
                    await asyncio.to_thread(thread.join)
            supervisor.close()
            shared.closing.set()
            await asyncio.to_thread(_flush_refusals, shared, everything=True)
            for server in listening:
                server.should_exit = True
            await asyncio.gather(*servers, return_exceptions=True)
    if diverged:
        raise DaemonError(f"stopped: {diverged}", hint=audit.REWIND_HINT)
    log.info("stopped")


def _divergence(shared: api.SharedStore) -> str | None:
    """How the audit log disagrees with its anchor (someone cut it or put an older database back), or None."""
    with shared.use() as opened:
        return audit.divergence(opened)


def _flush_refusals(shared: api.SharedStore, *, everything: bool = False) -> None:
    """Put the counted refusals of the control API on the record; a full disk is logged, not fatal."""
    try:
        with shared.use() as opened:
            shared.flush_refusals(opened, everything=everything)
    except ApplianceError as exc:
        log.error("refused calls not recorded: %s", exc.message)


def _open_to_group(folder: Path) -> None:
    """Let the daemon's group pass through the socket's folder (g+x), without listing or reading it.

    The socket is 0660 for the group; the folder holding it must let that group in, or the mode means nothing.
    In the state directory (by hand), every other file is 0600, so passing through shows nothing else.
    """
    folder.mkdir(mode=0o750, parents=True, exist_ok=True)
    mode = stat.S_IMODE(folder.stat().st_mode)
    if mode & 0o010:
        return
    try:
        os.chmod(folder, mode | 0o010)
    except PermissionError:
        log.warning("the control socket's folder %s is not open to the daemon's group (mode %04o): only its user"
                    " can use the control API", folder, mode)


def _bind(path: Path) -> socket.socket:
    """The control socket, mode 0660 from the start; a stale socket from a dead daemon is replaced, anything else
    at that path (a mistyped setting naming a file) is left alone and refused."""
    if path.exists() and not stat.S_ISSOCK(path.lstat().st_mode):
        raise DaemonError(f"daemon.socket names {path}, which is not a socket: the daemon will not replace it",
                          hint="set daemon.socket (APPLIANCE_DAEMON_SOCKET) to a path of its own, in a folder that"
                               " exists")
    if path.exists():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # nobody listens: left by a daemon that was killed
        else:
            raise DaemonError(f"a daemon already listens on {path}", hint="'appliance stop' stops it")
        finally:
            probe.close()
    _open_to_group(path.parent)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o117)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o660)
    listener.listen(64)
    return listener
