"""Data subject requests (admin): what holds an identifier, or its erasure everywhere, audited."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import Field

from appliance.daemon.api.deps import Admin, Shared, actor
from appliance.operations import privacy
from appliance.serve.web import Body

router = APIRouter()


class ErasureRequest(Body):
    subject: str = Field(min_length=1, description="the identifier (email address, customer id); never logged")
    dry_run: bool = Field(False, description="list what would be erased, change nothing")


@router.post("/v1/privacy/erase")
def erase_subject(body: ErasureRequest, user: Admin, shared: Shared) -> dict[str, Any]:
    """A data subject request (admin): what holds the identifier, or erase it everywhere, audited."""
    with shared.use() as store:
        found = privacy.find(store, body.subject) if body.dry_run else privacy.erase(store, body.subject,
                                                                                     actor=actor(user))
    return found.summary()
