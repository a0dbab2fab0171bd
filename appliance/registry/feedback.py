"""Feedback: the true labels of served predictions, and what they say about each model version.

The server gives every text it answers a prediction id and keeps a record of it: model,
version, label, confidence and the text, sealed with AES-256-GCM under a key derived
from the store secret (the row's id is the AAD, so a sealed text cannot be moved to
another row). Records wait in memory (`PredictionLog`) and the server's store thread
writes them at each poll, so no request touches the database. Predictions without
feedback are deleted after `serve.keep_predictions_days`, and the oldest of them sooner
when a model's waiting ones pass `serve.keep_predictions_mb` (sealed bytes; `trim`).

A true label attached later (`POST /v1/feedback` on either server, or `appliance
feedback import FILE.csv`) is checked against the labels the version knows, stored
and audited; all of a request's labels are stored, or none. Feedback not yet used for
training becomes, at the next retrain, a new version of the dataset the served model
learned from (`datasets.extend`); each feedback row names the dataset version it went
into, which is the lineage from dataset back to predictions.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from appliance import registry
from appliance.core import clock, files
from appliance.core.errors import DatasetError, FeedbackError, Forbidden, PredictionNotFound, TamperDetected
from appliance.data import datasets
from appliance.store import Store, audit, keys
from appliance.store.db import transaction
from appliance.train import runs

SEAL_PURPOSE = "appliance prediction texts v1"
WINDOWS = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}
MAX_ITEMS = 10_000  # labels in one request or file
MAX_FILE_BYTES = 4 * 2**20  # a feedback file: MAX_ITEMS lines of an id and a label take well under a MiB
MAX_SHOWN = 20


@dataclass(frozen=True)
class Evidence:
    """Feedback on one version's predictions: how many, and how many it had right."""

    feedback: int
    correct: int

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.feedback if self.feedback else None


@dataclass(frozen=True)
class Kept:
    """A model's served texts kept (sealed) for feedback: how many, how many have a true label, the oldest."""

    model: str
    kept: int
    labelled: int
    oldest: str


