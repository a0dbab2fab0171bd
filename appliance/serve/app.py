"""The HTTP API: Open Inference Protocol paths, a plain JSON text endpoint, metrics, health.

Every endpoint but health needs an API key (`Authorization: Bearer apl_...` or
`X-API-Key`), scoped per model. Every error is JSON `{"error": ..., "hint": ...}` with
the status that says whose fault it is; a bad request changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from importlib import metadata
from typing import Annotated, Any, Literal

import uvicorn
from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictStr
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from appliance import auth
from appliance.config import ServeSettings, Settings
from appliance.errors import ApplianceError, BadRequest
from appliance.serve import metrics as serve_metrics
from appliance.serve import tls
from appliance.serve.runtime import Runtime

log = logging.getLogger(__name__)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InferInput(_Strict):
    name: str
    shape: list[int]
    datatype: Literal["BYTES"]
    data: list[StrictStr]
    parameters: dict[str, Any] | None = None


class RequestedOutput(_Strict):
    name: Literal["label", "probabilities"]
    parameters: dict[str, Any] | None = None


class InferRequest(_Strict):
    """Open Inference Protocol request: one BYTES input of texts."""

    id: str | None = None
    inputs: list[InferInput] = Field(min_length=1, max_length=1)
    outputs: list[RequestedOutput] | None = None
    parameters: dict[str, Any] | None = None


class PredictRequest(_Strict):
    """The plain endpoint: texts in, a label and scores per text out."""

    instances: list[StrictStr]


class Label(_Strict):
    prediction_id: StrictStr
    label: StrictStr


class FeedbackRequest(_Strict):
    """True labels for earlier answers, by the prediction ids the server gave."""

    feedback: list[Label] = Field(min_length=1)


def _token(authorization: str | None, x_api_key: str | None) -> str | None:
    if x_api_key:
        return x_api_key
    return authorization[7:] if authorization and authorization.startswith("Bearer ") else None


async def _model_key(
    request: Request, name: str, authorization: Annotated[str | None, Header()] = None,
    x_api_key: Annotated[str | None, Header()] = None,
) -> auth.ApiKey:
    """The request's key, allowed to call the model in its path; checked before the body is read.

    async, so FastAPI calls it on the event loop: the check is an in-memory HMAC, not worth a thread hop.
    """
    return request.app.state.runtime.authorize(_token(authorization, x_api_key), name)


async def _any_model_key(
    request: Request, authorization: Annotated[str | None, Header()] = None,
    x_api_key: Annotated[str | None, Header()] = None,
) -> auth.ApiKey:
    return request.app.state.runtime.authorize(_token(authorization, x_api_key), None)


ModelKey = Annotated[auth.ApiKey, Depends(_model_key)]
AnyModelKey = Annotated[auth.ApiKey, Depends(_any_model_key)]


def create_app(settings: Settings, runtime: Runtime) -> FastAPI:
    """The ASGI app; the runtime loads models in the background, so health answers at once."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        loading = asyncio.get_running_loop().create_task(runtime.start())
        loading.add_done_callback(_report_start_failure)
        yield
        loading.cancel()
        await runtime.stop()

    app = FastAPI(title="appliance inference", version=metadata.version("appliance"), lifespan=lifespan,
                  docs_url=None, redoc_url=None)  # the docs pages load scripts from a CDN; the box is offline
    app.add_middleware(_BodyLimit, limit=settings.serve.max_body_bytes)
    metrics = runtime.metrics

    app.state.runtime = runtime
    @app.get("/v2/health/live")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready() -> JSONResponse:
        return JSONResponse({"ready": runtime.ready}, status_code=200 if runtime.ready else 503)

    @app.get("/v2")
    async def server_metadata(_key: AnyModelKey) -> dict[str, Any]:
        return {"name": "appliance", "version": metadata.version("appliance"), "extensions": []}

    @app.get("/v2/models/{name}")
    async def model_metadata(name: str, _key: ModelKey) -> dict[str, Any]:
        route = runtime.route(name)
        labels = route.production.labels
        return {
            "name": name,
            "versions": [str(loaded.version) for loaded in route.versions()],
            "platform": "openvino",
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "label", "datatype": "BYTES", "shape": [-1]},
                        {"name": "probabilities", "datatype": "FP32", "shape": [-1, len(labels)]}],
            "parameters": {"labels": labels, "canary_percent": route.canary_percent},
        }

    @app.get("/v2/models/{name}/ready")
    async def model_ready(name: str, _key: ModelKey) -> JSONResponse:
        ok = runtime.model_ready(name)
        return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)

    # The two inference endpoints answer with a JSONResponse: a returned dict would be validated and encoded
    # again through a response model on every request, which costs more CPU than the HTTP parsing.
    @app.post("/v2/models/{name}/infer", response_class=JSONResponse)
    async def infer(name: str, key: ModelKey, body: InferRequest) -> JSONResponse:
        texts = body.inputs[0].data
        if body.inputs[0].shape not in ([len(texts)], [len(texts), 1]):
            raise BadRequest(f"input 'text' has shape {body.inputs[0].shape} but holds {len(texts)} texts",
                             hint=f"give shape [{len(texts)}]")
        loaded, probabilities, ids = await runtime.predict(name, texts, f"key:{key.name}")
        wanted = {output.name for output in body.outputs} if body.outputs else {"label", "probabilities"}
        outputs = []
        if "label" in wanted:
            labels = [loaded.labels[i] for i in probabilities.argmax(axis=1)]
            outputs.append({"name": "label", "datatype": "BYTES", "shape": [len(texts)], "data": labels})
        if "probabilities" in wanted:
            outputs.append({"name": "probabilities", "datatype": "FP32", "shape": list(probabilities.shape),
                            "data": probabilities.ravel().round(6).tolist()})
        answer = {"model_name": name, "model_version": str(loaded.version), "outputs": outputs,
                  "parameters": {"prediction_ids": [prediction_id or None for prediction_id in ids]}}
        return JSONResponse(answer | ({"id": body.id} if body.id is not None else {}))

    @app.post("/v1/models/{name}:predict", response_class=JSONResponse)
    async def predict(name: str, key: ModelKey, body: PredictRequest) -> JSONResponse:
        loaded, probabilities, ids = await runtime.predict(name, body.instances, f"key:{key.name}")
        return JSONResponse({"model": name, "model_version": str(loaded.version),
                             "predictions": label_scores(loaded.labels, probabilities, ids)})

    @app.post("/v1/feedback")
    async def post_feedback(key: AnyModelKey, body: FeedbackRequest) -> dict[str, Any]:
        """True labels for earlier predictions; the key must be allowed to call each prediction's model."""
        return await runtime.record_feedback([(item.prediction_id, item.label) for item in body.feedback],
                                             f"apikey:{key.id}", key.may_call)

    @app.get("/metrics")
    async def metrics_endpoint(_key: AnyModelKey) -> Response:
        for served in runtime.describe():
            for version in served["versions"]:
                labels = (served["model"], str(version["version"]))
                metrics.traffic.labels(*labels).set(version["traffic_share"])
                metrics.queue_depth.labels(*labels).set(version["queue_depth"])
        return Response(metrics.exposition(), media_type=serve_metrics.CONTENT_TYPE)

    def refused(request: Request, status: int) -> None:
        metrics.request(request.path_params.get("name", ""), None, status)

    @app.exception_handler(ApplianceError)
    async def appliance_error(request: Request, exc: ApplianceError) -> JSONResponse:
        status = getattr(exc, "status", 400)
        if not getattr(exc, "counted", False):  # the runtime counted a version's failure itself
            refused(request, status)
        headers = {"Retry-After": "1"} if status == 503 else None
        if status in (401, 403):
            headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return json_error(status, exc.message, exc.hint, headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        refused(request, 400)
        problems = "; ".join(describe_error(error) for error in exc.errors()[:5])
        json_sent = request.headers.get("content-type", "").startswith("application/json")
        hint = "see the OpenAPI document at /openapi.json" if json_sent else "send Content-Type: application/json"
        return json_error(400, f"the request body is not valid: {problems}", hint)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        refused(request, exc.status_code)
        return json_error(exc.status_code, str(exc.detail), None, getattr(exc, "headers", None))

    return app


def hardened_options(serve: ServeSettings) -> dict[str, Any]:
    """The uvicorn options that bound what one client can hold, for every server of the appliance that faces one:
    the time to send a request's head and its body, idle keep-alive, and connections at once."""
    protocol = type("TimedHttp", (_TimedHttp,), {"header_timeout_s": serve.header_timeout_s,
                                                 "body_timeout_s": serve.body_timeout_s})
    # uvicorn counts the connection asking among the open ones, so one more lets max_connections be served.
    return {"http": protocol, "limit_concurrency": serve.max_connections + 1,
            "timeout_keep_alive": min(5.0, serve.header_timeout_s)}


def server_config(settings: Settings, runtime: Runtime) -> uvicorn.Config:
    """How uvicorn serves the app: address, TLS (a self-signed pair when none is given), limits, graceful stop."""
    serve = settings.serve
    tls_files = tls.uvicorn_options(settings) if serve.tls else {}
    return uvicorn.Config(create_app(settings, runtime), host=serve.host, port=serve.port, log_level="warning",
                          access_log=False, log_config=None, timeout_graceful_shutdown=10,
                          **hardened_options(serve), **tls_files)


class _TimedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol with the two timeouts it lacks.

    The head timer runs from when a connection opens, or from the end of the previous answer on a kept-alive one,
    until a request's headers are complete: a client that sends nothing, or half a head, is cut off. The body
    timer runs from the end of the head until the body is complete: a body still missing then gets 408 and the
    connection is closed (closed alone, when the app has answered already). Set the two class attributes in a
    subclass (`hardened_options` does).
    """

    header_timeout_s: float
    body_timeout_s: float
    _head_timer: asyncio.TimerHandle | None = None
    _body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().on_headers_complete()
        if self.cycle is not None and not any(cycle is self.cycle for cycle, _ in self.pipeline):  # it runs now
            self._await_body(self.cycle)

    def on_message_complete(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        started = self.pipeline[-1][0] if self.pipeline else None  # the queued request this answer lets run
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if started is not None:
            self._await_body(started)
        else:
            self._await_head()

    def _await_head(self) -> None:
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_late)

    def _await_body(self, cycle: RequestResponseCycle) -> None:
        if cycle.more_body:
            self._body_timer = self.loop.call_later(self.body_timeout_s, self._body_late, cycle)

    def _head_late(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def _body_late(self, cycle: RequestResponseCycle) -> None:
        if self.transport.is_closing():
            return
        if not cycle.response_started:
            cycle.disconnected = True  # the app's own answer, if one comes, is dropped; its body read ends
            self.transport.write(_LATE_BODY)
        self.transport.close()


def _raw_answer(status: int, reason: str, body: dict[str, str]) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, written by the protocol rather than the app."""
    content = json.dumps(body).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(content)}\r\n"
            "connection: close\r\n\r\n")
    return head.encode() + content


