"""Model versions: imported (an upload, or a name in daemon.import_dir), listed, deployed (with a canary share),
rolled back, deleted."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import Field

from appliance import operations, registry
from appliance.access import users
from appliance.core import schema
from appliance.daemon.api.deps import (
    UPLOAD_BODY,
    Admin,
    Operator,
    Settings,
    Shared,
    SharedStore,
    Viewer,
    actor,
    received,
)
from appliance.data import sources
from appliance.serve.web import Body

UPLOAD_PATH = "/v1/models:import"
router = APIRouter()


class DeployRequest(Body):
    version: int | None = Field(None, ge=1, le=10**18 - 1, description="default: the newest version")
    canary_percent: float | None = Field(None, gt=0, le=100)


class ImportOptions(Body):
    """What to call an imported model and what to measure it on; the model comes as the body or from
    daemon.import_dir (operations/imports.py says which forms are taken)."""

    name: str = Field(pattern=schema.NAME.pattern, description="the model's name; the import is its next version")
    dataset: str = Field(min_length=1, max_length=200, description=(
        "the dataset (name, name:version or id) it is measured on; its labels must be among the model's, and its"
        " task is the model's"))
    # Bounded so that an upload's query, percent-encoded, stays well inside what the HTTP parser takes (about 80 KB):
    # a model with more labels names them in its config.json.
    labels: list[Annotated[str, Field(min_length=1, max_length=48)]] = Field(
        default_factory=list, max_length=64,
        description="the model's labels in logit order, where its config.json or card does not name them")
    public_key: str | None = Field(None, min_length=1, max_length=128,
                                   description="an export archive must be signed by this key (hex, or its SHA-256)")
    task: Literal["text-classification", "image-classification"] | None = Field(
        None, description="what the model does; it must be the dataset's task")


class ModelUploadOptions(ImportOptions):
    filename: str = Field(min_length=1, max_length=255, description=(
        "the model's name as sent: a folder comes as an uncompressed tar of its files, an export archive as itself"))


class ModelImportDirRequest(ImportOptions):
    file: str = Field(min_length=1, max_length=255, description=(
        "a model folder or an export archive inside daemon.import_dir, by its name there; links are refused"))


@router.post(UPLOAD_PATH, status_code=201, openapi_extra=UPLOAD_BODY)
async def upload_model(request: Request, user: Operator, options: Annotated[ModelUploadOptions, Query()],
                       shared: Shared) -> dict[str, Any]:
    """Check the model in the body, measure it on the dataset and store it as a new version; the daemon reads
    nothing but the bytes sent."""
    from appliance.operations import imports  # torch and OpenVINO load for an import only

    announced = sources.Upload(options.filename, b"", folder=False)  # its name, before a byte of it is read
    await asyncio.to_thread(imports.check_request, shared.use, announced, name=options.name, dataset=options.dataset,
                            task=options.task, actor=actor(user))
    async with received(request) as data:
        return await asyncio.to_thread(_import, shared, sources.Upload(options.filename, data, folder=False), options,
                                       user)


@router.post("/v1/models:import-dir", status_code=201)
def import_model_from_dir(body: ModelImportDirRequest, user: Operator, shared: Shared,
                          settings: Settings) -> dict[str, Any]:
    """Check and store a model folder or export archive that root put in daemon.import_dir."""
    return _import(shared, sources.ImportDir(settings, body.file), body, user)


def _import(shared: SharedStore, source: sources.Source, options: ImportOptions, user: users.User) -> dict[str, Any]:
    from appliance.operations import imports  # torch and OpenVINO load for an import only

    version = imports.import_model(shared.use, source, name=options.name, dataset=options.dataset,
                                   labels=options.labels, public_key=options.public_key, task=options.task,
                                   actor=actor(user))
    with shared.use() as store:
        return registry.describe(store, version.ref)


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
