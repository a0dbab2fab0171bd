"""Datasets: imported from an upload or from daemon.import_dir, listed, kept on this box or let out, deleted."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import Field

from appliance import operations
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
from appliance.data import datasets, sources
from appliance.serve.web import Body

UPLOAD_PATH = "/v1/datasets"

router = APIRouter()


class ImportOptions(Body):
    """How to read a dataset and what to call it; the file itself comes as the body or from daemon.import_dir."""

    name: str = Field(pattern=schema.NAME.pattern, description="the dataset's name; new content becomes its next version")
    task: Literal["text-classification", "image-classification"] = datasets.TEXT
    text_column: str = Field("text", min_length=1, max_length=200, description="CSV column or JSON field of the text")
    label_column: str = Field("label", min_length=1, max_length=200, description="... and of the label")
    validation_fraction: float = Field(0.2, gt=0, lt=1)
    seed: int = Field(13, ge=0, le=2**32 - 1)
    max_text_chars: int = Field(datasets.MAX_TEXT_CHARS, ge=16, le=10**7,
                                description="characters of one text; a longer one is cut, or left out")
    long_texts: Literal["truncate", "skip"] = Field(
        "truncate", description="a text over max_text_chars: cut to its beginning and end (half of max_text_chars"
                                " each), or left out")
    residency: Literal["local-only", "burst-allowed"] = Field(
        datasets.LOCAL_ONLY, description="local-only, or burst-allowed: may go (encrypted) to the Ray cluster")


class UploadOptions(ImportOptions):
    filename: str = Field(min_length=1, max_length=255, description=(
        "the file's name: .csv, .tsv or .jsonl for texts; an image folder is sent as an uncompressed .tar of its class"
        " folders"))


class ImportDirRequest(ImportOptions):
    file: str = Field(min_length=1, max_length=255, description=(
        "a file or folder inside daemon.import_dir, by its name relative to that folder; links are refused"))


class ResidencyRequest(Body):
    residency: str = Field(description="local-only | burst-allowed")


@router.get("/v1/datasets")
def list_datasets(_user: Viewer, shared: Shared) -> list[dict[str, Any]]:
    with shared.use() as store:
        return [version.summary() for version in datasets.list_versions(store)]


@router.get("/v1/datasets/{ref}/detail")
def dataset_detail(ref: str, _user: Viewer, shared: Shared) -> dict[str, Any]:
    """One version (name, name:version or an id prefix) with its examples per class, the model versions trained
    on it, the served predictions whose true labels went into it, and what replaced it."""
    with shared.use() as store:
        return operations.describe_dataset(store, ref)


@router.post(UPLOAD_PATH, status_code=201, openapi_extra=UPLOAD_BODY)
async def upload_dataset(
    request: Request, user: Operator, options: Annotated[UploadOptions, Query()], shared: Shared
) -> dict[str, Any]:
    """Check and store the file in the body (a folder of images as a tar); an unchanged file answers with
    the version it already is. The daemon reads nothing but the bytes sent."""
    folder = options.task == datasets.IMAGE
    announced = sources.Upload(options.filename, b"", folder=folder)  # its name and shape, before a byte of it
    await asyncio.to_thread(_check, shared, announced, options, user)
    async with received(request) as data:
        return await asyncio.to_thread(_import, shared, sources.Upload(options.filename, data, folder=folder), options,
                                       user)


@router.post("/v1/datasets/import-dir", status_code=201)
def import_from_dir(body: ImportDirRequest, user: Operator, shared: Shared, settings: Settings) -> dict[str, Any]:
    """Check and store a file or folder that root put in daemon.import_dir, named relative to it."""
    return _import(shared, sources.ImportDir(settings, body.file), body, user)


@router.post("/v1/datasets/{ref}/residency")
def set_residency(ref: str, body: ResidencyRequest, user: Operator, shared: Shared) -> list[dict[str, Any]]:
    """Whether a dataset (every version of a name, or name:version) may leave this box for a burst."""
    with shared.use() as store:
        return [asdict(version) for version in datasets.set_residency(store, ref, body.residency, actor=actor(user))]


@router.delete("/v1/datasets/{ref}/content")
def delete_dataset(ref: str, user: Admin, shared: Shared) -> list[dict[str, Any]]:
    """Delete the content of a dataset (every version of a name, or name:version); the rows stay for lineage."""
    with shared.use() as store:
        return [version.summary() for version in operations.delete_dataset(store, ref, actor=actor(user))]


def _check(shared: SharedStore, source: sources.Source, options: ImportOptions, user: users.User) -> None:
    with shared.use() as store:
        datasets.check_request(store, source, name=options.name, task=options.task,
                               validation_fraction=options.validation_fraction, residency=options.residency,
                               long_texts=options.long_texts, actor=actor(user))


def _import(shared: SharedStore, source: sources.Source, options: ImportOptions, user: users.User) -> dict[str, Any]:
    fields = options.model_dump(exclude={"filename", "file"})
    with shared.use() as store:
        known = {version.id for version in datasets.list_versions(store)}
        version = datasets.import_data(store, source, **fields, actor=actor(user))
    return {**version.summary(), "unchanged": version.id in known}
