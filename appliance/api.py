"""The control API: what the CLI and the TUI ask the daemon, over a local socket.

Every call but /v1/health carries a user token (`Authorization: Bearer apu_...`) and
is checked against the role it needs: viewer reads, operator changes data, jobs and
deployments, admin manages users. Changes are audited by the operations they call,
with the user as actor; a refused call is audited too (who, what, why), so probing
leaves a trace. Reads are audited as `api.read` once per user and endpoint every ten
minutes: who looked at what stays on record, and a TUI polling every second does not
bury the log. Errors are JSON `{"error", "hint"}` with a 4xx status, never a traceback.

Handlers are plain functions run in FastAPI's thread pool; they share the daemon's
one Store, one at a time (SQLite connections are not for concurrent use). The serving
endpoints are async instead: they read the inference server's runtime, which lives on
the daemon's event loop, and never touch the store.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from importlib import metadata
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from appliance import auth, config, datasets, events, feedback, jobs, privacy, registry, sources, system, usage, users
from appliance.errors import ApplianceError, AuthError, BadRequest, DaemonError
from appliance.jobspec import JobRequest  # one body per kind, told apart by "kind": /openapi.json shows each
from appliance.serve.app import label_scores
from appliance.serve.metrics import Metrics, TrafficWindow
from appliance.serve.runtime import Runtime
from appliance.store import Store, audit
from appliance.train import runs, studies
from appliance.web import BodyLimit, describe_error, document_errors, http_error, json_error

EVENTS_POLL_S = 0.5
READ_AUDIT_S = 600.0
REFUSALS_WINDOW_S = 60.0  # refusals of one source and caller are written once, then counted for this long
REFUSALS_TRACKED = 10_000  # sources and callers tracked at once; more are counted together
HARDWARE_TIMEOUT_S = 120.0
MAX_JSON_BYTES = 1 << 20  # every body but a dataset upload
UPLOAD_PATH = "/v1/datasets"
UPLOAD_BODY_TIMEOUT_S = 3600.0  # a dataset of daemon.max_upload_mb may take a while to arrive; heads are as quick


class SharedStore:
    """The daemon's store, lent to one handler at a time."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._reads: dict[tuple[str, str], float] = {}  # (user id, endpoint) -> when last audited
        self._refusals: dict[tuple[str, str], _Refusals] = {}  # (source, caller) -> refusals of this window
        self.closing = threading.Event()  # set as the daemon stops: open event streams end rather than hold it up

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

    def note_refusal(self, store: Store, who: str, source: str, request: Request, reason: str) -> None:
        """Audit a refused call: the first of a source and caller in a window at once, the rest as one count.

        Probing stays on the record (who, from where, what, why, how often) without a row per request, so a
        flood of bad tokens cannot grow the audit log without bound.
        """
        key = (source, who) if len(self._refusals) < REFUSALS_TRACKED else ("many sources", "many callers")
        found = self._refusals.get(key)
        now = time.monotonic()
        if found is not None and now - found.since < REFUSALS_WINDOW_S:
            found.count += 1
            if len(found.requests) < 10:
                found.requests.add(_route(request))
            return
        if found is not None:
            _write_refusals(store, key, found)
        self._refusals[key] = _Refusals(now)
        audit.record(store, "api.refused", f"{request.method} {request.url.path[:200]}", actor=who, source=source,
                     reason=reason)

    def flush_refusals(self, store: Store, *, everything: bool = False) -> None:
        """Write the counts of windows that ended (all of them as the daemon stops)."""
        now = time.monotonic()
        for key, found in list(self._refusals.items()):
            if everything or now - found.since >= REFUSALS_WINDOW_S:
                del self._refusals[key]
                _write_refusals(store, key, found)


@dataclass
class _Refusals:
    """Refusals of one source and caller after the first one of a window, not yet written."""

    since: float
    count: int = 0
    requests: set[str] = field(default_factory=set)


def _write_refusals(store: Store, key: tuple[str, str], found: _Refusals) -> None:
    if found.count:
        audit.record(store, "api.refused", ", ".join(sorted(found.requests)), actor=key[1], source=key[0],
                     repeated=found.count, window_s=REFUSALS_WINDOW_S)


