"""The tamper-evident audit log: every state change of the appliance, one record each.

Each record holds time, actor, action, object, outcome and details, the previous
record's hash, its own hash and an HMAC under a key derived from the store secret.
Records are written in the same transaction as the change they describe
(operation()), so a change whose record cannot be written does not happen. After
each commit the signed head is written outside the database (anchor.py); verify()
walks the chain and compares its tail with that anchor and, optionally, an exported
checkpoint, and names the first bad record.

Every write first holds the chain's tail against the anchor (divergence()). A tail that
ends before the record the anchor vouches for, or holds another record there, means the
log was cut or an older copy of the database was put back: then nothing is written
(AuditDiverged), the daemon refuses to start or serve, and verify() keeps failing, until an
admin accepts the rewind in the open (accept_rewind(): an audited record of what was lost)
or restores a verified backup (recorded the same way). New records therefore never reuse
the numbers of lost ones, and no key revoked in the lost part can come back quietly.
"""

from __future__ import annotations

import getpass
import hashlib
import hmac
import json
import logging
import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from appliance.core import clock
from appliance.core.errors import AuditDiverged, AuditWriteFailed
from appliance.store import Store, anchor, keys
from appliance.store.db import transaction

log = logging.getLogger(__name__)

GENESIS = "0" * 64
FIELDS = ("seq", "ts", "actor", "action", "object", "outcome", "details", "prev_hash", "hash", "mac")
LIST_MAX = 10_000  # the most records one listing through the control API gives: the newest


def default_actor() -> str:
    return f"user:{getpass.getuser()}"


@contextmanager
def operation(
    store: Store, action: str, object: str, outcome: str = "ok", /, *, actor: str | None = None, **details: Any
) -> Iterator[dict[str, Any]]:
    """Run a state change and its audit record as one transaction.

    The block may add to the yielded details. If it raises, its changes are rolled
    back and a record with outcome "failed" and the error is written instead; otherwise the record has `outcome`
    ("failed" for a check that completed and found something wrong). The leading parameters are positional only,
    so that details may use their names (a run's "outcome").
    """
    actor = actor or default_actor()
    outermost = not store.db.conn.in_transaction
    try:
        with transaction(store.db):
            yield details
            _append(store, actor, action, object, outcome, details)
    except AuditWriteFailed:
        raise
    except Exception as exc:
        failed = {**details, "error": getattr(exc, "message", str(exc))}
        with transaction(store.db):
            _append(store, actor, action, object, "failed", failed)
        if outermost:
            _move_anchor(store)
        raise
    if outermost:
        _move_anchor(store)


def record(store: Store, action: str, object: str, outcome: str = "ok", /, *, actor: str | None = None,
           **details: Any) -> None:
    """Record an action that changed nothing in the database (an export, a backup file, a check)."""
    with operation(store, action, object, outcome, actor=actor, **details):
        pass


def _append(store: Store, actor: str, action: str, object: str, outcome: str, details: dict,
            *, rewind: bool = False) -> None:
    try:
        last = newest(store)
        if not rewind and (problem := divergence(store)):
            raise AuditDiverged(f"nothing was written: {problem}", hint=REWIND_HINT)
        seq, prev_hash = (last[0] + 1, last[1]) if last else (1, GENESIS)
        row = {
            "seq": seq,
            "ts": clock.stamp(),
            "actor": actor,
            "action": action,
            "object": object,
            "outcome": outcome,
            "details": json.dumps(details, sort_keys=True, separators=(",", ":"), default=str),
            "prev_hash": prev_hash,
        }
        row["hash"] = _hash(row)
        row["mac"] = _mac(store, row["hash"])
        store.db.execute(
            f"INSERT INTO audit ({', '.join(FIELDS)}) VALUES ({', '.join('?' * len(FIELDS))})",
            [row[name] for name in FIELDS],
        )
    except sqlite3.Error as exc:
        raise AuditWriteFailed(
            f"could not write the audit record for {action} {object}: {exc}; nothing was changed",
            hint="check free disk space and 'appliance store info'",
        ) from exc


def _move_anchor(store: Store, *, backwards: bool = False) -> None:
    last = newest(store)
    try:
        anchor.write_head(store, anchor.sign(store, last[0], last[1]), backwards=backwards)
    except OSError as exc:
        # The record is committed; the next write moves the anchor. verify() tolerates a lagging head.
        log.warning("audit head file %s not updated: %s", store.settings.audit_head_path, exc.strerror)


