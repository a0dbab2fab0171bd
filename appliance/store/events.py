"""What user interfaces follow: job stages, progress, logs and outcomes, deploys, drift alerts.

Events are rows with an increasing seq in the store; the control API streams them as
server-sent events and a client resumes after the last seq it saw. They are for
watching, not for the record: the audit log is the record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from appliance.core import clock
from appliance.store import Store
from appliance.store.db import transaction

PROGRESS_KEPT = timedelta(days=7)  # a job reports progress every second: weeks of it would only fill the disk


@dataclass(frozen=True)
class Event:
    seq: int
    ts: str
    topic: str  # job | deploy | drift
    subject: str  # a job id or a model name
    kind: str
    data: dict[str, Any]


def emit(store: Store, topic: str, subject: str, kind: str, data: dict[str, Any]) -> None:
    with transaction(store.db):
        store.db.execute(
            "INSERT INTO events (ts, topic, subject, kind, data) VALUES (?, ?, ?, ?, ?)",
            (clock.stamp(), topic, subject, kind, json.dumps(data, default=str)),
        )


def prune_progress(store: Store, older_than: timedelta = PROGRESS_KEPT) -> int:
    """Drop progress reports older than this (a job's stages, logs and outcome stay); how many went."""
    cutoff = clock.stamp(clock.now() - older_than)
    with transaction(store.db):
        return store.db.execute("DELETE FROM events WHERE kind = 'progress' AND ts < ?", (cutoff,)).rowcount


def forget(store: Store, topic: str, subject: str) -> int:
    """Drop every event of one subject (a deleted job's stages, progress and log); how many went."""
    with transaction(store.db):
        return store.db.execute("DELETE FROM events WHERE topic = ? AND subject = ?", (topic, subject)).rowcount


def last_seq(store: Store) -> int:
    """The newest event's seq (0 if none): where a client that wants only what comes next starts."""
    return store.db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]


def latest(store: Store, topic: str, kind: str, subject: str, since: str = "") -> Event | None:
    """The newest event of this topic, kind and subject stamped after `since`, if any."""
    row = store.db.execute(
        "SELECT seq, ts, topic, subject, kind, data FROM events"
        " WHERE topic = ? AND kind = ? AND subject = ? AND ts > ? ORDER BY seq DESC LIMIT 1",
        (topic, kind, subject, since)).fetchone()
    return Event(*row[:5], json.loads(row[5])) if row else None


def after(store: Store, seq: int, subject: str | None = None, limit: int = 500) -> list[Event]:
    """Events newer than seq (all, or one job's or model's), oldest first."""
    where, params = ("AND subject = ?", (subject,)) if subject else ("", ())
    rows = store.db.execute(
        f"SELECT seq, ts, topic, subject, kind, data FROM events WHERE seq > ? {where} ORDER BY seq LIMIT ?",
        (seq, *params, limit),
    )
    return [Event(*row[:5], json.loads(row[5])) for row in rows]
