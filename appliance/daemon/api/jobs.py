"""Jobs (submit, follow, cancel), and the training runs and hyperparameter searches they leave."""

from __future__ import annotations

import contextlib
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from appliance import operations
from appliance.access import users
from appliance.core.errors import JobNotFound
from appliance.daemon.api.deps import Admin, Operator, Shared, SharedStore, Viewer, actor
from appliance.operations import jobs
from appliance.operations.jobspec import JobRequest  # one body per kind, told apart by "kind": /openapi.json shows each
from appliance.store import Store
from appliance.train import runs, studies

router = APIRouter()


@router.get("/v1/jobs")
def list_jobs(_user: Viewer, shared: Shared, status: str | None = None,
              limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> list[dict[str, Any]]:
    """The newest `limit` jobs (or those with this status), newest first."""
    with shared.use() as store:
        return [job.shown() for job in jobs.list_jobs(store, status, limit)]


@router.post("/v1/jobs", status_code=201)
def submit(body: JobRequest, user: Operator, shared: Shared, request: Request) -> dict[str, Any]:
    with shared.use() as store:
        shared.require(store, user, body.spec.role, request)  # an export is an admin's
        return jobs.submit(store, body.spec, body.priority, actor=actor(user)).shown()


@router.get("/v1/jobs/{job_id}")
def get_job(job_id: str, _user: Viewer, shared: Shared) -> dict[str, Any]:
    with shared.use() as store:
        return jobs.get(store, job_id).shown()


@router.get("/v1/jobs/{job_id}/logs")
def job_logs(job_id: str, _user: Viewer, shared: Shared) -> list[str]:
    with shared.use() as store:
        return jobs.log_lines(store, job_id)


@router.post("/v1/jobs/{job_id}/cancel")
def cancel(job_id: str, user: Operator, shared: Shared, request: Request) -> dict[str, Any]:
    """Cancel a queued job, or ask a running one to stop; a job only its submitter's role may cancel (an export)."""
    with shared.use() as store:
        _require_role_of(store, shared, user, job_id, request)
        return jobs.cancel(store, job_id, actor=actor(user)).shown()


@router.delete("/v1/jobs/{job_id}")
def delete(job_id: str, user: Operator, shared: Shared, request: Request) -> dict[str, Any]:
    """Forget an ended job, its record and its log; what it made and its audit records stay. An export's archive
    not yet taken goes with it, so only an admin deletes an export job."""
    with shared.use() as store:
        _require_role_of(store, shared, user, job_id, request)
        return jobs.delete(store, job_id, actor=actor(user)).shown()


def _require_role_of(store: Store, shared: SharedStore, user: users.User, job_id: str, request: Request) -> None:
    """The job's own role (an export is an admin's), refused and audited as any refusal; an unknown id is left to
    the call, which refuses it on the record."""
    with contextlib.suppress(JobNotFound):
        shared.require(store, user, jobs.get(store, job_id).role, request)


@router.get("/v1/exports/{job_id}", response_class=Response,
            responses={200: {"content": {"application/octet-stream": {}},
                             "description": "the signed export archive (a tar), handed over once"}})
def take_export(job_id: str, user: Admin, shared: Shared) -> Response:
    """The archive a finished export job made: it leaves the store as it is sent."""
    with shared.use() as store:
        data = jobs.take_export(store, job_id, actor=actor(user))
    return Response(data, media_type="application/octet-stream")


@router.get("/v1/runs")
def list_runs(_user: Viewer, shared: Shared) -> list[dict[str, Any]]:
    with shared.use() as store:
        return [asdict(run) for run in runs.list_runs(store)]


@router.get("/v1/runs/{run_id}")
def get_run(run_id: str, _user: Viewer, shared: Shared) -> dict[str, Any]:
    """A training run and its epochs so far: loss and validation metrics, for charts."""
    with shared.use() as store:
        return runs.describe(store, run_id)


@router.delete("/v1/runs/{run_id}/checkpoint")
def discard_run(run_id: str, user: Admin, shared: Shared) -> dict[str, Any]:
    """Give up a run that will not be resumed: its checkpoint is deleted; the run and its curve stay."""
    with shared.use() as store:
        run, freed = operations.discard_run(store, run_id, actor=actor(user))
    return {**asdict(run), "freed_bytes": freed}


@router.get("/v1/studies")
def list_studies(_user: Viewer, shared: Shared) -> list[dict[str, Any]]:
    """Every hyperparameter search, oldest first, with how many trials it ran and its best value."""
    with shared.use() as store:
        return studies.summaries(store)


@router.get("/v1/studies/{study_id}")
def get_study(study_id: str, _user: Viewer, shared: Shared) -> dict[str, Any]:
    """What `appliance tune show --json` gives: the search, its trials best first with their curves, importances."""
    with shared.use() as store:
        return studies.describe(store, study_id)
