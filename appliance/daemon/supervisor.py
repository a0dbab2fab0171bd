"""The job supervisor: queued jobs run one at a time in child processes (appliance.operations.worker).

An out-of-memory kill, a crash or a cancel costs the job, never the daemon. Each tick
starts the next queued job, preempts a running one when a higher priority arrives
(SIGTERM: the job checkpoints and is requeued), cancels on request, kills a job whose
heartbeat stopped, and records how each child ended, with its CPU time for usage.

Serving comes first: while a model is deployed, a job runs at niceness 10 with at most
half the cores, and when the served p95 latency goes over `daemon.latency_objective_ms`
the running job is paused (checkpointed, requeued) and none starts for a minute. Jobs
run only inside `daemon.training_hours` when it is set. The autopilot ticks here too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from appliance import registry, store
from appliance.core import clock, config, sdnotify
from appliance.core.errors import ApplianceError, JobNotFound
from appliance.operations import autopilot, jobs
from appliance.operations.worker import EXIT_STOPPED
from appliance.registry import usage
from appliance.serve.metrics import Metrics, quantile_s
from appliance.store import events

log = logging.getLogger("appliance.daemon")

TICK_S = 0.5
BACKGROUND_NICENESS = 10  # training yields the CPU to serving while a model is deployed
LATENCY_WINDOW_S = 10.0  # serving latency is judged over windows this long
LATENCY_MIN_REQUESTS = 20  # fewer requests than this in a window say nothing about latency
LATENCY_PAUSE_S = 60.0  # after a pause for latency, no job starts for this long
PUMP_DRAIN_S = 5.0  # how long an ended job's last stderr lines may take to arrive (a grandchild may hold the pipe)


@dataclass
class Running:
    """The job whose child process runs now, and why it is being stopped, if it is."""

    job: jobs.Job
    owner: str
    process: subprocess.Popen[str]
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    pump: threading.Thread | None = None  # moves the process's stderr into lines
    stopping: str | None = None  # cancel | preempted by ... | the daemon is stopping
    signalled_at: float | None = None
    started: float = field(default_factory=time.monotonic)


class Supervisor:
    """Runs queued jobs one at a time in child processes; called from its own thread only."""

    def __init__(self, settings: config.Settings, passphrase: str | None, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self._passphrase = passphrase
        self._store = store.open(settings, passphrase)
        self._latency_counts = metrics.latency_counts if metrics else None
        self.autopilot = autopilot.Autopilot(metrics.counts if metrics else dict)
        self._latency_window: tuple[float, list[float]] | None = None  # (since, counts then)
        self.paused_until = 0.0  # monotonic: serving was too slow, so jobs wait
        self._last_wait_reason: str | None = None
        self.running: Running | None = None
        self.draining = False
        self.last_tick = time.monotonic()

    def close(self) -> None:
        self._store.close()

    def run(self, stop: threading.Event) -> None:
        """Tick until stop is set, then drain: the running job checkpoints and goes back to the queue."""
        while not stop.is_set():
            self.tick()
            stop.wait(TICK_S)
        self.draining = True
        if self.running:
            self._signal(self.running, "the daemon is stopping")
        while self.running:
            self.tick()
            time.sleep(0.1)

    def tick(self) -> None:
        self.last_tick = time.monotonic()
        try:
            slow = self._serving_too_slow()
            if self.running:
                self._watch(self.running, slow)
            if self.running is None and not self.draining and self._may_start():
                self._start_next()
            if not self.draining:
                self.autopilot.tick(self._store, self.settings)
        except ApplianceError as exc:  # a bad job must not stop the supervisor
            log.error("supervisor: %s", exc.message)
        except Exception:  # nor a bug or a busy database: say so, and try again at the next tick
            log.exception("supervisor: unexpected error")

    def describe(self) -> dict[str, Any]:
        if self.running is None:
            return {"running_job": None, "jobs_wait_for": self._waiting_reason()}
        job = self.running.job
        return {"running_job": {"id": job.id, "kind": job.kind, "pid": self.running.process.pid,
                                "stopping": self.running.stopping}, "jobs_wait_for": None}

    # -- one job ------------------------------------------------------------------

    def _start_next(self) -> None:
        job = jobs.next_queued(self._store)
        if job is None:
            return
        owner = jobs.claim(self._store, job.id)
        if owner is None:
            return
        serving = self._serving()
        threads = [str(max(1, (os.cpu_count() or 2) // 2))] if serving else []  # leave serving its cores
        process = subprocess.Popen(
            [sys.executable, "-m", "appliance.operations.worker", job.id, owner, *threads],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env=self._child_env(),
        )
        running = Running(jobs.get(self._store, job.id), owner, process)
        running.pump = threading.Thread(target=_pump, args=(process, running.lines), daemon=True,
                                        name=f"job-{job.id}")
        running.pump.start()
        assert process.stdin is not None
        process.stdin.write((self._passphrase or "") + "\n")  # never argv or environment
        process.stdin.close()
        if serving:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, process.pid, BACKGROUND_NICENESS)
        jobs.set_pid(self._store, job.id, owner, process.pid)
        self.running = running
        log.info("job %s (%s, attempt %d) started as pid %d", job.id, job.kind, running.job.attempts, process.pid)
        sdnotify.notify(STATUS=f"running job {job.id} ({job.kind})")

    def _watch(self, running: Running, slow: str | None) -> None:
        self._record_lines(running)
        ended = _reap(running.process)
        if ended is not None:
            code, cpu_s = ended
            if running.pump is not None:
                running.pump.join(PUMP_DRAIN_S)  # the pipe is at its end: the last lines are on their way
            try:
                self._record_lines(running)
                self._ended(running, code)
                jobs.exited(self._store, running.job.id, code)
                job = jobs.get(self._store, running.job.id)
            except JobNotFound:  # deleted once it had recorded its end: what its last moments wrote goes too
                events.forget(self._store, "job", running.job.id)
                job = None
            self.running = None
            sdnotify.notify(STATUS="idle")
            if job is not None:
                usage.record_job(self._store, job, cpu_s, time.monotonic() - running.started)
            return
        try:
            job = jobs.get(self._store, running.job.id)
        except JobNotFound:  # deleted once it had recorded its end, while its process exits: it has the stop time
            running.stopping = running.stopping or "deleted"
            running.signalled_at = running.signalled_at or time.monotonic()
            if time.monotonic() - running.signalled_at > self.settings.daemon.stop_timeout_s:
                running.process.kill()
            return
        if running.stopping is None:
            waiting = jobs.next_queued(self._store)
            if job.cancel_requested:
                self._signal(running, "cancel")
            elif waiting is not None and waiting.priority > job.priority:
                self._signal(running, f"preempted by job {waiting.id} (priority {waiting.priority})")
            elif slow:
                self._signal(running, f"paused: {slow}")
            elif not self.settings.daemon.allows_jobs_at(datetime.now().time()):
                self._signal(running, f"outside the training hours {self.settings.daemon.training_hours}")
            elif _age_s(job.heartbeat_at) > self.settings.daemon.heartbeat_timeout_s:
                log.error("job %s: no heartbeat for %.0f s; killing it", job.id, _age_s(job.heartbeat_at))
                running.stopping = "stopped sending heartbeats"
                running.process.kill()
        elif (running.signalled_at is not None
              and time.monotonic() - running.signalled_at > self.settings.daemon.stop_timeout_s):
            log.warning("job %s did not stop within %.0f s; killing it", job.id, self.settings.daemon.stop_timeout_s)
            running.process.kill()

    def _signal(self, running: Running, reason: str) -> None:
        running.stopping, running.signalled_at = reason, time.monotonic()
        log.info("job %s: stopping (%s)", running.job.id, reason)
        with contextlib.suppress(ProcessLookupError):
            running.process.send_signal(signal.SIGTERM)

    def _ended(self, running: Running, code: int) -> None:
        job = jobs.get(self._store, running.job.id)
        if job.status != "running" or job.owner != running.owner:
            log.info("job %s ended: %s", job.id, job.status)  # the child recorded it
            return
        # Stopped on request: it checkpointed (75), or died of our signal before it could (-15, -9), which
        # loses at most the work since its last checkpoint.
        stopped = running.stopping is not None and code in (EXIT_STOPPED, -signal.SIGTERM, -signal.SIGKILL)
        if stopped and running.stopping == "cancel":
            jobs.cancelled_while_running(self._store, job.id, running.owner)
        elif stopped and running.stopping != "stopped sending heartbeats":
            jobs.requeue(self._store, job.id, running.owner, running.stopping)
            log.info("job %s requeued (%s)", job.id, running.stopping)
        else:
            reason = running.stopping or _exit_reason(code)
            jobs.fail(self._store, job.id, running.owner, f"the job process {reason}")
            log.error("job %s failed: the job process %s", job.id, reason)

    def _record_lines(self, running: Running) -> None:
        while True:
            try:
                line = running.lines.get_nowait()
            except queue.Empty:
                return
            jobs.log(self._store, running.job.id, line)
            log.info("job %s: %s", running.job.id, line, extra={"job": running.job.id})

    def _may_start(self) -> bool:
        reason = self._waiting_reason()
        if reason and reason != self._last_wait_reason:
            log.info("jobs wait: %s", reason)
            sdnotify.notify(STATUS=f"jobs wait: {reason}")
        self._last_wait_reason = reason
        return reason is None

    def _waiting_reason(self) -> str | None:
        if not self.settings.daemon.allows_jobs_at(datetime.now().time()):
            return f"outside the training hours {self.settings.daemon.training_hours}"
        if time.monotonic() < self.paused_until:
            return "serving latency was over its objective"
        return None

    def _serving_too_slow(self) -> str | None:
        """Once per window: why serving is too slow (its p95 over the objective), or None."""
        objective_ms = self.settings.daemon.latency_objective_ms
        if not objective_ms or self._latency_counts is None:
            return None
        now, counts = time.monotonic(), self._latency_counts()
        if self._latency_window is None or now - self._latency_window[0] < LATENCY_WINDOW_S:
            self._latency_window = self._latency_window or (now, counts)
            return None
        p95_s, requests = quantile_s(self._latency_window[1], counts, 0.95)
        self._latency_window = (now, counts)
        if requests < LATENCY_MIN_REQUESTS or p95_s * 1000 <= objective_ms:
            return None
        self.paused_until = now + LATENCY_PAUSE_S
        return f"serving p95 latency up to {p95_s * 1000:g} ms over {requests} requests, objective {objective_ms:g} ms"

    def _serving(self) -> bool:
        return any("production" in version.aliases for version in registry.list_versions(self._store))

    def _child_env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if key != "APPLIANCE_PASSPHRASE"}
        if self.settings.config_file is not None:
            env["APPLIANCE_CONFIG"] = str(self.settings.config_file)
        return env


def _pump(process: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
    """Move the child's stderr into a queue, line by line, so the supervisor never blocks on it."""
    assert process.stderr is not None
    for line in process.stderr:
        if line.strip():
            lines.put(line.rstrip()[:2000])


def _reap(process: subprocess.Popen[str]) -> tuple[int, float] | None:
    """The exit code and CPU seconds of a child that ended, None while it runs.

    wait4 instead of poll(): the kernel's rusage of the child (its waited-for children
    included) comes with the reaping and is gone after it.
    """
    try:
        pid, status, rusage = os.wait4(process.pid, os.WNOHANG)
    except ChildProcessError:  # reaped already by a signal's poll(); its CPU time is lost with it
        return None if process.returncode is None else (process.returncode, 0.0)
    if pid == 0:
        return None
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, rusage.ru_utime + rusage.ru_stime


def _exit_reason(code: int) -> str:
    if code < 0:
        name = signal.Signals(-code).name
        return f"was killed by {name}" + (" (out of memory?)" if code == -signal.SIGKILL else "")
    return f"exited with status {code}"


def _age_s(stamp: str | None) -> float:
    return clock.age(stamp).total_seconds() if stamp else 0.0
