"""The control API: what the CLI and the TUI ask the daemon, over a local socket.

Every call but /v1/health carries a user token (`Authorization: Bearer apu_...`) and
is checked against the role it needs: viewer reads, operator changes data, jobs and
deployments, admin manages users. Changes are audited by the operations they call,
with the user as actor; a refused call is audited too (who, what, why), so probing
leaves a trace. Reads are audited as `api.read` once per user and endpoint every ten
minutes: who looked at what stays on record, and a TUI polling every second does not
bury the log. Errors are JSON `{"error", "hint"}` with a 4xx status, never a traceback.

Handlers are plain functions run in FastAPI's thread pool; they share the daemon's
one Store, one at a time (SQLite connections are not for concurrent use).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from appliance import auth, datasets, events, jobs, registry, users
from appliance.errors import ApplianceError, AuthError, DatasetError
from appliance.serve.app import describe_error, json_error
from appliance.store import Store, audit

EVENTS_POLL_S = 0.5
READ_AUDIT_S = 600.0


class SharedStore:
    """The daemon's store, lent to one handler at a time."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._reads: dict[tuple[str, str], float] = {}  # (user id, endpoint) -> when last audited

    @contextmanager
    def use(self) -> Iterator[Store]:
        with self._lock:
            yield self.store

    def note_read(self, store: Store, user: users.User, request: Request) -> None:
        """Audit a read, unless this user's read of this endpoint was audited in the last READ_AUDIT_S."""
        route = request.scope.get("route")
        endpoint = getattr(route, "path", request.url.path)  # /v1/jobs/{job_id}, not every id apart
        now = time.monotonic()
        if now - self._reads.get((user.id, endpoint), -READ_AUDIT_S) < READ_AUDIT_S:
            return
        self._reads[(user.id, endpoint)] = now
        audit.record(store, "api.read", f"GET {endpoint}", actor=_actor(user))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobRequest(_Strict):
    kind: str = Field(description="train | optimize | pipeline")
    params: dict[str, Any] = Field(default_factory=dict)
    priority: int = Field(0, ge=-100, le=100, description="higher runs first and may preempt lower")


class ApiKeyRequest(_Strict):
    name: str
    models: list[str] = Field(default_factory=lambda: [auth.ALL_MODELS])


class ImportRequest(_Strict):
    path: str = Field(description="a file or folder on this machine that the daemon's user can read")
    name: str
    task: str = datasets.TEXT
    text_column: str = "text"
    label_column: str = "label"
    validation_fraction: float = Field(0.2, gt=0, lt=1)
    seed: int = 13
    residency: str = Field(datasets.LOCAL_ONLY, description="local-only | burst-allowed (may go to the Ray cluster)")


class ResidencyRequest(_Strict):
    residency: str = Field(description="local-only | burst-allowed")


class DeployRequest(_Strict):
    version: int | None = Field(None, ge=1, description="default: the newest version")
    canary_percent: float | None = Field(None, gt=0, le=100)


def _caller(role: str) -> Callable[..., users.User]:
    """A dependency: the user behind the request's token, if their role is at least `role`."""

    def check(request: Request, authorization: Annotated[str | None, Header()] = None) -> users.User:
        token = authorization.removeprefix("Bearer ").strip() if authorization else None
        shared: SharedStore = request.app.state.shared
        user: users.User | None = None
        with shared.use() as store:
            try:
                user = users.authenticate(store, token)
                users.require(user, role)
            except AuthError as exc:
                who = _actor(user) if user else "anonymous"
                audit.record(store, "api.refused", f"{request.method} {request.url.path}", actor=who,
                             reason=exc.message)
                raise
            if request.method == "GET":
                shared.note_read(store, user, request)
        return user

    return check


Viewer = Annotated[users.User, Depends(_caller("viewer"))]
Operator = Annotated[users.User, Depends(_caller("operator"))]
Admin = Annotated[users.User, Depends(_caller("admin"))]


