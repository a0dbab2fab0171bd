"""What both HTTP APIs share at their edge: JSON error bodies, and a bound on every request body.

Every error either API sends is `{"error": what happened, "hint": how to fix it}`. A body
is counted as it arrives, whether it declares a Content-Length or comes chunked, so no
client, signed in or not, can make a server hold more than the route's limit in memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ERROR_SCHEMA = {"type": "object", "required": ["error"],
                "properties": {"error": {"type": "string"}, "hint": {"type": "string"}}}


def document_errors(app: FastAPI, *, security: dict[str, dict[str, Any]], open_paths: tuple[str, ...],
                    errors: dict[str, str]) -> None:
    """Make the app's OpenAPI document say what its edge does: every secured operation names the security
    schemes and may answer each of `errors` (status -> when) with an Error body; validation errors are 400s,
    so FastAPI's default 422 goes. A client generated from the document, or a fuzzer holding the server to
    it, then meets no status the document did not promise."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = document.setdefault("components", {})
            components.setdefault("securitySchemes", {}).update(security)
            shown = components.setdefault("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                shown.pop(unused, None)
            shown["Error"] = ERROR_SCHEMA
            error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
            for path, operations in document.get("paths", {}).items():
                for operation in operations.values():
                    responses = operation.setdefault("responses", {})
                    responses.pop("422", None)
                    if path in open_paths:
                        continue
                    operation["security"] = [{name: []} for name in security]
                    for status, when in errors.items():
                        responses.setdefault(status, {"description": when, "content": error})
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own refusals (404 no route, 405 wrong method) as Error bodies; a 405's Allow header lists
    every method the path takes, where Starlette names only the first route's."""
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.status_code == 405:
        methods = {method for route in request.app.routes
                   if isinstance(route, BaseRoute) and route.matches(request.scope)[0] is not Match.NONE
                   for method in getattr(route, "methods", None) or ()}
        headers["Allow"] = ", ".join(sorted(methods))
    return json_error(exc.status_code, str(exc.detail), None, headers or None)


def json_error(status: int, message: str, hint: str | None, headers: dict[str, str] | None = None) -> JSONResponse:
    """The Error body; a lone surrogate from a caller's input is escaped, as JSON in UTF-8 cannot carry it."""
    body = {"error": _sendable(message)} | ({"hint": _sendable(hint)} if hint else {})
    return JSONResponse(body, status_code=status, headers=headers)


def describe_error(error: dict[str, Any]) -> str:
    """One pydantic validation error as 'where: what'."""
    where = ".".join(str(part) for part in error.get("loc", ()) if part != "body") or "body"
    return f"{where}: {error.get('msg', 'invalid')}"


def _sendable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode()


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
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._too_large(limit, scope, receive, send)

    async def _too_large(self, limit: int, scope: Scope, receive: Receive, send: Send) -> None:
        response = json_error(413, f"the request body is over the limit of {limit} bytes", self.hint)
        await response(scope, receive, send)


class _TooLarge(Exception):
    """A streamed body passed the limit."""
