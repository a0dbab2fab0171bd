"""The audit log: its records, a check of the whole chain, and an export for archiving elsewhere."""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse

from appliance.core import clock
from appliance.daemon.api import deps  # deps.actor: the routes' own `actor` is a query parameter
from appliance.daemon.api.deps import Admin, Shared, Since, Viewer
from appliance.store import alerts, audit

router = APIRouter()
VERIFY_REUSED_S = 60.0


class JsonLines(PlainTextResponse):
    media_type = "application/x-ndjson"


@router.get("/v1/audit")
def audit_records(
    _user: Viewer, shared: Shared, since: Since, actor: str | None = None, action: str | None = None,
    reads: bool = True, limit: Annotated[int, Query(ge=1, le=audit.LIST_MAX)] = 500,
) -> list[dict[str, Any]]:
    """Records, oldest first (the newest `limit`); action a glob such as 'keys.*'; reads=false leaves out api.read."""
    with shared.use() as store:
        return audit.records(store, since=since, actor=actor or None, action=action or None, reads=reads, limit=limit)


@router.post("/v1/audit/verify")
def verify_audit(user: Viewer, shared: Shared) -> dict[str, Any]:
    """Walk the whole chain and its anchored head now; the check itself goes on the record. Asked again within
    VERIFY_REUSED_S of the last check, that check's answer: a walk holds the store as long as the log is long, and
    each adds a record, so that a viewer asking without a pause would hold up the daemon and grow its log."""
    with shared.use() as store:
        checked_at, result = shared.last_verification or (-math.inf, None)
        if result is None or time.monotonic() - checked_at >= VERIFY_REUSED_S:
            result = alerts.check_audit(store, actor=deps.actor(user))
            shared.last_verification = (time.monotonic(), result)
        return asdict(result)


@router.get("/v1/audit/export", response_class=JsonLines)
def export_audit(user: Admin, shared: Shared, since: Since, actor: str | None = None, action: str | None = None,
                 reads: bool = True) -> JsonLines:
    """The records /v1/audit would list with these filters (all of them by default), oldest first, as JSON lines
    for archiving elsewhere; the export and its filters are recorded."""
    selected = {"since": since, "actor": actor or None, "action": action or None, "reads": reads}
    with shared.use() as store:
        lines = list(audit.export_jsonl(store, **selected))
        filters = {**selected, "since": since and clock.stamp(since)}
        audit.record(store, "audit.export", "api", actor=deps.actor(user), format="jsonl", records=len(lines),
                     filters={name: value for name, value in filters.items() if value not in (None, True)})
    return JsonLines("".join(line + "\n" for line in lines))
