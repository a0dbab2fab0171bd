"""The CLI's and the TUI's side of the control API: HTTP over the daemon's unix socket.

The token is $APPLIANCE_TOKEN, else the local admin token the daemon leaves (mode 0600)
for its own user in the state directory. An error answer becomes the ApplianceError its
body names (`type`), so commands report it, and catch it, like any other; a type this
client does not know is an ApplianceError. Client serves the CLI; AsyncClient,
the same calls awaited, serves the TUI's event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

import httpx

from appliance.core import config
from appliance.core.errors import ApplianceError, DaemonUnreachable, PayloadTooLarge, RateLimited
from appliance.data import sources

TIMEOUT_S = 30.0
UPLOAD_TIMEOUT_S = 3600.0  # the daemon checks a large upload (every image decoded) before it answers
UPLOAD_CHUNK = 1 << 20
DATASETS, MODELS = "/v1/datasets", "/v1/models:import"  # the upload routes
KEEPALIVE_S = 1.0  # how long an idle connection to the daemon is kept for the next request
EVENTS_SILENCE_S = 10.0  # the daemon sends a keep-alive every half second: this much silence means it is gone


def daemon_running(settings: config.Settings) -> bool:
    """Whether a daemon answers on the control socket."""
    if not settings.socket_path.exists():
        return False
    try:
        with _http(settings, None) as http:
            return http.get("/v1/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def inference_answers(settings: config.Settings) -> bool:
    """Whether an appliance's inference server (the daemon's, or `appliance serve` on its own) answers at serve.host
    and serve.port."""
    try:
        with httpx.Client(verify=False, timeout=5) as http:  # our own self-signed certificate, perhaps
            return http.get(f"{settings.inference_url}/v2/health/live").status_code == 200
    except httpx.HTTPError:
        return False


def path(template: str, *values: object) -> str:
    """A route with each {} filled by a value percent-encoded whole, so that what a person typed is one segment:
    never a '..' that climbs to another route, nor a '?' that starts a query. A value that cannot be one (a '/'
    inside, '.' or '..') is refused here, before anything is asked."""
    segments = []
    for value in map(str, values):
        if "/" in value or value in ("", ".", ".."):
            raise ApplianceError(f"{value!r} cannot name anything the appliance keeps: a name, reference or id has"
                                 " no '/' and is not empty, '.' or '..'",
                                 hint="check it: 'appliance data list', 'models list' and 'jobs list' show them")
        segments.append(quote(value, safe=":@"))
    return template.format(*segments)


class Client:
    def __init__(self, settings: config.Settings) -> None:
        self._http = _http(settings, _token(settings))
        self._socket = settings.socket_path
        self._upload_limit_mb = settings.daemon.max_upload_mb

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._http.close()

    def get(self, path: str, **params: Any) -> Any:
        return self._request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._request("POST", path, json=body or {})

    def delete(self, path: str) -> Any:
        return self._request("DELETE", path)

    def download(self, path: str) -> bytes:
        """A GET whose answer is bytes (an export archive), not JSON."""
        return self._request("GET", path, raw=True)

    def upload(self, path: Path, options: dict[str, Any], sent: Callable[[int], None] = lambda size: None, *,
               to: str = DATASETS, content: bytes | None = None) -> Any:
        """Import a local file (or folder) by sending its bytes, or content read from it (a decrypted archive), to
        an upload route: the daemon never opens a path of ours."""
        params, chunks = _upload(path, options, sent, content, self._upload_limit_mb)
        return self._request("POST", to, params=params, content=chunks,
                             headers={"Content-Type": "application/octet-stream"}, timeout=UPLOAD_TIMEOUT_S)

    def events(self, after: int = 0, subject: str | None = None) -> Iterator[dict[str, Any]]:
        """Server-sent events as dicts (seq, topic, subject, kind, data), until the caller stops reading."""
        resumed = False
        while True:
            try:
                with self._http.stream("GET", "/v1/events", params=_event_params(after, subject),
                                       timeout=None) as response:
                    _raise_for(response, response.read() if response.status_code >= 400 else b"")
                    resumed = False
                    for line in response.iter_lines():
                        if line.startswith("data: "):
                            event = json.loads(line.removeprefix("data: "))
                            after = event["seq"]
                            yield event
                return
            except httpx.TransportError as exc:
                if resumed or not _cut(exc):
                    raise _unreachable(exc, self._socket) from exc
                resumed = True

    def _request(self, method: str, path: str, raw: bool = False, **kwargs: Any) -> Any:
        for again in (False, True):  # a read cut off is asked once more; a change is not: it may have been made
            try:
                response = self._http.request(method, path, **kwargs)
                break
            except httpx.TransportError as exc:
                if again or method != "GET" or not _cut(exc):
                    raise _unreachable(exc, self._socket) from exc
        return _answer(response, raw)


class AsyncClient:
    def __init__(self, settings: config.Settings) -> None:
        self._http = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(settings.socket_path)),
                                       **_options(_token(settings)))
        self._socket = settings.socket_path
        self._upload_limit_mb = settings.daemon.max_upload_mb

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self._http.aclose()

    async def get(self, path: str, **params: Any) -> Any:
        return await self._request("GET", path, params={k: v for k, v in params.items() if v is not None})

    async def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return await self._request("POST", path, json=body or {})

    async def delete(self, path: str) -> Any:
        return await self._request("DELETE", path)

    async def download(self, path: str) -> bytes:
        return await self._request("GET", path, raw=True)

    async def upload(self, path: Path, options: dict[str, Any], *, to: str = DATASETS,
                     content: bytes | None = None) -> Any:
        """Client.upload, with the file measured and read off the event loop."""
        params, chunks = await asyncio.to_thread(_upload, path, options, lambda size: None, content,
                                                 self._upload_limit_mb)

        async def body() -> AsyncIterator[bytes]:
            while chunk := await asyncio.to_thread(next, chunks, b""):
                yield chunk

        return await self._request("POST", to, params=params, content=body(),
                                   headers={"Content-Type": "application/octet-stream"}, timeout=UPLOAD_TIMEOUT_S)

    async def events(self, after: int = 0, subject: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """Server-sent events as dicts, until the caller stops reading or the daemon goes away (DaemonError)."""
        resumed = False
        while True:
            try:
                async with self._http.stream("GET", "/v1/events", params=_event_params(after, subject),
                                             timeout=httpx.Timeout(TIMEOUT_S, read=EVENTS_SILENCE_S)) as response:
                    _raise_for(response, await response.aread() if response.status_code >= 400 else b"")
                    resumed = False
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            event = json.loads(line.removeprefix("data: "))
                            after = event["seq"]
                            yield event
                return
            except httpx.TransportError as exc:
                if resumed or not _cut(exc):
                    raise _unreachable(exc, self._socket) from exc
                resumed = True

    async def _request(self, method: str, path: str, raw: bool = False, **kwargs: Any) -> Any:
        for again in (False, True):  # a read cut off is asked once more; a change is not: it may have been made
            try:
                response = await self._http.request(method, path, **kwargs)
                break
            except httpx.TransportError as exc:
                if again or method != "GET" or not _cut(exc):
                    raise _unreachable(exc, self._socket) from exc
        return _answer(response, raw)


def _answer(response: httpx.Response, raw: bool) -> Any:
    """The body: bytes when raw, else JSON or text; an error status raised as its ApplianceError."""
    _raise_for(response, response.content)
    if raw:
        return response.content
    return response.json() if _is_json(response) else response.text


def _http(settings: config.Settings, token: str | None) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(settings.socket_path)), **_options(token))


def _options(token: str | None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # An idle connection is dropped well before the daemon closes it (uvicorn: after 5 s), or a request sent on
    # it just as the daemon closes it fails with a cut connection: a reconnect on the local socket costs little.
    return {"base_url": "http://appliance", "headers": headers, "timeout": TIMEOUT_S,
            "limits": httpx.Limits(keepalive_expiry=KEEPALIVE_S)}


def _upload(path: Path, options: dict[str, Any], sent: Callable[[int], None], content: bytes | None,
            limit_mb: float) -> tuple[dict[str, Any], Iterator[bytes]]:
    """The upload's query (the options and the file's name) and its body: the file (or content read from it), or
    the folder as a tar. One larger than the daemon takes (daemon.max_upload_mb) is refused before a byte is sent,
    not after a limit's worth of them."""
    size = len(content) if content is not None else sources.LocalPath(path).size()
    if size > limit_mb * 2**20:
        raise PayloadTooLarge(f"{path} holds {size:,} bytes, over the {limit_mb:g} MiB the appliance takes in an"
                              " upload (daemon.max_upload_mb)",
                              hint="raise daemon.max_upload_mb in the config file if the box has the room for it,"
                                   " or put it in daemon.import_dir and name it as a pipeline's source ('appliance"
                                   " jobs submit pipeline -p source=...')")
    if content is not None:
        sent(len(content))
        return {**options, "filename": path.name}, iter([content])
    if path.is_dir():
        return {**options, "filename": path.name + sources.TAR_SUFFIX}, sources.tar_stream(path, sent)

    def chunks() -> Iterator[bytes]:
        with path.open("rb") as file:
            while chunk := file.read(UPLOAD_CHUNK):
                sent(len(chunk))
                yield chunk

    return {**options, "filename": path.name}, chunks()