class PredictionLog:
    """Predictions answered and not yet written: filled on the event loop, emptied on the store thread.

    deque's append and popleft are atomic, so the two threads need no lock. Past `limit` waiting records
    the oldest are dropped (and counted): a stuck store must not grow the server without bound. A record holds
    its time as time.time() gave it, written out as a stored time on the store thread (the event loop spared 3 µs
    a request).
    """

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self.dropped = 0
        self._pending: deque[tuple[str, str, int, str, float, str, float]] = deque()

    def add(self, model: str, version: int, labels: list[str], probabilities: np.ndarray,
            examples: list[str] | list[bytes | np.ndarray]) -> list[str]:
        """Record one answer per example (a text, or an image file's bytes; an image's pixels prepared by the
        caller are not kept); returns their prediction ids, in order. The rows are read as Python floats: numpy's
        argmax and scalars on a row of a few labels cost the event loop more than the lists do."""
        now = time.time()
        ids = new_ids(len(examples))
        for prediction_id, example, row in zip(ids, examples, probabilities.tolist(), strict=True):
            text = b"" if isinstance(example, np.ndarray) else example
            confidence = max(row)
            self._pending.append((prediction_id, model, version, labels[row.index(confidence)], confidence, text, now))
        while len(self._pending) > self.limit:
            self._pending.popleft()
            self.dropped += 1
        return ids

    def flush(self, store: Store) -> dict[str, int]:
        """Write what waits, in one transaction; returns the sealed bytes written per model."""
        taken = []
        while self._pending:
            taken.append(self._pending.popleft())
        if not taken:
            return {}
        aead = _cipher(store)
        rows = [(pid, model, version, label, confidence, _seal(aead, pid, text),
                 clock.stamp(datetime.fromtimestamp(at, UTC)))
                for pid, model, version, label, confidence, text, at in taken]
        with transaction(store.db):
            store.db.conn.executemany(
                "INSERT INTO predictions (id, model, version, label, confidence, text_sealed, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        written: dict[str, int] = {}
        for row in rows:
            written[row[1]] = written.get(row[1], 0) + len(row[5])
        return written


def new_ids(count: int) -> list[str]:
    """Prediction ids: the millisecond they were made (11 hex digits), then 64 random bits, which keep an id
    unguessable. In time order, so the predictions table's key grows at its end: in the store's 64 KiB pages, with
    100,000 predictions kept a random key cost SQLite 34 µs of CPU a row to insert and with 1.2 million 73 µs (109 of
    time: pages read back from disk and rewritten to the WAL whole), an ordered one 7 (10-12) at either size. The
    random bits of a request's ids come in one read."""
    stamp = f"p_{time.time_ns() // 1_000_000:011x}"
    random = secrets.token_hex(8 * count)
    return [stamp + random[16 * i : 16 * (i + 1)] for i in range(count)]


# -- true labels ---------------------------------------------------------------------


def record(store: Store, items: Iterable[tuple[str, str]], *, actor: str, source: str = "api",
           allowed: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """Attach true labels to predictions, all or none; `allowed(model)` says whose predictions the caller may label.

    A second label for the same prediction replaces the first (and is used again at the next retrain).
    """
    items = list(items)
    if not items:
        raise FeedbackError("no feedback given", hint='send {"feedback": [{"prediction_id": "p_...", "label": "..."}]}')
    if len(items) > MAX_ITEMS:
        raise FeedbackError(f"{len(items)} labels in one go; at most {MAX_ITEMS} are taken",
                            hint="split them into several requests or files")
    found = _predictions(store, [prediction_id for prediction_id, _ in items])
    problems, missing, rows, by_model = [], [], [], {}
    known_labels: dict[tuple[str, int], list[str]] = {}
    for prediction_id, label in items:
        prediction = found.get(prediction_id)
        if prediction is None:
            missing.append(prediction_id)
            continue
        model, version, predicted = prediction
        if allowed is not None and not allowed(model):
            raise Forbidden(f"this key may not send feedback on prediction {prediction_id}: its model is not in the"
                            " key's scope", hint="use a key whose scope includes that model")  # not named: not the key's
        labels = known_labels.setdefault((model, version), version_labels(store, model, version))
        if label not in labels:
            problems.append(f"{prediction_id}: {label!r} is not a label of {model}:{version}"
                            f" (its labels: {', '.join(labels)})")
            continue
        rows.append((prediction_id, label, int(label == predicted), source, actor, clock.stamp()))
        by_model[model] = by_model.get(model, 0) + 1
    if missing and len(missing) == len(items):
        shown = ", ".join(missing[:MAX_SHOWN])
        raise PredictionNotFound(f"no prediction with the id {shown}" if len(missing) == 1
                                 else f"none of the {len(missing)} prediction ids is known: {shown}",
                                 hint="send the id the server answered with; predictions without feedback are kept"
                                      f" {store.settings.serve.keep_predictions_days:g} days")
    problems += [f"{prediction_id}: no such prediction" for prediction_id in missing]
    if problems:
        listing = "\n".join(f"  {problem}" for problem in problems[:MAX_SHOWN])
        more = f"\n  and {len(problems) - MAX_SHOWN} more" if len(problems) > MAX_SHOWN else ""
        raise FeedbackError(f"{len(problems)} of {len(items)} labels cannot be taken:\n{listing}{more}",
                            hint="fix them and send all again; nothing was stored")
    with audit.operation(store, "feedback.add", ",".join(sorted(by_model)), actor=actor, source=source,
                         labels=len(rows), by_model=by_model):
        store.db.conn.executemany(
            "INSERT OR REPLACE INTO feedback (prediction_id, label, correct, source, actor, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)", rows)
    return {"accepted": len(rows), "by_model": by_model}


def read_csv(path: Path) -> list[tuple[str, str]]:
    """(prediction_id, label) pairs from a CSV file with those columns; every problem with its line."""
    files.regular_file(path, "the feedback file", MAX_FILE_BYTES, error=FeedbackError,
                       over=f"split it into files of at most {MAX_ITEMS:,} labels")
    rows, problems = datasets.csv_rows(path, ("prediction_id", "label"))
    pairs = []
    for where, fields in rows:
        prediction_id, label = fields["prediction_id"].strip(), fields["label"].strip()
        if not prediction_id or not label:
            problems.append(f"{where}: {'prediction_id' if not prediction_id else 'label'} is empty")
        else:
            pairs.append((prediction_id, label))
    if problems:
        raise DatasetError("\n".join([f"{path.name}: {len(problems)} problems", *problems[:MAX_SHOWN]])
                           if len(problems) > 1 else problems[0], hint="fix the file and import it again;"
                                                                       " nothing was stored")
    if not pairs:
        raise DatasetError(f"{path.name} holds no labels", hint="under the header prediction_id,label, a line per"
                                                                " prediction: its id as the server answered, its label")
    return pairs


def version_labels(store: Store, model: str, version: int) -> list[str]:
    """The labels a version can answer: those of the dataset its run trained on."""
    run = runs.get(store, registry.get(store, f"{model}:{version}").run_id)
    return datasets.get(store, run.dataset_id).labels


# -- what feedback says ----------------------------------------------------------------


# The queries over feedback say CROSS JOIN, which makes SQLite walk feedback and look each prediction up by id.
# Left to itself, with no statistics, it walks every prediction of the model and probes feedback for each: that
# grows with traffic (every answer is kept for `serve.keep_predictions_days`), while feedback is the labelled few.


def evidence(store: Store, model: str, version: int, since: str | None = None) -> Evidence:
    """Feedback on a version's predictions made since a time (ISO), or ever."""
    row = store.db.execute(
        "SELECT COUNT(*), COALESCE(SUM(f.correct), 0)"
        " FROM feedback f CROSS JOIN predictions p ON p.id = f.prediction_id"
        " WHERE p.model = ? AND p.version = ? AND p.created_at >= ?", (model, version, since or "")).fetchone()
    return Evidence(*row)


def quality(store: Store, model: str | None = None) -> list[dict[str, Any]]:
    """Live accuracy on feedback by model version, over the last hour, day and week (by prediction time)."""
    now = clock.now()
    versions = store.db.execute(
        "SELECT DISTINCT p.model, p.version FROM feedback f CROSS JOIN predictions p ON p.id = f.prediction_id"
        + (" WHERE p.model = ?" if model else "") + " ORDER BY p.model, p.version", (model,) if model else ()
    ).fetchall()
    answer = []
    for name, version in versions:
        windows = {}
        for label, span in WINDOWS.items():
            found = evidence(store, name, version, clock.stamp(now - span))
            windows[label] = {"feedback": found.feedback, "correct": found.correct, "accuracy": found.accuracy}
        answer.append({"model": name, "version": version, "windows": windows})
    return answer


def report(store: Store, model: str | None = None) -> list[dict[str, Any]]:
    """quality(), each entry with the labels of its model not trained on yet (`feedback show`, the control API);
    VersionNotFound for a model that does not exist, rather than no feedback."""
    if model is not None:
        registry.newest(store, model)
    return [{**entry, "unused_labels": unused(store, entry["model"])} for entry in quality(store, model)]


def unused(store: Store, model: str) -> int:
    """Labels on a model's predictions that no dataset version holds yet."""
    return store.db.execute(
        "SELECT COUNT(*) FROM feedback f CROSS JOIN predictions p ON p.id = f.prediction_id"
        " WHERE p.model = ? AND f.dataset_id IS NULL", (model,)).fetchone()[0]


def extend_dataset(store: Store, model: str, actor: str) -> datasets.DatasetVersion:
    """The newest version of the dataset the model's production version learned from, plus the unused feedback.

    The feedback rows are marked with the new version in the same transaction, so a retrain that is
    interrupted and run again does not add them twice.
    """
    served = registry.get(store, f"{model}@production")
    trained_on = datasets.get(store, runs.get(store, served.run_id).dataset_id)
    base = datasets.get(store, trained_on.name)  # the newest: it already holds earlier feedback
    rows = store.db.execute(
        "SELECT p.id, p.text_sealed, f.label FROM feedback f CROSS JOIN predictions p ON p.id = f.prediction_id"
        " WHERE p.model = ? AND f.dataset_id IS NULL ORDER BY f.created_at", (model,)).fetchall()
    if not rows:
        raise FeedbackError(f"there is no new feedback on {model} to train on",
                            hint="send true labels with POST /v1/feedback or 'appliance feedback import'")
    aead = _cipher(store)
    image = trained_on.task == datasets.IMAGE
    additions = [(kept if image else kept.decode(), label) for kept, label in
                 ((_open(aead, prediction_id, sealed), label) for prediction_id, sealed, label in rows) if kept]
    with transaction(store.db):
        made = datasets.extend(store, base, additions, actor=actor,
                               source=f"{base.ref} + feedback on {len(rows)} predictions of {model}")
        store.db.conn.executemany("UPDATE feedback SET dataset_id = ? WHERE prediction_id = ?",
                                  [(made.id, prediction_id) for prediction_id, _, _ in rows])
    return made


def used_by(store: Store, dataset_id: str) -> list[str]:
    """The predictions whose feedback went into a dataset version."""
    return [row[0] for row in store.db.execute(
        "SELECT prediction_id FROM feedback WHERE dataset_id = ? ORDER BY prediction_id", (dataset_id,))]


def kept(store: Store) -> list[Kept]:
    """What each model's served texts amount to, by model."""
    return [Kept(*row) for row in store.db.execute(
        "SELECT p.model, COUNT(*), COUNT(f.prediction_id), MIN(p.created_at) FROM predictions p"
        " LEFT JOIN feedback f ON f.prediction_id = p.id GROUP BY p.model ORDER BY p.model")]


def purge(store: Store, keep_days: float) -> int:
    """Delete predictions older than keep_days that nobody labelled; returns how many went."""
    cutoff = clock.stamp(clock.now() - timedelta(days=keep_days))
    with transaction(store.db):
        gone = store.db.execute(
            "DELETE FROM predictions WHERE created_at < ? AND id NOT IN (SELECT prediction_id FROM feedback)",
            (cutoff,)).rowcount
    return gone


def waiting_bytes(store: Store) -> dict[str, int]:
    """The sealed bytes of the predictions waiting for a label, per model (one pass over the table)."""
    return dict(store.db.execute(
        "SELECT model, SUM(length(text_sealed)) FROM predictions"
        " WHERE id NOT IN (SELECT prediction_id FROM feedback) GROUP BY model").fetchall())


def trim(store: Store, model: str, excess: int, *, actor: str, limit_bytes: int) -> int:
    """Delete a model's oldest predictions waiting for a label until excess sealed bytes are gone, audited in the same
    transaction; returns the bytes deleted. Labelled ones stay: they are the next training data."""
    doomed, size = [], 0
    with contextlib.closing(store.db.execute(
            "SELECT id, length(text_sealed) FROM predictions p WHERE model = ?"
            " AND NOT EXISTS (SELECT 1 FROM feedback f WHERE f.prediction_id = p.id) ORDER BY created_at, rowid",
            (model,))) as oldest_first:
        for prediction_id, length in oldest_first:
            if size >= excess:
                break
            doomed.append(prediction_id)
            size += length
    if doomed:
        with audit.operation(store, "serve.predictions_trimmed", model, actor=actor, rows=len(doomed), bytes=size,
                             limit_bytes=limit_bytes):
            forget(store, doomed)
    return size


def matching(store: Store, needle: str) -> dict[str, list[str]]:
    """The predictions whose text or true label contains needle (in any case), by model: for an erasure. An image
    model's predictions match by their true label alone."""
    folded, aead, found = needle.casefold(), _cipher(store), {}
    for prediction_id, model, sealed, label, image in store.db.execute(
            "SELECT p.id, p.model, p.text_sealed, f.label, v.task = ? FROM predictions p"
            " LEFT JOIN feedback f ON f.prediction_id = p.id"
            " LEFT JOIN model_versions v ON v.model = p.model AND v.version = p.version ORDER BY p.id",
            (datasets.IMAGE,)):
        # A deleted version's task is unknown here: its kept bytes are read as text, leniently (an erasure that
        # matches more than it must errs on the safe side).
        if folded in (label or "").casefold() or (not image and folded in _open(aead, prediction_id, sealed)
                                                   .decode(errors="replace").casefold()):
            found.setdefault(model, []).append(prediction_id)
    return found


def forget(store: Store, prediction_ids: list[str]) -> int:
    """Delete predictions and, with them, their feedback (ON DELETE CASCADE); the caller audits."""
    gone = 0
    for start in range(0, len(prediction_ids), 500):
        chunk = prediction_ids[start:start + 500]
        gone += store.db.execute(f"DELETE FROM predictions WHERE id IN ({', '.join('?' * len(chunk))})",
                                 chunk).rowcount
    return gone


# -- sealing ---------------------------------------------------------------------------


def _predictions(store: Store, ids: list[str]) -> dict[str, tuple[str, int, str]]:
    found = {}
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        found.update({row[0]: tuple(row[1:]) for row in store.db.execute(
            f"SELECT id, model, version, label FROM predictions WHERE id IN ({', '.join('?' * len(chunk))})", chunk)})
    return found


def _cipher(store: Store) -> AESGCM:
    return AESGCM(keys.derive(store.secret, SEAL_PURPOSE))


def _seal(aead: AESGCM, prediction_id: str, example: str | bytes) -> bytes:
    nonce = os.urandom(12)
    plain = example.encode() if isinstance(example, str) else example
    return nonce + aead.encrypt(nonce, plain, prediction_id.encode())


def _open(aead: AESGCM, prediction_id: str, sealed: bytes) -> bytes:
    try:
        return aead.decrypt(sealed[:12], sealed[12:], prediction_id.encode())
    except InvalidTag as exc:
        raise TamperDetected(f"the stored text of prediction {prediction_id} does not authenticate") from exc
