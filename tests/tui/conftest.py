"""The TUI's fixtures: a real daemon that has served a model, and a recording of a daemon for snapshots."""

from __future__ import annotations

import asyncio
import copy
import json
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from appliance.core import config
from appliance.core.errors import ApplianceError
from appliance.store import lifecycle
from tests.conftest import write_tickets
from tests.daemon import TINY, Daemon, environment, settings_of, submit
from tui.app import ApplianceApp

RECORDED = Path(__file__).with_name("recorded.json")
SIZE = (80, 24)  # the smallest terminal the TUI promises to work in


@pytest.fixture(scope="module")
def served(tiny_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon that has imported the tickets, fine-tuned the tiny model, optimised it and serves it."""
    root = tmp_path_factory.mktemp("served")
    env = environment(root / "var", tiny_base)
    settings = settings_of(env)
    lifecycle.init(settings).close()
    running = Daemon(env, settings)
    running.start()
    job = submit(running, "pipeline", {"source": write_tickets(settings.daemon.import_dir / "t.csv").name, "dataset": "tickets",
                                       "params": TINY})
    assert running.ended(job)["status"] == "finished"
    running.wait(lambda: _serves(running), 120, "the deployed model was not loaded")
    yield running
    if running.process is not None:
        running.stop(signal.SIGKILL)


def _serves(daemon: Daemon) -> bool:
    with daemon.api() as api:
        models = api.get("/v1/serving").json()["models"]
    return bool(models) and models[0]["ready"]


async def settle(pilot: Any, until: Callable[[], Any], seconds: float = 30.0, message: str = "") -> Any:
    """Let the app work until `until()` holds (the TUI fetches in the background)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        await pilot.pause(0.1)
        found = until()
        if found:
            return found
    raise AssertionError(message or "the TUI did not get there in time")


def text(app: ApplianceApp, selector: str) -> str:
    """What a widget shows, as plain text."""
    return str(app.screen.query_one(selector).render())


RECORDED_STUDY = "9b41964badf0"  # the hyperparameter search in the recording


class RecordedDaemon:
    """Answers as a real daemon once did (recorded.json, times pinned to a past day): a screen looks the same
    on every run, which a live daemon, with its fresh ids and clocks, cannot give. The recording's shape is
    held against a live daemon by test_screens.py, so it cannot drift from the real API unnoticed."""

    def __init__(self) -> None:
        self.answers: dict[str, Any] = json.loads(RECORDED.read_text())

    async def get(self, path: str, **params: Any) -> Any:
        answer = self._answer(f"GET {path}")
        if path == "/v1/audit" and params.get("reads") is False:  # as the daemon filters
            answer = [record for record in answer if record["action"] != "api.read"]
        return answer

    async def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._answer(f"POST {path}")

    async def upload(self, path: Path, options: dict[str, Any], **_route: Any) -> Any:
        raise ApplianceError("tickets.csv: 2 problems\n  tickets.csv line 3: empty text\n  tickets.csv line 7: 1"
                             " field, but the header has 2", hint="fix them and import again; nothing was stored")

    async def events(self, after: int = 0, subject: str | None = None) -> AsyncIterator[dict[str, Any]]:
        for event in self.answers["events"]:
            if event["seq"] > after and subject in (None, event["subject"]):
                yield event
        await asyncio.Event().wait()  # a live stream stays open

    def _answer(self, key: str) -> Any:
        if key not in self.answers:
            raise ApplianceError(f"nothing recorded for {key}")
        return copy.deepcopy(self.answers[key])


@pytest.fixture
def recorded_app(monkeypatch: pytest.MonkeyPatch) -> Iterator[ApplianceApp]:
    monkeypatch.setenv("TZ", "UTC")  # times are shown in local time: pin it, or the pictures depend on the zone
    time.tzset()
    yield ApplianceApp(daemon=RecordedDaemon(), settings=config.load())
    monkeypatch.undo()
    time.tzset()
