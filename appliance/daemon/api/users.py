"""Who may call what (admin): the control API's users, and keys for the inference server."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter
from pydantic import Field

from appliance.access import auth, users
from appliance.daemon.api.deps import Admin, Shared, actor
from appliance.serve.web import Body

router = APIRouter()


class ApiKeyRequest(Body):
    name: str
    models: list[str] = Field(default_factory=lambda: [auth.ALL_MODELS])
    may_label: bool = Field(False, description="may also send true labels for its predictions, which go into "
                                               "retraining")


@router.post("/v1/api-keys", status_code=201)
def create_api_key(body: ApiKeyRequest, user: Admin, shared: Shared) -> dict[str, Any]:
    """A key for the inference server; the token is in this answer and nowhere else, ever."""
    with shared.use() as store:
        key, token = auth.create(store, body.name, body.models, actor=actor(user), may_label=body.may_label)
    return {**asdict(key), "token": token}


@router.get("/v1/users")
def list_users(_user: Admin, shared: Shared) -> list[dict[str, Any]]:
    with shared.use() as store:
        return [asdict(user) for user in users.list_users(store)]