def create_app(shared: SharedStore, status: Callable[[], dict[str, Any]]) -> FastAPI:
    """The ASGI app; `status` gives the daemon's own view (pid, servers, the running job)."""
    app = FastAPI(title="appliance control", version=metadata.version("appliance"), docs_url=None, redoc_url=None)

    app.state.shared = shared

    @app.get("/v1/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/status")
    def daemon_status(_user: Viewer) -> dict[str, Any]:
        with shared.use() as store:
            counts = dict(store.db.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status").fetchall())
        return {**status(), "version": metadata.version("appliance"), "jobs": counts}

    @app.get("/v1/jobs")
    def list_jobs(_user: Viewer, status: str | None = None) -> list[dict[str, Any]]:
        with shared.use() as store:
            return [asdict(job) for job in jobs.list_jobs(store, status)]

    @app.post("/v1/jobs", status_code=201)
    def submit(body: JobRequest, user: Operator) -> dict[str, Any]:
        with shared.use() as store:
            return asdict(jobs.submit(store, body.kind, body.params, body.priority, actor=_actor(user)))

    @app.get("/v1/jobs/{job_id}")
    def get_job(job_id: str, _user: Viewer) -> dict[str, Any]:
        with shared.use() as store:
            return asdict(jobs.get(store, job_id))

    @app.get("/v1/jobs/{job_id}/logs")
    def job_logs(job_id: str, _user: Viewer) -> list[str]:
        with shared.use() as store:
            return jobs.log_lines(store, job_id)

    @app.post("/v1/jobs/{job_id}/cancel")
    def cancel(job_id: str, user: Operator) -> dict[str, Any]:
        with shared.use() as store:
            return asdict(jobs.cancel(store, job_id, actor=_actor(user)))

    @app.get("/v1/datasets")
    def list_datasets(_user: Viewer) -> list[dict[str, Any]]:
        with shared.use() as store:
            return [asdict(version) for version in datasets.list_versions(store)]

    @app.post("/v1/datasets", status_code=201)
    def import_dataset(body: ImportRequest, user: Operator) -> dict[str, Any]:
        """Check and store a file the daemon can read; an unchanged file answers with the version it already is."""
        with shared.use() as store:
            known = {version.id for version in datasets.list_versions(store)}
            try:
                version = datasets.import_file(store, Path(body.path), **body.model_dump(exclude={"path"}),
                                               actor=_actor(user))
            except OSError as exc:  # the daemon runs as its own user, who may not read the caller's files
                raise DatasetError(f"the daemon cannot read {body.path}: {exc.strerror}",
                                   hint="make it readable by the appliance's user, or copy it where it can read") from exc
        return {**asdict(version), "unchanged": version.id in known}

    @app.post("/v1/datasets/{ref}/residency")
    def set_residency(ref: str, body: ResidencyRequest, user: Operator) -> list[dict[str, Any]]:
        """Whether a dataset (every version of a name, or name:version) may leave this box for a burst."""
        with shared.use() as store:
            return [asdict(version) for version in datasets.set_residency(store, ref, body.residency,
                                                                           actor=_actor(user))]

    @app.get("/v1/models")
    def list_models(_user: Viewer) -> list[dict[str, Any]]:
        with shared.use() as store:
            return [asdict(version) for version in registry.list_versions(store)]

    @app.post("/v1/models/{model}/deploy")
    def deploy(model: str, body: DeployRequest, user: Operator) -> dict[str, Any]:
        ref = f"{model}:{body.version}" if body.version else model
        with shared.use() as store:
            return asdict(registry.deploy(store, ref, body.canary_percent, actor=_actor(user)))

    @app.post("/v1/models/{model}/rollback")
    def rollback(model: str, user: Operator) -> dict[str, Any]:
        with shared.use() as store:
            if registry.canary_percent(store, model) > 0:
                registry.stop_canary(store, model, actor=_actor(user))
                return {"model": model, "canary": "stopped"}
            return {"model": model, "production": registry.rollback(store, model, actor=_actor(user))}

    @app.post("/v1/api-keys", status_code=201)
    def create_api_key(body: ApiKeyRequest, user: Admin) -> dict[str, Any]:
        """A key for the inference server; the token is in this answer and nowhere else, ever."""
        with shared.use() as store:
            key, token = auth.create(store, body.name, body.models, actor=_actor(user))
        return {**asdict(key), "token": token}

    @app.get("/v1/users")
    def list_users(_user: Admin) -> list[dict[str, Any]]:
        with shared.use() as store:
            return [asdict(user) for user in users.list_users(store)]

    @app.get("/v1/events", response_class=StreamingResponse)
    async def event_stream(
        _user: Viewer, after: Annotated[int, Query(ge=0)] = 0, subject: str | None = None
    ) -> StreamingResponse:
        """Server-sent events: job progress, stages and logs, deploys, drift alerts; resume with ?after=SEQ."""

        def read(seq: int) -> list[events.Event]:
            with shared.use() as store:
                return events.after(store, seq, subject)

        async def stream() -> AsyncIterator[str]:
            seq = after
            while True:
                found = await asyncio.to_thread(read, seq)
                for event in found:
                    seq = event.seq
                    yield f"id: {event.seq}\nevent: {event.topic}.{event.kind}\ndata: {json.dumps(asdict(event), default=str)}\n\n"
                if not found:
                    yield ": idle\n\n"  # a comment line: keeps proxies and clients from timing out
                    await asyncio.sleep(EVENTS_POLL_S)

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    @app.exception_handler(ApplianceError)
    async def appliance_error(_request: Request, exc: ApplianceError) -> JSONResponse:
        status = getattr(exc, "status", 400)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return json_error(status, exc.message, exc.hint, headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(describe_error(error) for error in exc.errors()[:5])
        return json_error(400, f"the request is not valid: {problems}", "see the OpenAPI document at /openapi.json")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return json_error(exc.status_code, str(exc.detail), None, getattr(exc, "headers", None))

    return app


def _actor(user: users.User) -> str:
    return f"user:{user.name}"
