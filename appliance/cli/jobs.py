"""`appliance jobs`: the daemon's queue, from the shell.

With a daemon running, every command goes through its control API (authorised and
audited as the caller's user); with none, list, show and logs read the store directly,
and submit and cancel queue or cancel for the next daemon start.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from appliance.cli.base import cli, json_option, print_json, progress_bar
from appliance.cli.connect import Appliance, Remote, connected
from appliance.core.errors import DaemonError, JobError, JobNotFound
from appliance.daemon import client
from appliance.operations import jobs, jobspec
from appliance.store import Store


@cli.group("jobs")
def jobs_group() -> None:
    """Queued, running and finished jobs: train, optimize, pipeline, tune."""


@jobs_group.command("list")
@click.option("--status", type=click.Choice(["queued", "running", "finished", "failed", "cancelled"]))
@json_option
def jobs_list(status: str | None, as_json: bool) -> None:
    """Every job, newest first."""
    with connected() as appliance:
        found = appliance.jobs(status)
    if as_json:
        print_json(found)
        return
    if not found:
        click.echo("no jobs; 'appliance jobs submit' or 'appliance quickstart' queues one")
    for job in found:
        stage = f" ({job['stage']})" if job["stage"] and job["status"] == "running" else ""
        click.echo(f"{job['id']}  {job['submitted_at'][:19]}  {job['kind']:<9} {job['status']:<9}{stage:<12}"
                   f" priority {job['priority']:>3}  by {job['submitted_by']}")


@jobs_group.command("show")
@click.argument("job_id")
@json_option
def jobs_show(job_id: str, as_json: bool) -> None:
    """One job: parameters, stage, what its steps made, result or error."""
    with connected() as appliance:
        job = appliance.job(job_id)
    if as_json:
        print_json(job)
        return
    click.echo(f"job {job['id']}: {job['kind']}, {job['status']}" + (f" at {job['stage']}" if job["stage"] else ""))
    click.echo(f"  submitted {job['submitted_at']} by {job['submitted_by']}, priority {job['priority']},"
               f" attempts {job['attempts']}")
    click.echo(f"  params: {json.dumps(job['params'])}")
    if job["state"]:
        click.echo(f"  made:   {json.dumps(job['state'])}")
    if job["result"]:
        click.echo(f"  result: {json.dumps(job['result'])}")
    if job["error"]:
        click.echo(f"  error:  {job['error']}")


@jobs_group.command("logs")
@click.argument("job_id")
def jobs_logs(job_id: str) -> None:
    """What the job's process wrote, oldest first."""
    with connected() as appliance:
        for line in appliance.job_logs(job_id):
            click.echo(line)


@jobs_group.command("cancel")
@click.argument("job_id")
def jobs_cancel(job_id: str) -> None:
    """Cancel a queued job, or stop a running one (it checkpoints first)."""
    with connected() as appliance:
        job = appliance.cancel(job_id)
    if job["status"] == "cancelled":
        click.echo(f"job {job_id} is cancelled")
    else:
        click.echo(f"job {job_id} is asked to stop; it checkpoints and ends as cancelled")


@jobs_group.command("delete")
@click.argument("job_ids", nargs=-1, required=True, metavar="JOB_ID...")
def jobs_delete(job_ids: tuple[str, ...]) -> None:
    """Forget ended jobs: their records and logs. What they made (runs, models) and the audit records stay."""
    with connected() as appliance:
        # Those that cannot be deleted (unknown, queued or running) are asked first (a stable sort): the first
        # refusal, audited with its reason, ends the command before any job is deleted.
        for job_id in sorted(dict.fromkeys(job_ids), key=lambda job_id: _deletable(appliance, job_id)):
            job = appliance.delete_job(job_id)
            click.echo(f"job {job['id']} ({job['kind']}, {job['status']}) deleted")


@jobs_group.command("submit")
@click.argument("kind", type=click.Choice(jobspec.KINDS))
@click.option("--param", "-p", "pairs", multiple=True, metavar="KEY=JSON",
              help="A job parameter, e.g. -p dataset='\"tickets\"' or -p params='{\"epochs\": 3}'; repeat.")
@click.option("--priority", type=click.IntRange(*jobspec.PRIORITY), default=0, show_default=True)
@click.option("--follow", is_flag=True,
              help="Show progress until the job ends; exit 1 unless it finished (needs the daemon).")