def _route(request: Request) -> str:
    route = request.scope.get("route")
    return f"{request.method} {getattr(route, 'path', None) or request.url.path[:200]}"


class JsonLines(PlainTextResponse):
    media_type = "application/x-ndjson"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ApiKeyRequest(_Strict):
    name: str
    models: list[str] = Field(default_factory=lambda: [auth.ALL_MODELS])


class ImportOptions(_Strict):
    """How to read a dataset and what to call it; the file itself comes as the body or from daemon.import_dir."""

    name: str = Field(pattern=datasets.NAME.pattern, description="the dataset's name; new content becomes its next version")
    task: Literal["text-classification", "image-classification"] = datasets.TEXT
    text_column: str = Field("text", min_length=1, max_length=200, description="CSV column or JSON field of the text")
    label_column: str = Field("label", min_length=1, max_length=200, description="... and of the label")
    validation_fraction: float = Field(0.2, gt=0, lt=1)
    seed: int = Field(13, ge=0, le=2**32 - 1)
    residency: Literal["local-only", "burst-allowed"] = Field(
        datasets.LOCAL_ONLY, description="local-only, or burst-allowed: may go (encrypted) to the Ray cluster")


class UploadOptions(ImportOptions):
    filename: str = Field(min_length=1, max_length=255, description=(
        "the file's name: .csv or .jsonl for texts; an image folder is sent as an uncompressed .tar of its class"
        " folders"))


class ImportDirRequest(ImportOptions):
    file: str = Field(min_length=1, max_length=255, description=(
        "a file or folder inside daemon.import_dir, by its name relative to that folder; links are refused"))


class ResidencyRequest(_Strict):
    residency: str = Field(description="local-only | burst-allowed")


class ErasureRequest(_Strict):
    subject: str = Field(min_length=1, description="the identifier (email address, customer id); never logged")
    dry_run: bool = Field(False, description="list what would be erased, change nothing")


class PredictRequest(_Strict):
    texts: list[str] = Field(min_length=1, description="texts to classify with the model as it serves now")


class Label(_Strict):
    prediction_id: str
    label: str


class FeedbackRequest(_Strict):
    feedback: list[Label] = Field(min_length=1, description="true labels for predictions the server answered")
    source: str = Field("api", max_length=200, description="where the labels come from, e.g. the file's name")


class DeployRequest(_Strict):
    version: int | None = Field(None, ge=1, description="default: the newest version")
    canary_percent: float | None = Field(None, gt=0, le=100)


def _caller(role: str) -> Callable[..., users.User]:
    """A dependency: the user behind the request's token, if their role is at least `role`."""

    def check(request: Request,
              authorization: Annotated[str | None, Header(include_in_schema=False)] = None) -> users.User:
        token = authorization.removeprefix("Bearer ").strip() if authorization else None
        shared: SharedStore = request.app.state.shared
        user: users.User | None = None
        with shared.use() as store:
            try:
                user = users.authenticate(store, token)
                users.require(user, role)
            except AuthError as exc:
                shared.note_refusal(store, _actor(user) if user else "anonymous", _source(request), request,
                                    exc.message)
                raise
            if request.method == "GET":
                shared.note_read(store, user, request)
        return user

    return check


def _since(since: Annotated[str | None, Query(max_length=40, description=(
        "a date or time (2026-11-01, 2026-11-01T08:00; UTC unless it says) or an age (30m, 12h, 7d)"))] = None,
) -> datetime | None:
    try:
        return audit.parse_since(since) if since else None
    except ValueError as exc:
        raise BadRequest(str(exc), hint="give since as 2026-11-01, 2026-11-01T08:00, 30m, 12h or 7d") from exc


Since = Annotated[datetime | None, Depends(_since)]
Viewer = Annotated[users.User, Depends(_caller("viewer"))]
Operator = Annotated[users.User, Depends(_caller("operator"))]
Admin = Annotated[users.User, Depends(_caller("admin"))]


