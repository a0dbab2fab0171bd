"""The access log: one line per inference request, REST or gRPC, on by default (serve.access_log).

    access rest POST /v2/models/tickets/infer 200 3.1ms key=3f2a9c0d model=tickets:2

When, which key (its id, never the secret), which model and version answered, the answer's
status and how long it took: what an operator needs to tell who called what and when it
went wrong. Never what was sent or answered (texts, labels, scores), nor the query string,
so the log holds no customer data and can go to journald like any other line.

The middleware (REST) or the call wrapper (gRPC) opens an Entry for the request in a
context variable; the runtime fills in the key once it is checked and the version once it
answers (note()), and the line is written when the answer has gone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from appliance.core.text import printable

log = logging.getLogger("appliance.access")


@dataclass
class Entry:
    """What one request's line says; the key and the model are filled in as the request gets that far."""

    protocol: str  # rest | grpc
    call: str  # "POST /v2/models/tickets/infer", or the gRPC method: "ModelInfer"
    key: str = "-"  # the API key's id
    model: str = "-"  # model:version that answered
    status: int | str = "-"  # the HTTP status or gRPC code; "-": no answer began (the client went away)


_CURRENT: ContextVar[Entry | None] = ContextVar("appliance_access_entry", default=None)


@contextmanager
def request(protocol: str, call: str) -> Iterator[Entry]:
    """The line of one request: open while it is answered (the caller sets its status), written when it ends."""
    entry = Entry(protocol, call)
    token = _CURRENT.set(entry)
    started = time.perf_counter()
    try:
        yield entry
    finally:
        _CURRENT.reset(token)
        log.info("%s %s %s %.1fms key=%s model=%s", entry.protocol, entry.call, entry.status,
                 (time.perf_counter() - started) * 1000, entry.key, entry.model)


def note(*, key: str | None = None, model: str | None = None) -> None:
    """Add to the line of the request under way (nothing when none is logged)."""
    entry = _CURRENT.get()
    if entry is not None:
        entry.key = key or entry.key
        entry.model = model or entry.model


class AccessLog:
    """ASGI middleware: a line for every HTTP request, written once its answer has gone (or the client left)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with request("rest", f"{scope['method']} {printable(scope['path'][:200])}") as entry:

            async def answering(message: Message) -> None:
                if message["type"] == "http.response.start":
                    entry.status = message["status"]
                await send(message)

            try:
                await self.app(scope, receive, answering)
            except Exception:
                if entry.status == "-":
                    entry.status = 500  # what Starlette's outermost middleware answers to what nothing caught
                raise
