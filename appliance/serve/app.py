"""The HTTP API: Open Inference Protocol paths (what they ask and answer is `oip`'s), a plain JSON text endpoint,
metrics, health; and, in its lifespan, the gRPC server when serve.grpc_port asks for one (`grpc_api`).

Every endpoint but health needs an API key (`Authorization: Bearer apl_...` or
`X-API-Key`), scoped per model; the key is checked, and the key's rate admitted, before
the body is read. Every error is a JSON body of `appliance.serve.web` (type, error, hint) with
the status that says whose fault it is; a bad request changes nothing. The OpenAPI
document at /openapi.json (for key holders) states the keys, the limits and every status
a route can answer, for clients and fuzzers to hold the server to; the one rule JSON
Schema cannot state is that an OIP input's shape must match its data.

What one client can hold is bounded: its key's texts per second (429), the time it may
take to send a request's head and body (the connection is closed, or 408), and
connections at once (503); see `hardened_options`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from importlib import metadata
from typing import Annotated, Any, TypeVar

import uvicorn
from fastapi import Depends, FastAPI, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field, StrictStr, ValidationError, ValidatorFunctionWrapHandler, WrapValidator
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Scope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from appliance.access import auth
from appliance.core.config import ServeSettings, Settings
from appliance.core.errors import ApplianceError, BadRequest, Forbidden, RequestTimeout
from appliance.serve import grpc_api, lean, oip, tls
from appliance.serve import metrics as serve_metrics
from appliance.serve.access import AccessLog
from appliance.serve.rates import KeyRates
from appliance.serve.runtime import Answer, Runtime
from appliance.serve.web import (
    EXCEPTION_HANDLERS,
    Body,
    BodyLimit,
    Handler,
    Text,
    document_errors,
    error_answers,
    error_body,
    parse_json,
)

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)




class EncodedImage(Body):
    """An image file as saved (JPEG, PNG, WebP, BMP, TIFF), base64-encoded."""

    b64: StrictStr


def _one_instance(value: Any, handler: ValidatorFunctionWrapHandler) -> str | EncodedImage:
    """One error for an instance that is neither kind, instead of one per kind."""
    try:
        return handler(value)
    except ValidationError:
        raise PydanticCustomError("instance", 'Input should be a text (a string) or an image ({"b64": ...})'
                                  ) from None


class PredictRequest(Body):
    """The plain endpoint: texts (or, for an image model, images) in, a label and scores per example out."""

    instances: list[Annotated[StrictStr | EncodedImage, WrapValidator(_one_instance)]]


class Label(Body):
    prediction_id: Text
    label: Text


class FeedbackRequest(Body):
    """True labels for earlier answers, by the prediction ids the server gave (the control API's body adds a
    source)."""

    feedback: list[Label] = Field(min_length=1, description="true labels for predictions the server answered")


# -- keys and rates ----------------------------------------------------------------------


_API_KEY = APIKeyHeader(name="X-API-Key", scheme_name="ApiKey", auto_error=False,
                        description="an API key, apl_...: 'appliance api-keys create NAME'")
_BEARER = HTTPBearer(scheme_name="Bearer", auto_error=False, description="the same API key as a bearer token")
ApiKeyHeader = Annotated[str | None, Security(_API_KEY)]
BearerHeader = Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)]


def _token(api_key: str | None, bearer: HTTPAuthorizationCredentials | None) -> str | None:
    return api_key or (bearer.credentials if bearer else None)


async def _token_of(request: Request) -> str | None:
    """The key a request carries, read by the same schemes as the routes' dependencies (for `lean` routes)."""
    return _token(await _API_KEY(request), await _BEARER(request))


async def _model_key(request: Request, name: str, api_key: ApiKeyHeader, bearer: BearerHeader) -> auth.ApiKey:
    """The request's key, allowed to call the model in its path.

    async, so FastAPI calls it on the event loop: the check is an in-memory HMAC, not worth a thread hop.
    """
    return request.app.state.runtime.authorize(_token(api_key, bearer), name)


async def _any_key(request: Request, api_key: ApiKeyHeader, bearer: BearerHeader) -> auth.ApiKey:
    return request.app.state.runtime.authorize(_token(api_key, bearer), None)