def _event_params(after: int, subject: str | None) -> dict[str, Any]:
    return {"after": after} | ({"subject": subject} if subject else {})


def _is_json(response: httpx.Response) -> bool:
    return response.headers.get("content-type", "").startswith("application/json")


def _token(settings: config.Settings) -> str | None:
    if os.environ.get("APPLIANCE_TOKEN"):
        return os.environ["APPLIANCE_TOKEN"]
    try:
        return settings.cli_token_path.read_text().strip()
    except OSError:
        return None  # the daemon answers 401 with a hint


def _raise_for(response: httpx.Response, content: bytes) -> None:
    if response.status_code < 400:
        return
    try:
        body = json.loads(content)
        kind, message, hint = _ERRORS.get(body.get("type"), ApplianceError), body["error"], body.get("hint")
    except (ValueError, KeyError, TypeError, AttributeError):
        kind, message, hint = ApplianceError, f"the daemon answered {response.status_code}", None
    if response.status_code == 401 and not os.environ.get("APPLIANCE_TOKEN"):
        hint = "set APPLIANCE_TOKEN to a token from 'appliance users add NAME --role ROLE'"
    if issubclass(kind, RateLimited):
        raise kind(message, hint=hint, retry_after_s=float(response.headers.get("Retry-After", 1)))
    raise kind(message, hint=hint)