def jobs_submit(kind: str, pairs: tuple[str, ...], priority: int, follow: bool) -> None:
    """Queue a job for the daemon.

    Each parameter is checked here, before anything is queued: a wrong or unknown one is refused with what the
    kind takes. 'source' is a file's name in daemon.import_dir and 'base' a model folder's name in
    train.base_models_dir, never paths; the dataset or model version a job names is looked up when it runs.
    """
    given = [_pair(pair) for pair in pairs]
    if repeated := sorted({key for key, _ in given if [k for k, _ in given].count(key) > 1}):
        raise click.BadParameter(f"{', '.join(repeated)} given more than once; give each parameter once",
                                 param_hint="--param")
    spec = jobspec.parse(kind, dict(given))  # refused here, before anything is sent
    with connected() as appliance:
        if follow and not isinstance(appliance, Remote):
            raise DaemonError("--follow follows a job the daemon runs, and no daemon is running: nothing was queued",
                              hint="start it ('systemctl start appliance' or 'appliance daemon'), or leave out "
                                   "--follow to queue the job for its next start; 'appliance train' and 'appliance "
                                   "optimize' run here without one")
        job = appliance.submit(spec, priority)
        click.echo(f"job {job['id']} queued ({kind}, priority {priority})")
        if follow:
            result = result_of(appliance.api, job)
            click.echo(f"job {job['id']} finished: {json.dumps(result)}")


def run_job(api: client.Client, spec: jobspec.Spec) -> dict[str, Any]:
    """Submit a job to the daemon, show its progress, and return its result; JobError unless it finished."""
    job = api.post("/v1/jobs", spec.body())
    click.echo(f"job {job['id']} queued with the daemon ('appliance jobs show {job['id']}')", err=True)
    return result_of(api, job)


def result_of(api: client.Client, job: dict[str, Any]) -> dict[str, Any]:
    """A job's result, following its progress while it is queued or running; JobError unless it finished."""
    if job["status"] in jobs.ACTIVE:
        job = follow_job(api, job["id"])
    if job["status"] != "finished":
        raise JobError(f"job {job['id']} {job['status']}" + (f": {job['error']}" if job["error"] else ""),
                       hint=f"'appliance jobs logs {job['id']}' shows what it did")
    return job["result"]


def follow_job(api: client.Client, job_id: str) -> dict[str, Any]:
    """A progress bar fed by the job's events until its log is whole, its log lines above it as a run in the
    foreground shows them (each epoch's validation figures, how training ended); returns the job as it ended."""
    end = jobs.LogEnd()
    with progress_bar(f"job {job_id}") as bar:
        for event in api.events(subject=job_id):
            data = event["data"]
            if event["kind"] == "progress" and data.get("total_steps"):
                bar(data["step"], data["total_steps"], jobs.progress_words(data))
            elif event["kind"] == "stage":
                bar(0, 1, data["stage"])
            elif event["kind"] == "log" and not data["line"].startswith("stage: "):  # the bar names the stage
                click.echo(data["line"], err=True)
            elif end.whole_after(event["kind"]):
                break
    return api.get(client.path("/v1/jobs/{}", job_id))


class Foreground:
    """This command as an operation's Context when no daemon answers: state in memory, progress on a bar,
    SIGTERM or Ctrl-C asks the operation to checkpoint and stop."""

    def __init__(self, store: Store, bar: Callable[..., None], state: dict[str, Any] | None = None,
                 stoppable: bool = True) -> None:
        self.id, self.store, self.actor, self.max_threads = f"cli-{os.getpid()}", store, None, None
        self.confined = False  # this command opens what its user may
        self.state = dict(state or {})
        self.stop_requested = False
        self._bar = bar
        if stoppable:  # else Ctrl-C interrupts at once, as it does any command
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, self._stop)

    def _stop(self, _signum: int, _frame: object) -> None:
        self.stop_requested = True

    def stage(self, name: str) -> None:
        self._bar(0, 1, name)

    def save(self, **made: Any) -> None:
        self.state.update(made)

    def report(self, data: dict[str, Any], force: bool = False) -> None:
        if data.get("total_steps"):
            self._bar(data["step"], data["total_steps"], jobs.progress_words(data))
        elif "remote" in data:
            self._bar(0, 1, f"ray job {data['remote'].lower()}")

    def log(self, line: str) -> None:
        click.echo(line, err=True)

    def should_stop(self) -> bool:
        return self.stop_requested

    def cancelled(self) -> bool:
        return True  # nothing resumes a foreground burst: a stop cancels the Ray job


@contextmanager
def foreground(store: Store, label: str, state: dict[str, Any] | None = None,
               stoppable: bool = True) -> Iterator[Foreground]:
    """A Foreground context drawing on a progress bar for as long as the operations run; stoppable ones
    checkpoint and stop on SIGTERM or Ctrl-C."""
    with progress_bar(label) as bar:
        yield Foreground(store, bar, state, stoppable)


def _deletable(appliance: Appliance, job_id: str) -> bool:
    try:
        return appliance.job(job_id)["status"] not in jobs.ACTIVE
    except JobNotFound:
        return False


def _pair(pair: str) -> tuple[str, Any]:
    key, sep, value = pair.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--param")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value  # a bare word is a string: -p dataset=tickets
