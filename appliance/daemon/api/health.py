"""The daemon itself: whether it answers (open to all), its OpenAPI document, its status and the hardware."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import asdict
from importlib import metadata
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from appliance.core import config, system
from appliance.core.errors import DaemonError
from appliance.daemon.api.deps import Settings, Shared, Viewer
from appliance.operations import jobs
from appliance.store import alerts, audit, events

HARDWARE_TIMEOUT_S = 120.0

open_router = APIRouter()  # no token, and no errors to document
router = APIRouter()


@open_router.get("/v1/health")
def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/openapi.json", include_in_schema=False)
def openapi(request: Request, _user: Viewer) -> JSONResponse:
    """The API's description, for any signed-in user: only health is open to all."""
    return JSONResponse(request.app.openapi())


@router.get("/v1/status")
def daemon_status(request: Request, _user: Viewer, shared: Shared, settings: Settings) -> dict[str, Any]:
    """The daemon, its jobs, how busy the box is, whether serving is ready, the last audit check, open alerts."""
    with shared.use() as store:
        counts = jobs.counts(store)
        checked = audit.last_check(store)
        last_event = events.last_seq(store)
        open_alerts = alerts.open_count(store)
    runtime = request.app.state.runtime
    return {**request.app.state.status(), "version": metadata.version("appliance"), "jobs": counts,
            "last_event": last_event, "load": asdict(system.load(settings.state_dir)),
            "serving_ready": bool(runtime and runtime.ready), "audit_check": checked, "open_alerts": open_alerts}


@router.get("/v1/hardware")
def hardware(request: Request, _user: Viewer, settings: Settings) -> dict[str, Any]:
    """What `appliance hw --json` says: the hardware, the default base model, and the training plan. Detected once,
    by one child process at a time: callers meanwhile wait for its report."""
    report: dict[str, Any] = request.app.state.hardware
    with _detecting:
        if not report:
            report.update(_detect_hardware(settings))
    return report


_detecting = threading.Lock()  # one detection at a time: each loads torch in a child process


def _detect_hardware(settings: config.Settings) -> dict[str, Any]:
    """`appliance hw --json` in a child process: detection loads torch and CUDA, kept out of the daemon's memory."""
    command = [sys.executable, "-m", "appliance", "hw", "--json"]
    if settings.config_file is not None:
        command[3:3] = ["--config", str(settings.config_file)]
    try:
        answer = subprocess.run(command, capture_output=True, text=True, timeout=HARDWARE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise DaemonError(f"hardware detection did not finish within {HARDWARE_TIMEOUT_S:.0f} s",
                          hint="run 'appliance hw' to see where it hangs") from exc
    if answer.returncode != 0:
        last = (answer.stderr.strip().splitlines() or ["no output"])[-2:]
        raise DaemonError(f"hardware detection failed: {' '.join(last)}", hint="run 'appliance hw' for the details")
    return json.loads(answer.stdout)