def _subclasses(kind: type[ApplianceError]) -> list[type[ApplianceError]]:
    return [kind, *(found for sub in kind.__subclasses__() for found in _subclasses(sub))]


_ERRORS = {kind.__name__: kind for kind in _subclasses(ApplianceError)}  # what an error body's type may name


def _cut(exc: httpx.TransportError) -> bool:
    """Whether a connection that was open broke, rather than none opening or no answer coming in time: a kept-alive
    connection the daemon closes just as a request goes out on it breaks so, though the daemon is well."""
    return not isinstance(exc, (httpx.ConnectError, httpx.TimeoutException))


def _unreachable(exc: httpx.TransportError, socket: Path) -> DaemonUnreachable:
    """What went wrong on the way to the daemon, as a sentence naming its socket, and what to do."""
    if "Permission denied" in str(exc):
        return DaemonUnreachable(f"not allowed to open the daemon's socket {socket}",
                                 hint="run as the daemon's user or a member of its group, or use sudo")
    if isinstance(exc, httpx.ConnectError):
        what = "nothing listens on"
    elif isinstance(exc, httpx.TimeoutException):
        what = "no answer in time on"
    else:
        what = "the connection was cut on"
    return DaemonUnreachable(f"the daemon is not reachable: {what} {socket}",
                             hint="start it with 'appliance daemon' (or 'systemctl start appliance'); its log says "
                                  "why it stopped ('journalctl -u appliance')")
