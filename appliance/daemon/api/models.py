"""Model versions: listed, deployed (with a canary share), rolled back, deleted."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import Field

from appliance import operations, registry
from appliance.daemon.api.deps import Admin, Operator, Shared, Viewer, actor
from appliance.serve.web import Body

router = APIRouter()


class DeployRequest(Body):
    version: int | None = Field(None, ge=1, description="default: the newest version")
    canary_percent: float | None = Field(None, gt=0, le=100)


@router.get("/v1/models")
def list_models(_user: Viewer, shared: Shared) -> list[dict[str, Any]]:
    with shared.use() as store:
        return [version.summary() for version in registry.list_versions(store)]


@router.get("/v1/models/{ref}")
def describe_model(ref: str, _user: Viewer, shared: Shared) -> dict[str, Any]:
    """One version (MODEL, MODEL:VERSION or MODEL@ALIAS): its variants, aliases, the guard's decision, lineage."""
    with shared.use() as store:
        return registry.describe(store, ref)


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


@router.delete("/v1/models/{model}/versions/{version}")
def delete_version(model: str, version: Annotated[int, Path(ge=1)], user: Admin, shared: Shared) -> dict[str, Any]:
    """Delete a version and its weights; refused while it serves, is the candidate, or a rollback could return to it."""
    with shared.use() as store:
        deleted = registry.delete(store, f"{model}:{version}", actor=actor(user))
    return {"model": deleted.model, "version": deleted.version, "deleted": True}