def _hash(row: dict[str, Any]) -> str:
    content = [row[name] for name in FIELDS[:8]]
    return hashlib.sha256(json.dumps(content, separators=(",", ":")).encode()).hexdigest()


def _mac(store: Store, chain_hash: str) -> str:
    key = keys.derive(store.secret, "appliance audit hmac")
    return hmac.new(key, chain_hash.encode(), hashlib.sha256).hexdigest()


# -- the anchor ----------------------------------------------------------------------

REWIND_HINT = ("if the rewind was meant (an older copy put back on purpose), an admin accepts it with"
               " 'appliance audit accept-rewind --reason TEXT', which records what was lost; else restore a verified"
               " backup ('appliance backup restore') and find out who changed the database")


def divergence(store: Store) -> str | None:
    """How the chain's tail disagrees with the head file that vouches for it, or None when it does not.

    A head that lags behind the tail is fine (the head is written just after each commit); one that vouches
    for a record the log no longer has, or has with another hash, is not. So is a missing or forged head
    once the log holds records.
    """
    path = store.settings.audit_head_path
    last = store.db.execute("SELECT seq FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
    last_seq = last[0] if last else 0
    head = anchor.read_head(path)
    if head is None:
        return None if last_seq == 0 else f"the audit head file {path} is missing, so a cut-off tail cannot be ruled out"
    if not head.is_signed_by(anchor.public_key(store)) or head.store_id != store.store_id:
        return f"the audit head file {path} is not signed by this store (forged, damaged or from another store)"
    if head.seq > last_seq:
        return (f"the audit log was rewound: its head file vouches for record {head.seq}, the log ends at"
                f" {last_seq} ({head.seq - last_seq} records lost, or an older copy of the database put back)")
    found = store.db.execute("SELECT hash FROM audit WHERE seq = ?", (head.seq,)).fetchone()
    if found is None or found[0] != head.hash:
        return (f"the audit log was rewritten: record {head.seq} differs from the one its head file vouches for"
                " (an older copy of the database put back, then written to)")
    return None


def accept_rewind(store: Store, reason: str, actor: str | None = None) -> dict[str, Any]:
    """Accept in the open that the log no longer reaches its anchored head: one record says what was lost,
    then the head moves back to it. Raises when there is nothing to accept."""
    problem = divergence(store)
    if problem is None:
        raise AuditWriteFailed("the audit log agrees with its head file: there is no rewind to accept",
                               hint="'appliance audit verify' checks the whole chain")
    head = anchor.read_head(store.settings.audit_head_path)
    last = newest(store)
    details = {"problem": problem, "reason": reason,
               "abandoned_head": {"seq": head.seq, "hash": head.hash} if head and head.seq > 0 else None,
               "log_tail": {"seq": last[0], "hash": last[1]} if last else None}
    record_rewind(store, "audit.rewind_accepted", store.store_id, actor=actor, **details)
    return details


def record_rewind(store: Store, action: str, object: str, *, actor: str | None = None, **details: Any) -> None:
    """A record written past a divergence on purpose (an accepted rewind, a restored backup), after which the head
    file vouches for this log and no longer for the one it replaced."""
    with transaction(store.db):
        _append(store, actor or default_actor(), action, object, "ok", details, rewind=True)
    _move_anchor(store, backwards=True)


# -- reading -----------------------------------------------------------------------


def rows(
    store: Store,
    *,
    since: datetime | None = None,
    actor: str | None = None,
    action: str | None = None,
    reads: bool = True,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Records in order, filtered; action may be a glob such as 'keys.*'; without reads, no `api.read` records
    (who looked at what: many, and seldom what an operator is after)."""
    where, params = _where(since, actor, action, reads)
    sql = f"SELECT {', '.join(FIELDS)} FROM audit{where} ORDER BY seq DESC" + (f" LIMIT {int(limit)}" if limit else "")
    newest_first = [dict(zip(FIELDS, row)) for row in store.db.execute(sql, params)]
    return newest_first[::-1]


def records(store: Store, **filters: Any) -> list[dict[str, Any]]:
    """rows() with their details as JSON objects: what `audit list` and the control API show."""
    return [{**row, "details": json.loads(row["details"])} for row in rows(store, **filters)]


def _where(since: datetime | None, actor: str | None, action: str | None, reads: bool) -> tuple[str, list[str]]:
    """The WHERE clause (with its leading space, or empty) and parameters of rows()' and export_jsonl()'s filters."""
    conditions, params = [], []
    if since is not None:
        conditions.append("ts >= ?")
        params.append(clock.stamp(since))
    if actor is not None:
        conditions.append("actor = ?")
        params.append(actor)
    if action is not None:
        conditions.append("action GLOB ?")
        params.append(action)
    if not reads:
        conditions.append("action != 'api.read'")
    return (" WHERE " + " AND ".join(conditions) if conditions else ""), params


def count(store: Store, action: str) -> int:
    """How many records of this action the log holds (a glob such as 'keys.*' too)."""
    return store.db.execute("SELECT COUNT(*) FROM audit WHERE action GLOB ?", (action,)).fetchone()[0]


def newest(store: Store) -> tuple[int, str] | None:
    """The newest record's seq and hash: the head of the chain; None for an empty log."""
    row = store.db.execute("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
    return (row[0], row[1]) if row else None


def parse_since(text: str) -> datetime:
    """A moment given as a date or time (2026-11-01, 2026-11-01T08:00, UTC unless it says) or an age (30m, 12h, 7d).

    Raises ValueError with a message that says what is accepted.
    """
    relative = re.fullmatch(r"([0-9]{1,18})([mhd])", text.strip())
    if relative:
        amount, unit = int(relative[1]), relative[2]
        try:
            return clock.now() - timedelta(**{{"m": "minutes", "h": "hours", "d": "days"}[unit]: amount})
        except OverflowError:
            raise ValueError(f"{text!r} reaches back before the year 1") from None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither a date (2026-11-01) nor an age (30m, 12h, 7d)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def export_jsonl(store: Store, *, since: datetime | None = None, actor: str | None = None,
                 action: str | None = None, reads: bool = True) -> Iterator[str]:
    """The records rows() would list, oldest first, each as one JSON line with its details parsed, for archiving
    elsewhere (each line keeps its hash and MAC, so a part of the log can still be checked record by record)."""
    where, params = _where(since, actor, action, reads)
    for row in store.db.execute(f"SELECT {', '.join(FIELDS)} FROM audit{where} ORDER BY seq", params):
        record_ = dict(zip(FIELDS, row))
        record_["details"] = json.loads(record_["details"])
        yield json.dumps(record_, sort_keys=True)


def checkpoint(store: Store) -> anchor.Head:
    """A signed head for safekeeping outside the appliance; the export itself is recorded."""
    record(store, "audit.checkpoint", store.store_id)
    last = newest(store)
    return anchor.sign(store, last[0], last[1])


# -- verifying ---------------------------------------------------------------------


@dataclass(frozen=True)
class Verification:
    """The result of walking the chain: ok, or the first problem and where it is."""

    ok: bool
    records: int
    problem: str | None = None
    first_bad: int | None = None
    rewound: str | None = None  # a checkpoint the log does not reach, and the rewind on record that gave it up


def verify(store: Store, checkpoint_file: Path | None = None, *, head_file: bool = True) -> Verification:
    """Walk the whole chain, then hold its tail against the head file and a checkpoint.

    A backup is checked with head_file=False: the live head is meant to be ahead of it.
    """
    previous_seq, previous_hash = 0, GENESIS
    hashes: dict[int, str] = {}
    for row in store.db.execute(f"SELECT {', '.join(FIELDS)} FROM audit ORDER BY seq"):
        row = dict(zip(FIELDS, row))
        seq = row["seq"]
        if seq != previous_seq + 1:
            return _bad(
                previous_seq,
                previous_seq + 1,
                f"record {previous_seq + 1} is missing: the chain jumps from {previous_seq} to {seq} (deleted)",
            )
        if _hash(row) != row["hash"]:
            return _bad(previous_seq, seq, f"record {seq} was changed: its contents do not match its hash (edited or moved)")
        if not hmac.compare_digest(_mac(store, row["hash"]), row["mac"]):
            return _bad(previous_seq, seq, f"record {seq} has a MAC this store did not write (forged)")
        if row["prev_hash"] != previous_hash:
            return _bad(
                previous_seq,
                seq,
                f"record {seq} does not follow record {previous_seq}: records were deleted, inserted or reordered",
            )
        previous_seq, previous_hash = seq, row["hash"]
        hashes[seq] = row["hash"]

    anchors = [("head file", store.settings.audit_head_path)] if head_file else []
    if checkpoint_file is not None:
        anchors.append(("checkpoint", checkpoint_file))
    rewound = None
    for name, path in anchors:
        problem = _check_anchor(store, name, path, hashes, previous_seq)
        if isinstance(problem, _Rewound):
            rewound = problem.sentence
        elif problem:
            return Verification(False, previous_seq, *problem)
    return Verification(True, previous_seq, rewound=rewound)


def check(store: Store, checkpoint_file: Path | None = None, actor: str | None = None) -> Verification:
    """verify(), with its outcome put on the record, so the log shows when it was last checked and by whom
    (alerts.check_audit() also raises an alert when it fails)."""
    result = verify(store, checkpoint_file)
    if divergence(store) is None:  # a log that diverged from its anchor takes no record, this one neither
        record(store, "audit.verify", store.store_id, "ok" if result.ok else "failed", actor=actor, ok=result.ok,
               first_bad=result.first_bad, **({"rewound": result.rewound} if result.rewound else {}))
    return result


def last_check(store: Store) -> dict[str, Any] | None:
    """The most recent check(): when, by whom, and its outcome; None if the log was never checked."""
    row = store.db.execute(
        "SELECT ts, actor, details FROM audit WHERE action = 'audit.verify' ORDER BY seq DESC LIMIT 1"
    ).fetchone()
    if row is None:
        return None
    details = json.loads(row[2])
    return {"at": row[0], "actor": row[1], "ok": details.get("ok"), "first_bad": details.get("first_bad")}


def _bad(good: int, first_bad: int, problem: str) -> Verification:
    return Verification(False, good, problem, first_bad)


@dataclass(frozen=True)
class _Rewound:
    sentence: str


def _check_anchor(
    store: Store, name: str, path: Path, hashes: dict[int, str], last: int
) -> tuple[str, int | None] | _Rewound | None:
    """None where the anchor vouches for this log; a problem and its first bad record; or, for a checkpoint of
    records a rewind on record gave up, that rewind named, for whoever holds the checkpoint to judge: someone with
    the store's secret could write such a record too, so it is never passed over in silence."""
    head = anchor.read_head(path)
    if head is None:
        if name == "head file" and last == 0:
            return None  # a new store: nothing written, nothing to anchor
        return (f"the {name} {path} is missing, so a cut-off tail cannot be ruled out", None)
    if not head.is_signed_by(anchor.public_key(store)) or head.store_id != store.store_id:
        return (f"the {name} {path} is not signed by this store (forged, damaged or from another store)", None)
    if (head.seq > last or hashes.get(head.seq) != head.hash) and name == "checkpoint" and \
            (rewind := _rewind_that_gave_up(store, head.seq)):
        return _Rewound(f"the checkpoint vouches for record {head.seq} of a log that {rewind} gave up; the log"
                        " after that record is not the one it vouched for")
    if head.seq > last:
        return (
            f"the log is truncated: the {name} vouches for record {head.seq}, the log ends at {last}",
            last + 1,
        )
    if hashes.get(head.seq) != head.hash:
        return (f"record {head.seq} differs from the one the {name} vouches for (replaced)", head.seq)
    return None


def _rewind_that_gave_up(store: Store, seq: int) -> str | None:
    """The rewind the log records (an accepted rewind, a restored backup) that gave up record seq, in words: its
    record, time and actor; None where none did."""
    for rewind_seq, ts, actor, action, details in store.db.execute(
        "SELECT seq, ts, actor, action, details FROM audit"
        " WHERE action IN ('audit.rewind_accepted', 'backup.restored') AND outcome = 'ok' ORDER BY seq"
    ):
        found = json.loads(details)
        kept, abandoned = found.get("log_tail") or found.get("backup_head"), found.get("abandoned_head")
        if abandoned and (kept["seq"] if kept else 0) < seq <= abandoned["seq"]:
            return f"the {action} on record {rewind_seq} ({ts}, by {actor})"
    return None
