"""Usage accounting: job CPU/GPU time and inference requests, by day, user and model."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter

from appliance.daemon.api.deps import Shared, Since, Viewer
from appliance.registry import usage

router = APIRouter()


@router.get("/v1/usage")
def usage_report(
    _user: Viewer, shared: Shared, since: Since, by: Literal["user", "model"] | None = None,
) -> list[dict[str, Any]]:
    """Usage by day (and user and model, or by=user|model): job CPU/GPU hours, inference requests and hours."""
    with shared.use() as store:
        return usage.report(store, since.date() if since else None, by)