async def _all_models_key(key: Annotated[auth.ApiKey, Depends(_any_key)]) -> auth.ApiKey:
    """A key allowed every model: the metrics name every model and the traffic each gets."""
    if auth.ALL_MODELS not in key.models:
        raise Forbidden(f"API key {key.id} ({key.name}) may call only {', '.join(key.models)}, so it may not read"
                        " the metrics of every model", hint="use a key allowed every model"
                                                             " ('appliance api-keys create NAME' without --model)")
    return key


ModelKey = Annotated[auth.ApiKey, Depends(_model_key)]
AnyKey = Annotated[auth.ApiKey, Depends(_any_key)]
AllModelsKey = Annotated[auth.ApiKey, Depends(_all_models_key)]


# -- the app -------------------------------------------------------------------------------


_STATUS = {
    400: "the request is malformed or out of bounds; nothing was done",
    401: "no API key, or one that is malformed, unknown or revoked",
    403: "the key may not do this",
    404: "no model of that name is being served (or no such prediction)",
    408: "the request body did not arrive in time",
    413: "the body, or one of its texts, is over its limit",
    429: "the key sent more texts than its rate; retry after Retry-After seconds",
    503: "too many texts queued, or the model failed; retry after Retry-After seconds",
}
_CROWDED = "past serve.max_connections, uvicorn answers any request with a plain-text 503"


class Readiness(BaseModel):
    """Whether the server, or one model (then named), serves what it should."""

    ready: bool
    name: str | SkipJsonSchema[None] = None


def _answers(*statuses: int, unready: bool = False) -> dict[int | str, dict[str, Any]]:
    """The error answers a route documents, each with the JSON error body (and a readiness answer, when unready says
    the route tells whether something is ready: a 400, as the protocol has it); and on every route the plain-text
    503 of too many connections."""
    answers = error_answers({status: _STATUS[status] for status in statuses})
    if unready:
        answers[200] = {"model": Readiness}
        shown: dict[str, Any] = {"$ref": "#/components/schemas/Readiness"}
        if 400 in statuses:
            shown = {"anyOf": [shown, {"$ref": "#/components/schemas/Error"}]}
        answers[_UNREADY] = {"description": "; ".join(filter(None, (
            "not ready: a model is loading", _STATUS[400] if 400 in statuses else ""))),
            "content": {"application/json": {"schema": shown}}}
    crowded = answers.get(503, {"description": ""})
    crowded["description"] = "; ".join(filter(None, (crowded["description"], _CROWDED)))
    crowded["content"] = crowded.get("content", {}) | {"text/plain": {"schema": {"type": "string"}}}
    answers[503] = crowded
    return answers


def _body_of(model: type[BaseModel], binary: str | None = None) -> dict[str, Any]:
    """openapi_extra for a route that reads its body itself, after the key check (see _body); `binary` describes
    the binary form it also takes."""
    content: dict[str, Any] = {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}
    if binary:
        content[oip.BINARY_TYPE] = {"schema": {"type": "string", "format": "binary", "description": binary}}
    return {"requestBody": {"required": True, "content": content}}


_UNREADY = 400  # what a readiness route answers while not ready: a 4xx, says the protocol (Triton's is 400 too)
_BINARY = (f"the request's JSON, then its inputs' binary tensor data; the header {oip.BINARY_HEADER} gives the"
           " JSON's length")
_INFER_BODY = _body_of(oip.InferRequest, _BINARY)
_INFERRED = {
    "description": "the outputs asked for, in the order asked (every output when none was)",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/InferResponse"}},
                oip.BINARY_TYPE: {"schema": {"type": "string", "format": "binary", "description": (
                    "the answer's JSON, then the binary data of the outputs asked for as binary")}}},
    "headers": {oip.BINARY_HEADER: {"description": "with binary data: the length of the JSON before it",
                                    "schema": {"type": "integer"}}}}


