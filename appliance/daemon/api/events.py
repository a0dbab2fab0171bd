"""Server-sent events: job progress, stages and logs, deploys, drift alerts, as the store records them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from appliance.core.errors import RateLimited
from appliance.core.schema import SQLITE_MAX_INT
from appliance.daemon.api.deps import Shared, Viewer
from appliance.store import events

EVENTS_POLL_S = 0.5
STREAMS_PER_USER = 16  # open at once: a console or a followed job holds one, and each reads the store as it polls

router = APIRouter()


@router.get("/v1/events", response_class=StreamingResponse)
async def event_stream(
    user: Viewer, shared: Shared, after: Annotated[int, Query(ge=0, le=SQLITE_MAX_INT)] = 0, subject: str | None = None
) -> StreamingResponse:
    """Server-sent events: job progress, stages and logs, deploys, drift alerts; resume with ?after=SEQ. A user
    may hold STREAMS_PER_USER at once."""
    held = shared.streams.setdefault(user.id, set())
    if len(held) >= STREAMS_PER_USER:
        raise RateLimited(f"user {user.name} holds {STREAMS_PER_USER} event streams already, the most a user may",
                          retry_after_s=EVENTS_POLL_S, hint="close one (a console, a followed job) and ask again")
    request_task = asyncio.current_task()  # it runs until the stream ends, however it ends
    if request_task is not None:
        held.add(request_task)
        request_task.add_done_callback(held.discard)

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
