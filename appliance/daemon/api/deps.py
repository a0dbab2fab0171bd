"""What the control API's handlers are lent, as FastAPI dependencies reading the app's state: the daemon's one
store (one handler at a time), the caller (found by `Authenticated` before anything else, checked against the role
a route needs, refusals audited), and the inference runtime."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Query, Request
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from appliance.access import users
from appliance.core import config
from appliance.core.errors import AuthError, BadRequest, DaemonError, Overloaded, RequestTimeout
from appliance.core.text import printable
from appliance.serve.runtime import Runtime
from appliance.serve.web import error_response
from appliance.store import Store, audit, spool

UPLOAD_BODY = {"requestBody": {"required": True, "content": {  # an upload route's OpenAPI body: raw bytes
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}
READ_AUDIT_S = 600.0
REFUSALS_WINDOW_S = 60.0  # refusals of one source and caller are written once, then counted for this long
REFUSALS_TRACKED = 10_000  # sources and callers tracked at once; more are counted together
UPLOADS_AT_ONCE = 1  # uploads received and stored at once: each is spooled whole, up to daemon.max_upload_mb
UPLOAD_MIN_RATE = 16 * 1024  # bytes a second an upload averages, from 2 * serve.body_timeout_s on: a trickle (or
# pauses longer than serve.body_timeout_s) would hold the one upload there is for the hour an upload may take


class SharedStore:
    """The daemon's store, lent to one handler at a time."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._reads: dict[tuple[str, str], float] = {}  # (user id, endpoint) -> when last audited
        self._refusals: dict[tuple[str, str], _Refusals] = {}  # (source, caller) -> refusals of this window
        self.closing = threading.Event()  # set as the daemon stops: open event streams end rather than hold it up
        self.uploads = 0  # being received or stored (received()); counted on the event loop
        self.streams: dict[str, set[asyncio.Task[None]]] = {}  # a user's open event streams, by user id
        self.last_verification: tuple[float, audit.Verification] | None = None  # when (time.monotonic()), what

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
        audit.record(store, "api.read", f"GET {endpoint}", actor=actor(user))

    def require(self, store: Store, user: users.User, role: str, request: Request) -> None:
        """users.require, and a refusal audited as note_refusal says: for a role that a request's route or body
        asks for (an export job is an admin's)."""
        try:
            users.require(user, role)
        except AuthError as exc:
            self.note_refusal(store, actor(user), _source(request), request, exc.message)
            raise

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
        audit.record(store, "api.refused", f"{request.method} {printable(request.url.path[:200])}", actor=who,
                     source=source, reason=reason)

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
    """The request as its route names it ("GET /v1/jobs/{job_id}"); its path, made printable, when none matched."""
    route = request.scope.get("route")
    return f"{request.method} {getattr(route, 'path', None) or printable(request.url.path[:200])}"


def actor(user: users.User) -> str:
    """Who the audit records of a user's calls name."""
    return f"user:{user.name}"


def _source(request: Request) -> str:
    """Where a call came from: an address over TCP; over the unix socket, the socket (its group is the gate)."""
    return request.client.host if request.client and request.client.host else "local socket"


# -- the dependencies ------------------------------------------------------------------------------
# The trivial ones are async, so FastAPI calls them on the event loop rather than in a thread.


async def _shared(request: Request) -> SharedStore:
    return request.app.state.shared


async def _settings(request: Request) -> config.Settings:
    return request.app.state.shared.store.settings


async def _runtime(request: Request) -> Runtime:
    """The inference server's runtime; it lives on the daemon's event loop and never touches the store."""
    runtime: Runtime | None = request.app.state.runtime
    if runtime is None:
        raise DaemonError("this control API runs without an inference server", hint="'appliance daemon' runs both")
    return runtime