def create_app(settings: Settings, runtime: Runtime) -> ASGIApp:
    """The ASGI app; the runtime loads models in the background, so health answers at once."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        loading = asyncio.get_running_loop().create_task(runtime.start())
        loading.add_done_callback(_report_start_failure)
        rpc = await grpc_api.start(settings, runtime, rates) if settings.serve.grpc_port else None
        yield
        if rpc is not None:
            await rpc.stop(grace=5)
        loading.cancel()
        await runtime.stop()

    # The docs pages load scripts from a CDN (the box is offline); the OpenAPI document is for key holders.
    handlers = {kind: _counted(handler, runtime) for kind, handler in EXCEPTION_HANDLERS.items()}
    app = FastAPI(title="appliance inference", version=metadata.version("appliance"), lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None, exception_handlers=handlers)
    metrics = runtime.metrics
    rates = KeyRates(settings.serve.rate_limit_per_s, settings.serve.rate_limit_burst)

    app.state.runtime = runtime
    @app.get("/v2/health/live", responses=_answers())
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready", responses=_answers(unready=True))
    async def ready() -> JSONResponse:
        return JSONResponse({"ready": runtime.ready}, status_code=200 if runtime.ready else _UNREADY)

    @app.get("/v2", responses=_answers(401))
    async def server_metadata(_key: AnyKey) -> dict[str, Any]:
        return {"name": "appliance", "version": metadata.version("appliance"), "extensions": oip.EXTENSIONS}

    keeps_ids = runtime.predictions is not None

    def model_metadata(name: str, key: auth.ApiKey, version: int | None = None) -> dict[str, Any]:
        runtime.require(name, version, key.may_call)
        return oip.model_metadata(name, runtime.route(name, key.may_call), keeps_ids, version)

    def model_config(name: str, key: auth.ApiKey, version: int | None = None) -> dict[str, Any]:
        runtime.require(name, version, key.may_call)
        return oip.model_config(name, runtime.route(name, key.may_call), keeps_ids, settings.serve.max_batch_size,
                                settings.serve.max_delay_ms)

    def model_ready(name: str, key: auth.ApiKey, version: int | None = None) -> JSONResponse:
        if not runtime.expects(name):  # unknown: no retry makes it ready
            raise runtime.not_found(name, key.may_call)
        ok = runtime.model_ready(name, version)
        return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else _UNREADY)

    async def infer(request: Request) -> Response:
        name, version = request.path_params["name"], request.path_params.get("version")
        key = runtime.authorize(await _token_of(request), name)
        rates.admit(key)
        pictures = runtime.require(name, version, key.may_call)
        raw = await _body(request)
        try:
            ask = oip.parse_rest(raw, request.headers.get(oip.BINARY_HEADER), keeps_ids, name, version, pictures)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False, include_input=False)) from None
        rates.charge(key, len(ask.examples))
        answer = await runtime.predict(name, ask.examples, f"key:{key.name}", key.may_call, version, inline=True)
        content, header_length = oip.answer_rest(name, answer, ask)
        if header_length is None:
            return Response(content, media_type="application/json")
        return Response(content, media_type=oip.BINARY_TYPE, headers={oip.BINARY_HEADER: str(header_length)})

    async def predict(request: Request) -> JSONResponse:
        name = request.path_params["name"]
        key = runtime.authorize(await _token_of(request), name)
        rates.admit(key)
        images = runtime.require(name, None, key.may_call) is not None
        body = await _json(request, PredictRequest)
        rates.charge(key, len(body.instances))
        examples = [_instance(instance, index, images) for index, instance in enumerate(body.instances)]
        answer = await runtime.predict(name, examples, f"key:{key.name}", key.may_call, inline=True)
        return JSONResponse({"model": name, "model_version": str(answer.loaded.version),
                             "predictions": label_scores(answer)})

    # Each route of the protocol twice: the model's own, and one version of it by number (one that serves now).
    # The routes that infer are lean (see `lean`): no FastAPI on their way.
    refusals = _answers(400, 401, 403, 404, 408, 413, 429, 503)  # 400: also a version that is not a number
    lean_routes = [
        lean.LeanRoute("model_infer", "/v2/models/{name}/infer", infer, refusals | {200: _INFERRED}, _INFER_BODY),
        lean.LeanRoute("version_infer", "/v2/models/{name}/versions/{version}/infer", infer,
                       refusals | {200: _INFERRED}, _INFER_BODY),
        lean.LeanRoute("predict", "/v1/models/{name}:predict", predict, refusals, _body_of(PredictRequest)),
    ]
    metadata_answers = _answers(400, 401, 403, 404)  # 400: a version that is not a number
    ready_answers = _answers(400, 401, 403, 404, unready=True)

    @app.get("/v2/models/{name}", responses=metadata_answers)
    async def get_model_metadata(name: str, key: ModelKey) -> dict[str, Any]:
        return model_metadata(name, key)

    @app.get("/v2/models/{name}/versions/{version}", responses=metadata_answers)
    async def get_version_metadata(name: str, version: int, key: ModelKey) -> dict[str, Any]:
        return model_metadata(name, key, version)

    @app.get("/v2/models/{name}/config", responses=metadata_answers)
    async def get_model_config(name: str, key: ModelKey) -> dict[str, Any]:
        """The model as a Triton model configuration (read-only)."""
        return model_config(name, key)

    @app.get("/v2/models/{name}/versions/{version}/config", responses=metadata_answers)
    async def get_version_config(name: str, version: int, key: ModelKey) -> dict[str, Any]:
        return model_config(name, key, version)

    @app.get("/v2/models/{name}/ready", responses=ready_answers)
    async def get_model_ready(name: str, key: ModelKey) -> JSONResponse:
        return model_ready(name, key)

    @app.get("/v2/models/{name}/versions/{version}/ready", responses=ready_answers)
    async def get_version_ready(name: str, version: int, key: ModelKey) -> JSONResponse:
        return model_ready(name, key, version)

    @app.post("/v1/feedback", responses=_answers(400, 401, 403, 404, 408, 413, 429, 503),
              openapi_extra=_body_of(FeedbackRequest))
    async def post_feedback(key: AnyKey, request: Request) -> dict[str, Any]:
        """True labels for earlier predictions, from a key made to send them (`may_label`), allowed to call each
        prediction's model."""
        auth.require_labelling(key)
        rates.admit(key)
        body = await _json(request, FeedbackRequest)
        rates.charge(key, len(body.feedback))
        return await runtime.record_feedback([(item.prediction_id, item.label) for item in body.feedback],
                                             f"apikey:{key.id}", key.may_call)

    @app.get("/metrics", response_class=Response, responses=_answers(401, 403)
             | {200: {"content": {serve_metrics.CONTENT_TYPE: {"schema": {"type": "string"}}}}})
    async def metrics_endpoint(_key: AllModelsKey) -> Response:
        for served in runtime.describe():
            for version in served["versions"]:
                labels = (served["model"], str(version["version"]))
                metrics.traffic.labels(*labels).set(version["traffic_share"])
                metrics.queue_depth.labels(*labels).set(version["queue_depth"])
        return Response(metrics.exposition(), media_type=serve_metrics.CONTENT_TYPE)

    @app.get("/openapi.json", responses=_answers(401))
    async def openapi_document(_key: AnyKey) -> JSONResponse:
        """This document: the routes, their keys, limits and answers."""
        return JSONResponse(app.openapi())

    def amend(document: dict[str, Any]) -> None:
        lean.document(lean_routes, document)
        _describe_bodies(document, settings.serve)

    document_errors(app, amend)
    # The body limit outside the lean routes, and the access log outermost: a refusal of the body's size gets its
    # line too.
    def body_limit(scope: Scope) -> int:
        """An image model's inference routes take photos: a limit of their own."""
        for route in lean_routes:
            found = route.pattern.fullmatch(scope["path"])
            if found and runtime.takes_images(found["name"]):
                return settings.serve.max_image_body_bytes
        return settings.serve.max_body_bytes

    limited = BodyLimit(lean.Lean(app, lean_routes, handlers), limit=body_limit,
                        hint="send fewer or smaller examples per request")
    return AccessLog(limited) if settings.serve.access_log else limited


