"""One job, run in its own process: the operations of its kind (operations.run), with progress and a clean stop.

The daemon starts `python -m appliance.operations.worker JOB_ID OWNER [MAX_THREADS]` for a job it has claimed
and writes the store's passphrase (or an empty line) to its stdin: secrets never go
into argv or the environment. The process dies with the daemon (PR_SET_PDEATHSIG), so
a `kill -9` of the daemon cannot leave a second copy of a job running beside the one
a restarted daemon resumes.

Operations record what they made in the job's state as they finish, so a later attempt
(after preemption, a shutdown or a crash) skips them, and training resumes from its
checkpoint. SIGTERM asks the running operation to checkpoint and stop: exit code
EXIT_STOPPED, and the daemon requeues or cancels the job. A failure is recorded in
the job with its message (exit 1); a crash or an out-of-memory kill the daemon
records from the exit status.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from appliance import operations, store
from appliance.core import config
from appliance.core.errors import ApplianceError
from appliance.operations import Stopped, jobs
from appliance.operations.jobspec import Spec
from appliance.store import Store

log = logging.getLogger("appliance.operations.worker")

EXIT_STOPPED = 75  # EX_TEMPFAIL: checkpointed and stopped on request; run it again later
PROGRESS_EVERY_S = 1.0


class Job:
    """A claimed job as the operations' Context: its row holds the state, events carry its progress."""

    def __init__(self, store: Store, job: jobs.Job, owner: str, max_threads: int | None = None) -> None:
        self.store, self.id, self.owner, self.max_threads = store, job.id, owner, max_threads
        self.claimed, self.state = job, dict(job.state)
        self.actor = job.submitted_by
        self.confined = True  # the daemon opens model folders only where root configured
        self.stop_requested = False
        self._last_report = 0.0

    @property
    def spec(self) -> Spec:
        """The job's parameters, typed; JobError (the job fails) for a row that no longer passes."""
        return self.claimed.spec

    def should_stop(self) -> bool:
        return self.stop_requested

    def cancelled(self) -> bool:
        return jobs.get(self.store, self.id).cancel_requested

    def log(self, line: str) -> None:
        log.info("%s", line)

    def stage(self, name: str) -> None:
        jobs.set_stage(self.store, self.id, self.owner, name)
        log.info("stage: %s", name)

    def save(self, **made: Any) -> None:
        self.state = jobs.save_state(self.store, self.id, self.owner, **made)

    def report(self, data: dict[str, Any], force: bool = False) -> None:
        """Progress for the events stream, at most once a second; doubles as the heartbeat."""
        now = time.monotonic()
        if not force and now - self._last_report < PROGRESS_EVERY_S:
            return
        self._last_report = now
        if not jobs.heartbeat(self.store, self.id, self.owner):
            log.warning("another attempt owns this job now; stopping")
            self.stop_requested = True
            return
        jobs.progress(self.store, self.id, data)


# -- the process -------------------------------------------------------------------


def main(argv: list[str]) -> int:
    job_id, owner, *rest = argv
    max_threads = int(rest[0]) if rest else None  # given while a model is served: leave it cores
    passphrase = sys.stdin.readline().rstrip("\n") or None
    _die_with_parent()
    logging.basicConfig(format="%(message)s", level=logging.INFO, stream=sys.stderr)
    # Every stderr line is a line of the job's log, which operators read: the libraries' warnings to their
    # developers (deprecations, experimental APIs) are not for them.
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").setLevel(logging.ERROR)
    try:
        with store.open(config.load(), passphrase) as opened:
            return _run_claimed(opened, job_id, owner, max_threads)
    except ApplianceError as exc:  # the store itself could not be opened: the daemon records the exit
        log.error("%s", exc.message)
        return 1


def _run_claimed(opened: Store, job_id: str, owner: str, max_threads: int | None) -> int:
    job = Job(opened, jobs.get(opened, job_id), owner, max_threads)
    _on_sigterm(lambda: setattr(job, "stop_requested", True))
    try:
        result = operations.run(job, job.spec, study_id=job.id)
    except Stopped:
        log.info("checkpointed and stopped")
        return EXIT_STOPPED
    except ApplianceError as exc:
        message = exc.message + (f" ({exc.hint})" if exc.hint else "")
        log.error("failed: %s", message)
        jobs.fail(opened, job_id, owner, message)
        return 1
    except Exception as exc:  # a bug: the traceback goes to the job's log, one line reaches the job's error
        log.exception("failed with an internal error")
        jobs.fail(opened, job_id, owner, f"internal error: {type(exc).__name__}: {exc}")
        return 1
    jobs.finish(opened, job_id, owner, result)
    log.info("finished")
    return 0


def _on_sigterm(stop: Callable[[], None]) -> None:
    def handler(_signum: int, _frame: object) -> None:
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C at the daemon's terminal reaches the daemon, which decides


def _die_with_parent() -> None:
    """Ask Linux to kill this process when the daemon dies, however it dies."""
    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the heartbeat check still catches orphans
        return
    if os.getppid() == 1:  # the daemon died before the call above took effect
        os._exit(EXIT_STOPPED)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