def create_app(shared: SharedStore, status: Callable[[], dict[str, Any]], runtime: Runtime | None = None) -> FastAPI:
    """The ASGI app; `status` gives the daemon's own view (pid, servers, the running job), `runtime` what serves."""
    app = FastAPI(title="appliance control", version=metadata.version("appliance"), docs_url=None, redoc_url=None,
                  openapi_url=None)
    settings = shared.store.settings
    upload_limit = int(settings.daemon.max_upload_mb * 2**20)
    app.add_middleware(BodyLimit, limit=lambda scope: upload_limit if scope["path"] == UPLOAD_PATH else MAX_JSON_BYTES,
                       hint=f"a dataset may be up to daemon.max_upload_mb ({settings.daemon.max_upload_mb:g} MiB);"
                            " any other request at most 1 MiB")
    traffic = TrafficWindow(runtime.metrics if runtime else Metrics())
    hardware_report: dict[str, Any] = {}
    system.load(settings.state_dir)  # primes the CPU share, which is measured between calls

    app.state.shared = shared
    document_errors(app, security={"userToken": {"type": "http", "scheme": "bearer"}}, open_paths=("/v1/health",),
                    errors=_ERRORS)

    @app.get("/v1/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/openapi.json", include_in_schema=False)
    def openapi(_user: Viewer) -> JSONResponse:
        """The API's description, for any signed-in user: only health is open to all."""
        return JSONResponse(app.openapi())

    @app.get("/v1/status")
    def daemon_status(_user: Viewer) -> dict[str, Any]:
        """The daemon, its jobs, how busy the box is, whether serving is ready, the last audit check."""
        with shared.use() as store:
            counts = dict(store.db.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status").fetchall())
            checked = audit.last_check(store)
            last_event = events.last_seq(store)
        return {**status(), "version": metadata.version("appliance"), "jobs": counts, "last_event": last_event,
                "load": asdict(system.load(settings.state_dir)), "serving_ready": bool(runtime and runtime.ready),
                "audit_check": checked}

    @app.get("/v1/hardware")
    def hardware(_user: Viewer) -> dict[str, Any]:
        """What `appliance hw --json` says: the hardware, the default base model, and the training plan."""
        if not hardware_report:
            hardware_report.update(_detect_hardware(settings))
        return hardware_report

    @app.get("/v1/jobs")
    def list_jobs(_user: Viewer, status: str | None = None) -> list[dict[str, Any]]:
        with shared.use() as store:
            return [asdict(job) for job in jobs.list_jobs(store, status)]

    @app.post("/v1/jobs", status_code=201)
    def submit(body: JobRequest, user: Operator) -> dict[str, Any]:
        with shared.use() as store:
            return asdict(jobs.submit(store, body.spec, body.priority, actor=_actor(user)))

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
            return [version.summary() for version in datasets.list_versions(store)]

    @app.post(UPLOAD_PATH, status_code=201, openapi_extra=_UPLOAD_BODY)
    async def upload_dataset(
        request: Request, user: Operator, options: Annotated[UploadOptions, Query()]
    ) -> dict[str, Any]:
        """Check and store the file in the body (a folder of images as a tar); an unchanged file answers with
        the version it already is. The daemon reads nothing but the bytes sent."""
        data = bytearray()
        async for chunk in request.stream():  # BodyLimit stops it at daemon.max_upload_mb
            data += chunk
        source = sources.Upload(options.filename, bytes(data), folder=options.task == datasets.IMAGE)
        return await asyncio.to_thread(_import, shared, source, options, user)

    @app.post("/v1/datasets/import-dir", status_code=201)
    def import_from_dir(body: ImportDirRequest, user: Operator) -> dict[str, Any]:
        """Check and store a file or folder that root put in daemon.import_dir, named relative to it."""
        return _import(shared, sources.ImportDir(settings, body.file), body, user)

    @app.get("/v1/runs")
    def list_runs(_user: Viewer) -> list[dict[str, Any]]:
        with shared.use() as store:
            return [asdict(run) for run in runs.list_runs(store)]

    @app.get("/v1/runs/{run_id}")
    def get_run(run_id: str, _user: Viewer) -> dict[str, Any]:
        """A training run and its epochs so far: loss and validation metrics, for charts."""
        with shared.use() as store:
            run = runs.get(store, run_id)
            return {**asdict(run), "epochs": [asdict(epoch) for epoch in runs.epochs(store, run.id)]}

    @app.get("/v1/studies")
    def list_studies(_user: Viewer) -> list[dict[str, Any]]:
        """Every hyperparameter search, oldest first, with how many trials it ran and its best value."""
        with shared.use() as store:
            return [_study_summary(record, studies.trials(store, record.id)) for record in studies.list_studies(store)]

    @app.get("/v1/studies/{study_id}")
    def get_study(study_id: str, _user: Viewer) -> dict[str, Any]:
        """What `appliance tune show --json` gives: the search, its trials best first with their curves, importances."""
        with shared.use() as store:
            return studies.describe(store, study_id)

    @app.post("/v1/datasets/{ref}/residency")
    def set_residency(ref: str, body: ResidencyRequest, user: Operator) -> list[dict[str, Any]]:
        """Whether a dataset (every version of a name, or name:version) may leave this box for a burst."""
        with shared.use() as store:
            return [asdict(version) for version in datasets.set_residency(store, ref, body.residency,
                                                                           actor=_actor(user))]

    @app.post("/v1/privacy/erase")
    def erase_subject(body: ErasureRequest, user: Admin) -> dict[str, Any]:
        """A data subject request (admin): what holds the identifier, or erase it everywhere, audited."""
        with shared.use() as store:
            found = privacy.find(store, body.subject) if body.dry_run else privacy.erase(store, body.subject,
                                                                                         actor=_actor(user))
        return found.summary()

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

    @app.get("/v1/serving")
    async def serving(_user: Viewer) -> dict[str, Any]:
        """What serves, with requests/s, error rate and latency over the last minute, and drift per version."""
        served_now = _serving(runtime).describe()
        seconds, stats = traffic.summary()
        live = {(entry["model"], entry["version"]): entry["windows"]["24h"]
                for entry in await asyncio.to_thread(_quality, shared)}
        models = []
        for served in served_now:
            name = served["model"]
            for version in served["versions"]:
                version.update(stats.get((name, str(version["version"])), _NO_TRAFFIC))
                version["feedback"] = live.get((name, version["version"]))
            models.append({**served, **stats.get((name, "all"), _NO_TRAFFIC), "endpoints": {
                "predict": f"{settings.inference_url}/v1/models/{name}:predict",
                "infer": f"{settings.inference_url}/v2/models/{name}/infer"}})
        return {"inference_url": settings.inference_url, "ready": _serving(runtime).ready, "window_s": seconds,
                "models": models}

    @app.post("/v1/models/{model}/predict")
    async def try_prediction(model: str, body: PredictRequest, user: Viewer) -> dict[str, Any]:
        """Classify texts with the model as it serves (counted like any request); for trying it out."""
        loaded, probabilities, ids = await _serving(runtime).predict(model, body.texts, _actor(user))
        return {"model": model, "version": loaded.version, "variant": loaded.variant,
                "predictions": label_scores(loaded.labels, probabilities, ids)}

    @app.post("/v1/feedback")
    async def post_feedback(body: FeedbackRequest, user: Operator) -> dict[str, Any]:
        """True labels for predictions of any model (what `appliance feedback import` sends)."""
        return await _serving(runtime).record_feedback(
            [(item.prediction_id, item.label) for item in body.feedback], _actor(user), source=body.source)

    @app.get("/v1/quality")
    def quality(_user: Viewer, model: str | None = None) -> list[dict[str, Any]]:
        """Live accuracy on feedback by model version over the last hour, day and week, and the labels not yet
        trained on."""
        with shared.use() as store:
            found = feedback.quality(store, model)
            for entry in found:
                entry["unused_labels"] = feedback.unused(store, entry["model"])
        return found

    @app.get("/v1/usage")
    def usage_report(
        _user: Viewer, since: Since, by: Literal["user", "model"] | None = None,
    ) -> list[dict[str, Any]]:
        """Usage by day (and user and model, or by=user|model): job CPU/GPU hours, inference requests and hours."""
        with shared.use() as store:
            return usage.report(store, since.date() if since else None, by)

    @app.get("/v1/audit")
    def audit_records(
        _user: Viewer, since: Since, actor: str | None = None, action: str | None = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
    ) -> list[dict[str, Any]]:
        """Records, oldest first (the newest `limit`); action a glob such as 'keys.*'."""
        with shared.use() as store:
            found = audit.rows(store, since=since, actor=actor or None, action=action or None, limit=limit)
        return [{**row, "details": json.loads(row["details"])} for row in found]

    @app.post("/v1/audit/verify")
    def verify_audit(user: Viewer) -> dict[str, Any]:
        """Walk the whole chain and its anchored head now; the check itself goes on the record."""
        with shared.use() as store:
            return asdict(audit.check(store, actor=_actor(user)))

    @app.get("/v1/audit/export", response_class=JsonLines)
    def export_audit(user: Admin) -> JsonLines:
        """Every record as JSON lines, for archiving elsewhere; the export is recorded."""
        with shared.use() as store:
            lines = list(audit.export_jsonl(store))
            audit.record(store, "audit.export", "api", actor=_actor(user), format="jsonl", records=len(lines))
        return JsonLines("".join(line + "\n" for line in lines))

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
            while not shared.closing.is_set():
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

    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]

    @app.exception_handler(UnicodeEncodeError)
    async def not_unicode(_request: Request, _exc: UnicodeEncodeError) -> JSONResponse:
        """A lone surrogate (valid JSON, invalid text) met the database or a file: the caller's input, a 400."""
        return json_error(400, "the request holds text that is not valid Unicode (a lone surrogate such as \\ud800)",
                          "send text as UTF-8; nothing was changed")

    return app


