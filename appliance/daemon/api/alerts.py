"""Alerts: what needs an operator's eye, listed until acknowledged."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from appliance.daemon.api.deps import Operator, Shared, Viewer, actor
from appliance.store import alerts

router = APIRouter()


@router.get("/v1/alerts")
def list_alerts(_user: Viewer, shared: Shared, all: bool = False,
                limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[dict[str, Any]]:
    """Open alerts, newest first; with all=true, the acknowledged ones too."""
    with shared.use() as store:
        return [asdict(alert) for alert in alerts.listed(store, acknowledged=all, limit=limit)]


@router.post("/v1/alerts/{alert_id}/acknowledge")
def acknowledge_alert(alert_id: Annotated[int, Path(ge=1, le=2**62)], user: Operator,
                      shared: Shared) -> dict[str, Any]:
    """Mark an alert seen: it leaves the open list, and who saw it when goes on the record."""
    with shared.use() as store:
        return asdict(alerts.acknowledge(store, alert_id, actor(user)))
