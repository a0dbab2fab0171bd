"""What both HTTP APIs share at their edge: errors as JSON, how their OpenAPI documents state them, and a bound on
every request body.

Every error either API sends is `{"type": ..., "error": what happened, "hint": how to fix it}` (hint when known).
An ApplianceError has the status `STATUS` gives its class and is typed by its class name (JobNotFound,
ModelNotFound, Forbidden...), so a client can raise the same class again. The refusals the HTTP layer makes on
its own are typed the same way:

    RouteNotFound      404  no route has that path
    MethodNotAllowed   405  the path takes other methods (Allow names them)
    ValidationError    400  the path, query or body does not match the route's schema
    HTTPError          any other refusal of Starlette's, with its status

A body is counted as it arrives, whether it declares a Content-Length or comes chunked, so no client, signed in
or not, can make a server hold more than the route's limit in memory.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, StrictStr
from starlette.exceptions import HTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from appliance.core.errors import (
    AlertNotFound,
    ApplianceError,
    AuditDiverged,
    AuthError,
    BadRequest,
    DaemonError,
    DatasetNotFound,
    Forbidden,
    JobNotFound,
    ModelNotFound,
    PayloadTooLarge,
    PredictionNotFound,
    RateLimited,
    RequestTimeout,
    ResidencyRefused,
    RunNotFound,
    ServeError,
    StoreBusy,
    StoreDamaged,
    StoreFull,
    StudyNotFound,
    VersionNotFound,
)
from appliance.core.text import surrogate_at
from appliance.store import db as store_db

# The status of each error class; a class not named here takes the status of the nearest class above it.
STATUS: dict[type[ApplianceError], int] = {
    ApplianceError: 400,  # the caller asked for something that cannot be done as asked
    AlertNotFound: 404,
    JobNotFound: 404,
    RunNotFound: 404,
    StudyNotFound: 404,
    DatasetNotFound: 404,
    VersionNotFound: 404,
    PredictionNotFound: 404,
    ModelNotFound: 404,
    AuthError: 401,
    Forbidden: 403,
    ResidencyRefused: 403,
    AuditDiverged: 503,
    StoreBusy: 503,
    StoreDamaged: 503,
    StoreFull: 503,
    DaemonError: 503,
    ServeError: 503,  # the model failed on a batch, or too much is queued: a retry may well succeed
    BadRequest: 400,
    PayloadTooLarge: 413,
    RequestTimeout: 408,
    RateLimited: 429,
}
_HTTP_TYPES = {404: "RouteNotFound", 405: "MethodNotAllowed"}
_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")
_HEADERS = {  # what a client learns from an error's headers, by status, as the OpenAPI documents state them
    401: {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    429: {"Retry-After": {"description": "seconds until the key may send again", "schema": {"type": "integer"}}},
    503: {"Retry-After": {"description": "seconds to wait before a retry", "schema": {"type": "integer"}}},
}
ERROR_SCHEMA = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"type": "string", "description": (
        "what kind of error: an ApplianceError class (JobNotFound, ModelNotFound, Forbidden...), or RouteNotFound,"
        " MethodNotAllowed, ValidationError, HTTPError")},
    "error": {"type": "string", "description": "what happened"},
    "hint": {"type": "string", "description": "how to fix it, when that is known"}}}


def status_of(kind: type[ApplianceError]) -> int:
    """The status both APIs answer for an error of this class."""
    return next(STATUS[cls] for cls in kind.__mro__ if cls in STATUS)


def error_response(exc: ApplianceError) -> JSONResponse:
    """An ApplianceError as its status and Error body, with the headers that status promises."""
    status = status_of(type(exc))
    headers = {
        401: {"WWW-Authenticate": "Bearer"},
        429: {"Retry-After": str(math.ceil(getattr(exc, "retry_after_s", 1)))},
        503: {"Retry-After": "1"},
    }.get(status)
    return _json_error(status, type(exc).__name__, exc.message, exc.hint, headers)


async def appliance_error(_request: Request, exc: ApplianceError) -> JSONResponse:
    return error_response(exc)


async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
    """A 400 (never FastAPI's 422) naming the first few problems and where each is."""
    problems = "; ".join(_describe(error) for error in exc.errors()[:5])
    return _json_error(400, "ValidationError", f"the request is not valid: {problems}",
                       "see the OpenAPI document at /openapi.json")


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own refusals (404 no route, 405 wrong method) as Error bodies; a 405's Allow header lists
    every method the path takes, where Starlette names only the first route's. Each method is tried against the
    app's routes, so the routes of an included router count as well; a 405 raised before the app's router (by
    `lean`) names its Allow itself."""
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.status_code == 405 and "app" in request.scope:  # refused by the app's router, not before it
        headers["Allow"] = ", ".join(method for method in _METHODS if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL for route in request.app.routes))
    return _json_error(exc.status_code, _HTTP_TYPES.get(exc.status_code, "HTTPError"), str(exc.detail), None,
                       headers or None)


class BodyTooLarge(HTTPException):
    """A body passed its route's limit as it streamed in. An HTTPException, since FastAPI's own body parsing turns
    any other error there into a 400; its handler answers the 413."""

    def __init__(self, limit: int, hint: str) -> None:
        super().__init__(413)
        self.limit, self.hint = limit, hint

    def response(self) -> JSONResponse:
        return error_response(PayloadTooLarge(f"the request body is over the limit of {self.limit} bytes",
                                              hint=self.hint))


async def body_too_large(_request: Request, exc: BodyTooLarge) -> JSONResponse:
    return exc.response()


Handler = Callable[[Request, Any], Awaitable[JSONResponse]]
async def database_error(_request: Request, exc: sqlite3.DatabaseError) -> JSONResponse:
    """A damaged database file, a full disk or a write lock held too long, as StoreDamaged, StoreFull or StoreBusy
    (503); any other SQLite error stays a bug (500)."""
    if (disk := store_db.disk_error(exc)) is None:
        raise exc
    return error_response(disk)


EXCEPTION_HANDLERS: dict[type[Exception], Handler] = {
    ApplianceError: appliance_error, RequestValidationError: invalid_request, HTTPException: http_error,
    BodyTooLarge: body_too_large, sqlite3.DatabaseError: database_error}


def error_body(kind: str, message: str, hint: str | None) -> dict[str, str]:
    """The Error body; a lone surrogate from a caller's input is escaped, as JSON in UTF-8 cannot carry it."""
    return {"type": kind, "error": _sendable(message)} | ({"hint": _sendable(hint)} if hint else {})


def _json_error(status: int, kind: str, message: str, hint: str | None,
                headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(kind, message, hint), status_code=status, headers=headers)


def _describe(error: dict[str, Any]) -> str:
    """One pydantic validation error as 'where: what'."""
    where = ".".join(str(part) for part in error.get("loc", ()) if part != "body") or "body"
    return f"{where}: {error.get('msg', 'invalid')}"


def _sendable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode()


def parse_json(raw: bytes) -> Any:
    """A request body's JSON, or a 400 saying where it breaks. Not pydantic's parser: a lone surrogate in a text
    must reach the inference runtime, which names the text it is in."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc.msg} at character {exc.pos}",
                         hint="see the OpenAPI document at /openapi.json") from None
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the request body is not UTF-8 (byte {exc.start})", hint="send JSON in UTF-8") from None
    except RecursionError:
        raise BadRequest("the request body nests too deeply", hint="see the OpenAPI document at /openapi.json") from None


def _unicode(text: str) -> str:
    """A string field the server keeps, answers with or looks up: a lone surrogate would fail it there."""
    if surrogate_at(text) is not None:
        raise ValueError("not valid Unicode text (a lone surrogate)")
    return text


Text = Annotated[StrictStr, AfterValidator(_unicode)]


class Body(BaseModel):
    """A JSON request body of either API: a field it does not know is refused, never silently ignored."""

    model_config = ConfigDict(extra="forbid")


# -- the OpenAPI documents ---------------------------------------------------------------------


def error_answers(errors: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route or router: each status (-> when it is sent) with an Error body and its headers."""
    return {status: {"description": when,
                     "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                     **({"headers": _HEADERS[status]} if status in _HEADERS else {})}
            for status, when in errors.items()}


def document_errors(app: FastAPI, amend: Callable[[dict[str, Any]], None] = lambda document: None) -> None:
    """Make the app's OpenAPI document say what its edge does: errors are Error bodies (routes name theirs with
    `error_answers`), a request that does not validate is a 400, so FastAPI's 422 and its schemas go; `amend`
    adds what only this API knows. A client generated from the document, or a fuzzer holding the server to it,
    then meets no status or body the document did not promise."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, routes=app.routes)
            shown = document.setdefault("components", {}).setdefault("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                shown.pop(unused, None)
            shown["Error"] = ERROR_SCHEMA
            for operations in document.get("paths", {}).values():
                for operation in operations.values():
                    operation.setdefault("responses", {}).pop("422", None)
            amend(document)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


# -- bodies --------------------------------------------------------------------------------------


class BodyLimit:
    """413 for a body over its route's limit, by Content-Length or by counting a streamed body."""

    def __init__(self, app: ASGIApp, limit: Callable[[Scope], int], hint: str) -> None:
        self.app, self.limit, self.hint = app, limit, hint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit(scope)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._too_large(limit, scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(limit, self.hint)
            return message

        await self.app(scope, counted, send)

    async def _too_large(self, limit: int, scope: Scope, receive: Receive, send: Send) -> None:
        await BodyTooLarge(limit, self.hint).response()(scope, receive, send)