def _counted(handler: Handler, runtime: Runtime) -> Handler:
    """`handler`, also counting the refusal in the metrics: under its model when that model serves, else under one
    label, so no caller adds series. A version's own failure the runtime counted already."""

    async def answer(request: Request, exc: Exception) -> JSONResponse:
        response = await handler(request, exc)
        if not getattr(exc, "counted", False):
            name = request.path_params.get("name")
            runtime.metrics.request(name if name in runtime.routes else serve_metrics.OTHER, None,
                                    response.status_code)
        return response

    return answer


async def _body(request: Request) -> bytes:
    """The body, read here rather than by FastAPI, which would read and parse it before the key check. Whatever its
    Content-Type says (clients of the protocol send none, curl -d a form's): no browser can send the key header
    cross-origin without asking first, so the type guards nothing."""
    try:
        return await request.body()
    except ClientDisconnect:  # the client went away, or the body timeout cut it off (see _TimedHttp)
        raise RequestTimeout("the request body did not arrive in full",
                             hint="send the whole body without pausing") from None


async def _json(request: Request, model: type[M]) -> M:
    """The body as model."""
    found = parse_json(await _body(request))
    try:
        return model.model_validate(found)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False, include_input=False)) from None


def _instance(instance: str | EncodedImage, index: int, images: bool) -> str | bytes:
    """A text, or an image's bytes, as the model takes; a 400 for the other kind."""
    if not images:
        if isinstance(instance, EncodedImage):
            raise BadRequest(f"instance {index} is an image, and this model classifies texts",
                             hint="send each text as a JSON string")
        return instance
    if isinstance(instance, str):
        raise BadRequest(f"instance {index} is a string, and this model classifies images",
                         hint='send each image as {"b64": "<the file, base64-encoded>"}')
    return oip.unbased(instance.b64, index)


