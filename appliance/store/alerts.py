"""What needs an operator's eye, kept until someone says they have seen it.

Drift on a served model, a failed job, a canary the autopilot rolled back, an audit
log that does not verify: each raises an alert that stays, across restarts, until an
operator acknowledges it (`appliance alerts ack`, or the TUI's Overview), which goes
on the record. The same trouble raised again while its alert is open adds to that
alert (its count, last time and latest message) rather than making another, so a model
that drifts all day is one alert. Every raise and acknowledgement is also an event
(topic "alert") for whoever watches live.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from appliance.core import clock
from appliance.core.errors import AlertNotFound
from appliance.core.schema import SQLITE_MAX_INT
from appliance.store import Store, audit, events
from appliance.store.db import transaction

Source = Literal["drift", "job", "autopilot", "audit", "backup"]
Severity = Literal["warning", "error"]

_COLUMNS = "id, source, subject, severity, message, raised_at, last_at, count, acknowledged_at, acknowledged_by"


@dataclass(frozen=True)
class Alert:
    id: int
    source: Source
    subject: str  # the model, job or store it is about
    severity: Severity
    message: str  # the latest raise's: what happened and what to do
    raised_at: str
    last_at: str
    count: int  # raises while it was open
    acknowledged_at: str | None
    acknowledged_by: str | None


def raise_alert(store: Store, source: Source, subject: str, severity: Severity, message: str) -> Alert:
    """Open an alert about subject, or add this raise to the one still open."""
    now = clock.stamp()
    with transaction(store.db):
        row = store.db.execute("SELECT id FROM alerts WHERE source = ? AND subject = ? AND acknowledged_at IS NULL",
                               (source, subject)).fetchone()
        if row is None:
            alert_id = store.db.execute(
                "INSERT INTO alerts (source, subject, severity, message, raised_at, last_at) VALUES (?, ?, ?, ?, ?, ?)",
                (source, subject, severity, message, now, now)).lastrowid
        else:
            alert_id = row[0]
            store.db.execute("UPDATE alerts SET severity = ?, message = ?, last_at = ?, count = count + 1 WHERE id = ?",
                             (severity, message, now, alert_id))
        events.emit(store, "alert", subject, "raised",
                    {"id": alert_id, "source": source, "severity": severity, "message": message})
    return get(store, alert_id)


def check_audit(store: Store, checkpoint_file: Path | None = None, actor: str | None = None) -> audit.Verification:
    """audit.check(), and an alert that stays until acknowledged when the log does not verify."""
    result = audit.check(store, checkpoint_file, actor)
    if not result.ok:
        raise_alert(store, "audit", store.store_id, "error",
                    f"the audit log does not verify: {result.problem}; leave the machine as it is and restore the "
                    "last good backup ('appliance backup list')")
    return result


def listed(store: Store, *, acknowledged: bool = False, limit: int = 100) -> list[Alert]:
    """Open alerts, newest first; with acknowledged, the acknowledged ones too."""
    where = "" if acknowledged else " WHERE acknowledged_at IS NULL"
    rows = store.db.execute(f"SELECT {_COLUMNS} FROM alerts{where} ORDER BY last_at DESC, id DESC LIMIT ?", (limit,))
    return [Alert(*row) for row in rows]


def open_count(store: Store) -> int:
    return store.db.execute("SELECT COUNT(*) FROM alerts WHERE acknowledged_at IS NULL").fetchone()[0]


def get(store: Store, alert_id: int) -> Alert:
    row = (store.db.execute(f"SELECT {_COLUMNS} FROM alerts WHERE id = ?", (alert_id,)).fetchone()
           if 0 < alert_id <= SQLITE_MAX_INT else None)
    if row is None:
        raise AlertNotFound(f"no alert {alert_id}", hint="'appliance alerts --all' lists them")
    return Alert(*row)


def acknowledge(store: Store, alert_id: int, actor: str) -> Alert:
    """Mark an alert seen, by whom; acknowledging one already acknowledged changes nothing."""
    alert = get(store, alert_id)
    if alert.acknowledged_at is not None:
        return alert
    with audit.operation(store, "alert.acknowledge", str(alert_id), actor=actor, source=alert.source,
                         subject=alert.subject):
        store.db.execute("UPDATE alerts SET acknowledged_at = ?, acknowledged_by = ? WHERE id = ?",
                         (clock.stamp(), actor, alert_id))
        events.emit(store, "alert", alert.subject, "acknowledged", {"id": alert_id, "by": actor})
    return get(store, alert_id)
