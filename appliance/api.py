"""The control API: what the CLI and the TUI ask the daemon, over a local socket.

Every call but /v1/health carries a user token (`Authorization: Bearer apu_...`) and
is checked against the role it needs: viewer reads, operator changes data, jobs and
deployments, admin manages users. Changes are audited by the operations they call,
with the user as actor; a refused call is audited too (who, what, why), so probing
leaves a trace. Reads are not audited: a TUI polling every second would bury the
log. Errors are JSON `{"error", "hint"}` with a 4xx status, never a traceback.

Handlers are plain functions run in FastAPI's thread pool; they share the daemon's
one Store, one at a time (SQLite connections are not for concurrent use).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from importlib import metadata
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from appliance import auth, datasets, events, jobs, registry, users
from appliance.errors import ApplianceError, AuthError
from appliance.serve.app import describe_error, json_error
from appliance.store import Store, audit

EVENTS_POLL_S = 0.5


class SharedStore:
    """The daemon's store, lent to one handler at a time."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()

    @contextmanager
    def use(self) -> Iterator[Store]:
        with self._lock:
            yield self.store


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobRequest(_Strict):
    kind: str = Field(description="train | optimize | pipeline")
    params: dict[str, Any] = Field(default_factory=dict)
    priority: int = Field(0, ge=-100, le=100, description="higher runs first and may preempt lower")


class ApiKeyRequest(_Strict):
    name: str
    models: list[str] = Field(default_factory=lambda: [auth.ALL_MODELS])


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
            jobs.get(store, job_id)
            return [event.data["line"] for event in events.after(store, 0, job_id, limit=100_000)
                    if event.kind == "log"]

    @app.post("/v1/jobs/{job_id}/cancel")
    def cancel(job_id: str, user: Operator) -> dict[str, Any]:
        with shared.use() as store:
            return asdict(jobs.cancel(store, job_id, actor=_actor(user)))

    @app.get("/v1/datasets")
    def list_datasets(_user: Viewer) -> list[dict[str, Any]]:
        with shared.use() as store:
            return [asdict(version) for version in datasets.list_versions(store)]

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
