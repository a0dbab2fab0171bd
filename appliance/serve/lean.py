"""The inference routes answered straight from ASGI, past the framework's plumbing.

At one client, more of a request's time outside the model went to FastAPI (its middleware
stack, its routing over every route, its dependency resolution) than to parsing HTTP; the
README's serving figures show where. The routes that infer are the ones that count, and
they need none of it: each checks the key and then reads its body itself. So `Lean` matches
them first, one regular expression each, and runs their answer with what FastAPI gave them:
the path parameters (a version is a whole number, or a 400), the error handlers (the same
Error bodies, counted the same way), and a 405 naming POST for any other method. Every other
request goes on to the app behind. `document` writes the routes into the app's OpenAPI
document as FastAPI would have: the same operation ids, parameters and security schemes.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from appliance.serve.web import Handler

Answer = Callable[[Request], Awaitable[Response]]
_PARAMETER = re.compile(r"\\\{(\w+)\\\}")  # a {name} in a path, once re.escape has been over it
_INTEGERS = {"version"}  # path parameters that are whole numbers
_INTEGER = re.compile(r"[+-]?[0-9]{1,18}")


@dataclass(frozen=True)
class LeanRoute:
    """A POST route: its path as the OpenAPI document names it, its answer, and what the document says of it."""

    name: str  # as a FastAPI endpoint's name: the operation's summary and id come from it
    path: str
    answer: Answer
    responses: dict[int | str, dict[str, Any]]
    openapi_extra: dict[str, Any]  # what FastAPI's openapi_extra would hold: here, the request body
    pattern: re.Pattern[str] = field(init=False)

    def __post_init__(self) -> None:
        pattern = _PARAMETER.sub(lambda found: f"(?P<{found[1]}>[^/]+)", re.escape(self.path))
        object.__setattr__(self, "pattern", re.compile(pattern))


class Lean:
    """ASGI: the lean routes answered here, everything else passed to `app`.

    `handlers` turn an exception into its answer, as the app's exception handlers do (they are the same ones).
    """

    def __init__(self, app: ASGIApp, routes: Sequence[LeanRoute], handlers: Mapping[type[Exception], Handler]
                 ) -> None:
        self.app, self.routes, self.handlers = app, routes, handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for route in self.routes:
                if found := route.pattern.fullmatch(scope["path"]):
                    await self._answer(route, found, scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _answer(self, route: LeanRoute, found: re.Match[str], scope: Scope, receive: Receive,
                      send: Send) -> None:
        scope["path_params"] = found.groupdict()
        request = Request(scope, receive)
        try:
            if scope["method"] != "POST":
                raise HTTPException(405, headers={"Allow": "POST"})
            for name in _INTEGERS & scope["path_params"].keys():
                scope["path_params"][name] = _whole_number(name, scope["path_params"][name])
            response = await route.answer(request)
        except Exception as exc:
            handler = next((self.handlers[kind] for kind in type(exc).__mro__ if kind in self.handlers), None)
            if handler is None:
                raise  # a bug: uvicorn logs it and answers 500, as it does for the app's routes
            response = await handler(request, exc)
        await response(scope, receive, send)


def _whole_number(name: str, value: str) -> int:
    """A path parameter the document calls an integer, parsed as FastAPI would: a sign and digits (bounded)."""
    if not _INTEGER.fullmatch(value):
        raise RequestValidationError([{"loc": ("path", name), "type": "int_parsing",
                                       "msg": "Input should be a valid integer, unable to parse string as an integer"}])
    return int(value)


def document(routes: Sequence[LeanRoute], openapi: dict[str, Any]) -> None:
    """Add the routes to an OpenAPI document: each as FastAPI would describe an endpoint taking the path's
    parameters and an API key (header or bearer token), with its own body and answers."""
    for route in routes:
        parameters = [{"name": name, "in": "path", "required": True,
                       "schema": {"type": "integer" if name in _INTEGERS else "string", "title": name.title()}}
                      for name in route.pattern.groupindex]
        answers = {"200": {"description": "Successful Response", "content": {"application/json": {"schema": {}}}}}
        answers |= {str(status): answer for status, answer in route.responses.items()}
        openapi["paths"].setdefault(route.path, {})["post"] = {
            "summary": route.name.replace("_", " ").title(),
            "operationId": re.sub(r"\W", "_", f"{route.name}{route.path}") + "_post",
            "security": [{"ApiKey": []}, {"Bearer": []}],
            "parameters": parameters,
            **route.openapi_extra,
            "responses": answers,
        }
