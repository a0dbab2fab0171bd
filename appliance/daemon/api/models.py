"""Model versions: listed, deployed (with a canary share), rolled back."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter
from pydantic import Field

from appliance import operations, registry
from appliance.daemon.api.deps import Operator, Shared, Viewer, actor
from appliance.serve.web import Body

router = APIRouter()


class DeployRequest(Body):
    version: int | None = Field(None, ge=1, description="default: the newest version")
    canary_percent: float | None = Field(None, gt=0, le=100)


@router.get("/v1/models")
def list_models(_user: Viewer, shared: Shared) -> list[dict[str, Any]]:
    with shared.use() as store:
        return [{**asdict(version), "servable": version.servable} for version in registry.list_versions(store)]


@router.post("/v1/models/{model}/deploy")
def deploy(model: str, body: DeployRequest, user: Operator, shared: Shared) -> dict[str, Any]:
    ref = f"{model}:{body.version}" if body.version else model
    with shared.use() as store:
        return asdict(registry.deploy(store, ref, body.canary_percent, actor=actor(user)))


@router.post("/v1/models/{model}/rollback")
def rollback(model: str, user: Operator, shared: Shared) -> dict[str, Any]:
    with shared.use() as store:
        done = operations.rollback(store, model, actor=actor(user))
    return {"model": model, **({"canary": "stopped"} if done.canary_stopped else {"production": done.production})}