def _import(shared: SharedStore, source: sources.Source, options: ImportOptions, user: users.User) -> dict[str, Any]:
    fields = options.model_dump(exclude={"filename", "file"})
    with shared.use() as store:
        known = {version.id for version in datasets.list_versions(store)}
        version = datasets.import_data(store, source, **fields, actor=_actor(user))
    return {**version.summary(), "unchanged": version.id in known}


_ERRORS = {"400": "the request is not valid: what, where and how to fix it",
           "401": "no user token, or one that is unknown or revoked",
           "403": "the user's role may not do this",
           "404": "no such job, run, search, dataset or model",
           "413": "the body is over its limit",
           "503": "the daemon cannot do this now (no inference server, the audit log diverged)"}

_UPLOAD_BODY = {"requestBody": {"required": True, "content": {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}


def _quality(shared: SharedStore) -> list[dict[str, Any]]:
    with shared.use() as store:
        return feedback.quality(store)


def _source(request: Request) -> str:
    """Where a call came from: an address over TCP; over the unix socket, the socket (its group is the gate)."""
    return request.client.host if request.client and request.client.host else "local socket"


def _actor(user: users.User) -> str:
    return f"user:{user.name}"


def _study_summary(record: studies.Study, trials: list[studies.Trial]) -> dict[str, Any]:
    best = next((trial.value for trial in trials if trial.run_id == record.best_run_id and trial.state == "complete"),
                None)
    return {**asdict(record), "trials": len(trials), "pruned": sum(trial.state == "pruned" for trial in trials),
            "best_value": best}


_NO_TRAFFIC = {"requests": 0, "requests_per_s": None, "error_rate": None, "p50_ms": None, "p99_ms": None}


def _serving(runtime: Runtime | None) -> Runtime:
    if runtime is None:
        raise DaemonError("this control API runs without an inference server", hint="'appliance daemon' runs both")
    return runtime


def _detect_hardware(settings: config.Settings) -> dict[str, Any]:
    """`appliance hw --json` in a child process: detection loads torch and CUDA, kept out of the daemon's memory."""
    command = [sys.executable, "-m", "appliance", "hw", "--json"]
    if settings.config_file is not None:
        command[3:3] = ["--config", str(settings.config_file)]
    try:
        answer = subprocess.run(command, capture_output=True, text=True, timeout=HARDWARE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise DaemonError(f"hardware detection did not finish within {HARDWARE_TIMEOUT_S:.0f} s",
                          hint="run 'appliance hw' to see where it hangs") from exc
    if answer.returncode != 0:
        last = (answer.stderr.strip().splitlines() or ["no output"])[-2:]
        raise DaemonError(f"hardware detection failed: {' '.join(last)}", hint="run 'appliance hw' for the details")
    return json.loads(answer.stdout)