class Authenticated:
    """ASGI: the user behind a request's token, found before anything of its body is read, for every path but the
    open ones. FastAPI reads and parses a body before it resolves a route's dependencies, so a check there would let
    anyone make the daemon read a slow body or parse a large one; here, a request without a valid token is answered
    401 at once (and audited). The user is left in the scope's state, where _caller checks the route's role."""

    def __init__(self, app: ASGIApp, shared: SharedStore, open_paths: set[str]) -> None:
        self.app, self.shared, self.open_paths = app, shared, open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.open_paths:
            try:  # on a thread: the store's lock may be held by a handler for a while
                scope.setdefault("state", {})["user"] = await asyncio.to_thread(self._authenticate, Request(scope))
            except AuthError as exc:
                await error_response(exc)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _authenticate(self, request: Request) -> users.User:
        authorization = request.headers.get("authorization")
        with self.shared.use() as store:
            try:
                return users.authenticate(store, authorization.removeprefix("Bearer ").strip() if authorization
                                          else None)
            except AuthError as exc:
                self.shared.note_refusal(store, "anonymous", _source(request), request, exc.message)
                raise


def _caller(role: str) -> Callable[..., users.User]:
    """A dependency: the user Authenticated found, if their role is at least `role`."""

    def check(request: Request) -> users.User:
        user: users.User = request.state.user
        shared: SharedStore = request.app.state.shared
        with shared.use() as store:
            shared.require(store, user, role, request)
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


Shared = Annotated[SharedStore, Depends(_shared)]
Settings = Annotated[config.Settings, Depends(_settings)]
Serving = Annotated[Runtime, Depends(_runtime)]
Since = Annotated[datetime | None, Depends(_since)]
Viewer = Annotated[users.User, Depends(_caller("viewer"))]
Operator = Annotated[users.User, Depends(_caller("operator"))]
Admin = Annotated[users.User, Depends(_caller("admin"))]


@asynccontextmanager
async def received(request: Request) -> AsyncIterator[spool.Spool]:
    """An upload's whole body (BodyLimit stops it at daemon.max_upload_mb), spooled sealed into the state directory
    while the block stores it, in memory a piece at a time: UPLOADS_AT_ONCE at most, so that uploads sent at once
    cannot fill the disk; one more meanwhile is refused (503), to be sent again. Pieces are sealed and written off
    the event loop."""
    shared: SharedStore = request.app.state.shared
    if shared.uploads >= UPLOADS_AT_ONCE:
        raise Overloaded("another upload is being received or stored, and one is taken at a time",
                         hint="send it again once that one is done")
    shared.uploads += 1
    try:
        with spool.Spool(shared.store.settings.state_dir) as body:
            try:
                arrived = bytearray()
                async for chunk in _kept_up(request, shared.store.settings.serve.body_timeout_s):
                    arrived += chunk
                    if len(arrived) >= spool.PIECE:
                        await asyncio.to_thread(body.write, bytes(arrived))
                        arrived.clear()
                await asyncio.to_thread(body.write, bytes(arrived))
                body.finish()
            except OSError as exc:  # the disk is full, most likely
                raise Overloaded(f"the upload could not be spooled after {body.size:,} bytes: {exc.strerror}",
                                 hint="free space on the state directory's disk ('appliance store info'), then send"
                                      " it again") from None
            yield body
    finally:
        shared.uploads -= 1


async def _kept_up(request: Request, pause_s: float) -> AsyncIterator[bytes]:
    """The body's chunks, as long as none is more than pause_s late and, from 2 * pause_s on, they average
    UPLOAD_MIN_RATE; else RequestTimeout (408), as for a client that went away."""
    chunks, started, received_bytes = request.stream().__aiter__(), time.monotonic(), 0
    while True:
        try:
            chunk = await asyncio.wait_for(anext(chunks), pause_s)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise RequestTimeout(f"the upload sent nothing for {pause_s:g} s (serve.body_timeout_s)",
                                 hint="send it again without pausing") from None
        except ClientDisconnect:
            raise RequestTimeout("the upload did not arrive in full: the connection closed",
                                 hint="send it again") from None
        received_bytes += len(chunk)
        elapsed_s = time.monotonic() - started
        if elapsed_s > 2 * pause_s and received_bytes < UPLOAD_MIN_RATE * elapsed_s:
            raise RequestTimeout(f"the upload came at {received_bytes / elapsed_s / 1024:.1f} KiB/s, under the"
                                 f" {UPLOAD_MIN_RATE // 1024} KiB/s an upload keeps, as only one is taken at a time",
                                 hint="send it over a faster link, or put the file in daemon.import_dir and import it"
                                      " by name")
        yield chunk
