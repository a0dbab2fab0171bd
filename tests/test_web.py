"""The edge both HTTP APIs share: every error class has a status from one table, and an error body names its class,
which the client raises again."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from fastapi import FastAPI

from appliance.core import config, errors
from appliance.core.errors import ApplianceError
from appliance.daemon.client import Client
from appliance.serve.web import EXCEPTION_HANDLERS, STATUS, status_of
from tests.daemon import short_dir

# What the classes answered when each carried its own status, and the two that BadRequest's instances once set.
KEPT = {errors.ApplianceError: 400, errors.FeedbackError: 400, errors.PredictionNotFound: 404,
        errors.AuditWriteFailed: 400, errors.AuditDiverged: 503, errors.JobError: 400, errors.JobNotFound: 404,
        errors.StudyNotFound: 404, errors.AuthError: 401, errors.Unauthenticated: 401, errors.Forbidden: 403,
        errors.DaemonError: 503, errors.DaemonUnreachable: 503, errors.BurstError: 400,
        errors.ResidencyRefused: 403, errors.ServeError: 503, errors.ModelNotFound: 404, errors.BadRequest: 400,
        errors.RateLimited: 429, errors.Overloaded: 503, errors.PayloadTooLarge: 413, errors.RequestTimeout: 408,
        errors.DatasetError: 400, errors.RegistryError: 400, errors.StoreError: 400,
        errors.DatasetNotFound: 404, errors.VersionNotFound: 404, errors.RunNotFound: 404}


def every_error() -> list[type[ApplianceError]]:
    def below(kind: type[ApplianceError]) -> list[type[ApplianceError]]:
        return [kind, *(found for sub in kind.__subclasses__() for found in below(sub))]

    return below(ApplianceError)


def test_the_table_gives_every_error_class_a_status_and_no_class_carries_one() -> None:
    found = every_error()
    assert len({kind.__name__ for kind in found}) == len(found)  # a body's type names exactly one class
    assert set(STATUS) <= set(found)
    for kind in found:
        assert status_of(kind) in (400, 401, 403, 404, 408, 413, 429, 503), kind
        assert not hasattr(kind, "status"), kind
    assert {kind: status_of(kind) for kind in KEPT} == KEPT


def make(kind: type[ApplianceError], message: str, hint: str | None) -> ApplianceError:
    if issubclass(kind, errors.RateLimited):
        return kind(message, hint=hint, retry_after_s=3)
    return kind(message, hint=hint)


@pytest.fixture
def failing(monkeypatch: pytest.MonkeyPatch) -> Iterator[config.Settings]:
    """A server on a unix socket with the shared error handlers, raising the error class its path names."""
    app = FastAPI(exception_handlers=EXCEPTION_HANDLERS)
    by_name = {kind.__name__: kind for kind in every_error()}

    @app.get("/fail/{name}")
    def fail(name: str) -> None:
        raise make(by_name[name], f"{name} happened", f"fix {name}")

    socket = short_dir() / "s"
    server = uvicorn.Server(uvicorn.Config(app, uds=str(socket), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    monkeypatch.setenv("APPLIANCE_DAEMON_SOCKET", str(socket))
    settings = config.load()
    monkeypatch.setenv("APPLIANCE_TOKEN", "apu_sent_but_never_checked")  # else a 401's hint says to set it
    yield settings
    server.should_exit = True
    thread.join(10)


def test_the_client_raises_the_class_an_error_body_names(failing: config.Settings,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    with Client(failing) as client:
        for kind in every_error():
            with pytest.raises(ApplianceError) as raised:
                client.get(f"/fail/{kind.__name__}")
            assert type(raised.value) is kind
            assert (raised.value.message, raised.value.hint) == (f"{kind.__name__} happened", f"fix {kind.__name__}")
            if kind is errors.RateLimited:
                assert raised.value.retry_after_s == 3  # type: ignore[attr-defined]
        with pytest.raises(ApplianceError) as raised:
            client.get("/no/such/route")  # typed RouteNotFound: no class of the tree
        assert type(raised.value) is ApplianceError and raised.value.message == "Not Found"
        monkeypatch.delenv("APPLIANCE_TOKEN")
        with pytest.raises(errors.Unauthenticated, match="Unauthenticated happened") as raised:
            client.get("/fail/Unauthenticated")
    assert raised.value.hint == "set APPLIANCE_TOKEN to a token from 'appliance users add NAME --role ROLE'"
