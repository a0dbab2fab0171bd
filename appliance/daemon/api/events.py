"""Server-sent events: job progress, stages and logs, deploys, drift alerts, as the store records them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from appliance.daemon.api.deps import Shared, Viewer
from appliance.store import events

EVENTS_POLL_S = 0.5

router = APIRouter()


@router.get("/v1/events", response_class=StreamingResponse)
async def event_stream(
    _user: Viewer, shared: Shared, after: Annotated[int, Query(ge=0)] = 0, subject: str | None = None
) -> StreamingResponse:
    """Server-sent events: job progress, stages and logs, deploys, drift alerts; resume with ?after=SEQ."""

    def read(seq: int) -> list[events.Event]:
        with shared.use() as store:
            return events.after(store, seq, subject)

    async def stream() -> AsyncIterator[str]:
        seq = after
        while not shared.closing.is_set():
            found = await asyncio.to_thread(read, seq)
            for event in found:
                seq = event.seq
                yield f"id: {event.seq}\nevent: {event.topic}.{event.kind}\ndata: {json.dumps(asdict(event), default=str)}\n\n"
            if not found:
                yield ": idle\n\n"  # a comment line: keeps proxies and clients from timing out
                await asyncio.sleep(EVENTS_POLL_S)

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})