_LATE_BODY = _raw_answer(408, "Request Timeout", {"error": "the request body did not arrive in time",
                                                  "hint": "send the whole body without pausing"})


def _report_start_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        error = task.exception()
        message = error.message if isinstance(error, ApplianceError) else repr(error)
        log.error("the server could not open the store, so it stays unready: %s", message)


def label_scores(labels: list[str], probabilities: Any, ids: list[str]) -> list[dict[str, Any]]:
    """Per text: its prediction id, the most likely label and every label's probability."""
    return [{"id": prediction_id or None, "label": labels[int(row.argmax())],
             "scores": {label: round(float(p), 6) for label, p in zip(labels, row)}}
            for prediction_id, row in zip(ids, probabilities, strict=True)]


def describe_error(error: dict[str, Any]) -> str:
    where = ".".join(str(part) for part in error.get("loc", ()) if part != "body") or "body"
    return f"{where}: {error.get('msg', 'invalid')}"


def json_error(status: int, message: str, hint: str | None, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": message} | ({"hint": hint} if hint else {})
    return JSONResponse(body, status_code=status, headers=headers)


class _BodyLimit:
    """413 for a body over the limit, by Content-Length or by counting a streamed body."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._too_large(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._too_large(scope, receive, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = json_error(413, f"the request body is over the limit of {self.limit} bytes",
                          "send fewer or shorter texts per request")
        await response(scope, receive, send)


class _TooLarge(Exception):
    """A streamed body passed the limit."""
