"""The control API's client when a connection breaks under it: a read is asked again once, a change never is, and
an event stream resumes where it stopped. The daemon here is a bare HTTP/1.1 server on a real unix socket that cuts
the connections a test chooses, since the real daemon breaks one only by a race no test can time."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.core import config
from appliance.core.errors import DaemonUnreachable
from appliance.daemon.client import AsyncClient, Client
from tests.daemon import short_dir


class CuttingServer:
    """Answers each request line it reads, except the ones numbered in `cut`, whose connection it closes unanswered.
    /v1/events answers two events after ?after= and closes mid-stream, as a daemon would that went away."""

    def __init__(self, path: Path, cut: set[int]) -> None:
        self.requests: list[str] = []
        self._cut = cut
        self._listener = socket.socket(socket.AF_UNIX)
        self._listener.bind(str(path))
        self._listener.listen()
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        with connection, connection.makefile("rb") as reading:
            while head := reading.readline():
                while reading.readline() not in (b"\r\n", b""):
                    pass
                line = head.decode().split()[1]
                self.requests.append(line)
                if len(self.requests) in self._cut:
                    return
                if line.startswith("/v1/events"):
                    after = int(line.partition("after=")[2].partition("&")[0] or 0)
                    chunks = "".join(f"data: {json.dumps({'seq': after + n})}\n\n" for n in (1, 2))
                    connection.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                                       b"transfer-encoding: chunked\r\n\r\n"
                                       + f"{len(chunks):x}\r\n{chunks}\r\n".encode())
                    return  # cut mid-stream: no last chunk
                body = json.dumps({"path": line}).encode()
                connection.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                   + f"content-length: {len(body)}\r\n\r\n".encode() + body)


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> config.Settings:
    monkeypatch.setenv("APPLIANCE_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("APPLIANCE_DAEMON_SOCKET", str(short_dir() / "s"))
    monkeypatch.setenv("APPLIANCE_TOKEN", "test-token")
    return config.load()


@pytest.fixture
def serving(settings: config.Settings) -> Iterator[set[int]]:
    """The server on the settings' socket; the test names (1-based) the requests whose connection it cuts."""
    cut: set[int] = set()
    server = CuttingServer(settings.socket_path, cut)
    yield cut
    server.close()


def test_a_read_whose_connection_is_cut_is_asked_once_more(settings: config.Settings, serving: set[int]) -> None:
    serving.update({1})
    with Client(settings) as client:
        assert client.get("/v1/status") == {"path": "/v1/status"}


def test_a_read_cut_twice_reports_the_daemon_unreachable(settings: config.Settings, serving: set[int]) -> None:
    serving.update({1, 2})
    with Client(settings) as client, pytest.raises(DaemonUnreachable, match="the connection was cut"):
        client.get("/v1/status")


def test_a_change_whose_connection_is_cut_is_not_made_again(settings: config.Settings, serving: set[int]) -> None:
    serving.update({1})
    with Client(settings) as client, pytest.raises(DaemonUnreachable, match="the connection was cut"):
        client.post("/v1/jobs", {"kind": "train"})


def test_the_console_client_asks_a_cut_read_once_more(settings: config.Settings, serving: set[int]) -> None:
    serving.update({1})

    async def ask() -> object:
        async with AsyncClient(settings) as client:
            return await client.get("/v1/status")

    assert asyncio.run(ask()) == {"path": "/v1/status"}


def test_a_cut_event_stream_resumes_after_the_last_event_it_gave(settings: config.Settings,
                                                                 serving: set[int]) -> None:
    serving.update({3})  # each stream is cut after two events; the second resumption is cut before any
    seen = []
    with Client(settings) as client, pytest.raises(DaemonUnreachable, match="the connection was cut"):
        for event in client.events(after=10):
            seen.append(event["seq"])
    assert seen == [11, 12, 13, 14]


def test_the_console_follows_a_cut_event_stream_on(settings: config.Settings, serving: set[int]) -> None:
    serving.update({3})
    seen = []

    async def follow() -> None:
        async with AsyncClient(settings) as client:
            async for event in client.events(after=20):
                seen.append(event["seq"])

    with pytest.raises(DaemonUnreachable, match="the connection was cut"):
        asyncio.run(follow())
    assert seen == [21, 22, 23, 24]
