"""The access log's middleware on its own: a request that ends in an error nothing caught still has its line."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from appliance.serve.access import AccessLog


def test_an_uncaught_error_is_logged_as_the_500_it_becomes(caplog: pytest.LogCaptureFixture) -> None:
    async def broken(_request: object) -> None:
        raise RuntimeError("a bug")

    app = Starlette(routes=[Route("/v2/models/tickets/infer", broken, methods=["POST"])])
    app.add_middleware(AccessLog)

    async def call() -> int:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://appliance") as client:
            return (await client.post("/v2/models/tickets/infer")).status_code

    with caplog.at_level(logging.INFO, logger="appliance.access"):
        assert asyncio.run(call()) == 500
    (line,) = [record.getMessage() for record in caplog.records if record.name == "appliance.access"]
    assert line.startswith("rest POST /v2/models/tickets/infer 500 ") and "a bug" not in line