def _describe_bodies(document: dict[str, Any], serve: ServeSettings) -> None:
    """The bodies the routes read themselves (see _json) in the OpenAPI document, with the text limits."""
    schemas = document["components"]["schemas"]
    for model in (oip.InferRequest, oip.InferResponse, PredictRequest, FeedbackRequest):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    tensor = schemas["InferInput"]["properties"]
    tensor["name"]["enum"] = [oip.INPUT, oip.IMAGE_INPUT, oip.PIXELS_INPUT]
    tensor["shape"]["description"] = ("[n] or [n, 1] for the n texts (or images) in data; [n, 3, s, s] for an image "
                                      "model's pixel_values")
    text = {"type": "string", "maxLength": serve.max_text_chars}
    tensor["data"] = {"description": tensor["data"]["description"], "type": "array", "minItems": 1,
                      "items": {"anyOf": [text, {"type": "number"}, {"type": "array"}]}}
    schemas["RequestedOutput"]["properties"]["name"]["enum"] = list(oip.DATATYPES)
    instances = schemas["PredictRequest"]["properties"]["instances"]
    instances.update(minItems=1, maxItems=serve.max_instances)
    instances["items"]["anyOf"][0]["maxLength"] = serve.max_text_chars


@dataclass(frozen=True)
class Uploads:
    """Paths whose bodies may take longer to arrive (an upload of a large file), and how long."""

    paths: frozenset[str]
    body_timeout_s: float


def hardened_options(serve: ServeSettings, uploads: Uploads | None = None) -> dict[str, Any]:
    """The uvicorn options that bound what one client can hold, for every server of the appliance that faces one:
    the time to send a request's head and its body (longer for `uploads`' paths), idle keep-alive, and connections
    at once. The address a request came from is the connection's: uvicorn would otherwise take a client's
    X-Forwarded-For from 127.0.0.1, and the audit trail and the counts of refusals per source would name whatever
    it wrote."""
    protocol = type("TimedHttp", (_TimedHttp,), {"header_timeout_s": serve.header_timeout_s,
                                                 "body_timeout_s": serve.body_timeout_s, "uploads": uploads})
    # uvicorn counts the connection asking among the open ones, so one more lets max_connections be served.
    return {"http": protocol, "limit_concurrency": serve.max_connections + 1, "proxy_headers": False,
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
    uploads: Uploads | None
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
            uploads = self.uploads
            timeout_s = uploads.body_timeout_s if uploads and cycle.scope["path"] in uploads.paths else self.body_timeout_s
            self._body_timer = self.loop.call_later(timeout_s, self._body_late, cycle)

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


_LATE_BODY = _raw_answer(408, "Request Timeout", error_body(
    RequestTimeout.__name__, "the request body did not arrive in time", "send the whole body without pausing"))


def _report_start_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        error = task.exception()
        message = error.message if isinstance(error, ApplianceError) else repr(error)
        log.error("the server could not open the store, so it stays unready: %s", message)


def label_scores(answer: Answer) -> list[dict[str, Any]]:
    """Per text: its prediction id, the most likely label, every label's probability and whether it was truncated."""
    labels = answer.loaded.labels
    return [{"id": prediction_id or None, "label": label,
             "scores": {name: round(float(p), 6) for name, p in zip(labels, row, strict=True)},
             "truncated": truncated}
            for prediction_id, label, row, truncated in zip(answer.prediction_ids, answer.labels, answer.probabilities,
                                                            answer.truncated, strict=True)]

