"""The control API: what the CLI and the TUI ask the daemon, over a local socket.

Every call but /v1/health carries a user token (`Authorization: Bearer apu_...`) and
is checked against the role it needs: viewer reads, operator changes data, jobs and
deployments, admin manages users. Changes are audited by the operations they call,
with the user as actor; a refused call is audited too (who, what, why), so probing
leaves a trace. Reads are audited as `api.read` once per user and endpoint every ten
minutes: who looked at what stays on record, and a TUI polling every second does not
bury the log. Errors are the JSON bodies of `appliance.serve.web`, never a traceback.

One router per resource, in the modules beside this one; what the handlers share (the
store, the caller, the inference runtime) comes from `deps`, which reads the app's state.
Handlers are plain functions run in FastAPI's thread pool; they share the daemon's
one Store, one at a time (SQLite connections are not for concurrent use). The serving
endpoints are async instead: they read the inference server's runtime, which lives on
the daemon's event loop, and never touch the store.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import metadata
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import Scope

from appliance.core import system
from appliance.core.errors import BadRequest
from appliance.daemon.api import (
    alerts,
    audit,
    datasets,
    events,
    health,
    jobs,
    models,
    privacy,
    serving,
    usage,
    users,
)
from appliance.daemon.api.deps import Authenticated, SharedStore
from appliance.serve.metrics import Metrics, TrafficWindow
from appliance.serve.rates import KeyRates
from appliance.serve.runtime import Runtime
from appliance.serve.web import EXCEPTION_HANDLERS, BodyLimit, document_errors, error_answers, error_response

MAX_JSON_BYTES = 1 << 20  # every body but an upload
UPLOAD_BODY_TIMEOUT_S = 3600.0  # an upload of daemon.max_upload_mb may take a while to arrive; heads are as quick
UPLOAD_PATHS = (datasets.UPLOAD_PATH, models.UPLOAD_PATH)  # a dataset's, a model's
TRY_PATH = re.compile(r"/v1/models/(?P<model>[^/]+)/predict")  # tried on an image model, it may hold photos
_ROUTERS = (health.router, events.router, jobs.router, datasets.router, models.router, serving.router, alerts.router,
            audit.router, users.router, usage.router, privacy.router)
_ERRORS = error_answers({
    400: "the request is not valid: what, where and how to fix it",
    401: "no user token, or one that is unknown or revoked",
    403: "the user's role may not do this",
    404: "no such job, run, search, dataset, model or alert",
    413: "the body is over its limit",
    429: "too much at once from one user (predictions tried over an API key's rate, event streams); see Retry-After",
    503: "the daemon cannot do this now (no inference server, the audit log diverged, another upload is being "
         "taken in)",
})
_TOKEN = {"userToken": {"type": "http", "scheme": "bearer"}}
_OPEN_PATHS = {route.path for route in health.open_router.routes}


def create_app(shared: SharedStore, status: Callable[[], dict[str, Any]], runtime: Runtime | None = None) -> FastAPI:
    """The ASGI app; `status` gives the daemon's own view (pid, servers, the running job), `runtime` what serves."""
    app = FastAPI(title="appliance control", version=metadata.version("appliance"), docs_url=None, redoc_url=None,
                  openapi_url=None, exception_handlers={**EXCEPTION_HANDLERS, UnicodeEncodeError: _not_unicode})
    settings = shared.store.settings
    upload_limit = int(settings.daemon.max_upload_mb * 2**20)

    def limit(scope: Scope) -> int:
        if scope["path"] in UPLOAD_PATHS:
            return upload_limit
        tried = TRY_PATH.fullmatch(scope["path"])
        if tried and runtime is not None and runtime.takes_images(tried["model"]):
            return settings.serve.max_image_body_bytes
        return MAX_JSON_BYTES

    app.add_middleware(BodyLimit, limit=limit,
                       hint=f"a dataset or a model may be up to daemon.max_upload_mb"
                            f" ({settings.daemon.max_upload_mb:g} MiB), a prediction to try on an image model as much"
                            f" as the inference server takes (serve.max_image_body_bytes); any other request at most"
                            f" 1 MiB")
    app.add_middleware(Authenticated, shared=shared, open_paths=_OPEN_PATHS)  # outermost: before any body is read
    system.load(settings.state_dir)  # primes the CPU share, which is measured between calls
    app.state.shared, app.state.status, app.state.runtime = shared, status, runtime
    app.state.traffic = TrafficWindow(runtime.metrics if runtime else Metrics())
    app.state.user_rates = KeyRates(settings.serve.rate_limit_per_s, settings.serve.rate_limit_burst)  # to try models
    app.state.hardware = {}  # detected on the first ask
    app.include_router(health.open_router)
    for router in _ROUTERS:
        app.include_router(router, responses=_ERRORS)
    document_errors(app, amend=_secured)
    return app


def _secured(document: dict[str, Any]) -> None:
    """Every operation but health takes a user token, which deps reads from the Authorization header itself."""
    document["components"]["securitySchemes"] = _TOKEN
    for path, operations in document["paths"].items():
        for operation in operations.values():
            if path not in _OPEN_PATHS:
                operation["security"] = [{name: []} for name in _TOKEN]


async def _not_unicode(_request: Request, _exc: UnicodeEncodeError) -> JSONResponse:
    """A lone surrogate (valid JSON, invalid text) met the database or a file: the caller's input, a 400."""
    return error_response(BadRequest("the request holds text that is not valid Unicode (a lone surrogate such as"
                                     " \\ud800)", hint="send text as UTF-8; nothing was changed"))
