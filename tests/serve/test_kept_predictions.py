"""Kept prediction texts bounded by size per model: the oldest waiting for a label go first, audited."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from appliance.registry import feedback
from appliance.store import Store, audit
from tests.test_feedback import LABELS, answer, served_version


def test_trimming_deletes_the_oldest_unlabelled_predictions_of_one_model(opened: Store, tmp_path: Path) -> None:
    tickets = served_version(opened, tmp_path)
    log = feedback.PredictionLog()
    labelled, *older = answer(opened, log, tickets, ["x" * 1000] * 4)
    newer = answer(opened, log, tickets, ["y" * 1000] * 4)
    elsewhere = log.add("other", 1, LABELS, np.tile([0.5, 0.5], (4, 1)), ["z" * 1000] * 4)
    log.flush(opened)
    feedback.record(opened, [(labelled, "billing")], actor="user:ann")
    sealed = 1000 + 28  # nonce and tag
    assert feedback.waiting_bytes(opened) == {"tickets": 7 * sealed, "other": 4 * sealed}

    gone = feedback.trim(opened, "tickets", 2 * sealed + 1, actor="service:serve", limit_bytes=4 * sealed)
    present = {row[0] for row in opened.db.execute("SELECT id FROM predictions")}
    assert gone == 3 * sealed and present == {labelled, *newer, *elsewhere} and not present & set(older)
    [record] = audit.rows(opened, action="serve.predictions_trimmed")
    assert record["object"] == "tickets" and record["actor"] == "service:serve"
    assert json.loads(record["details"]) == {"rows": 3, "bytes": 3 * sealed, "limit_bytes": 4 * sealed}
    assert feedback.trim(opened, "tickets", 0, actor="service:serve", limit_bytes=0) == 0  # nothing over: no record
    assert len(audit.rows(opened, action="serve.predictions_trimmed")) == 1


def test_a_flush_says_how_many_sealed_bytes_each_model_got(opened: Store, tmp_path: Path) -> None:
    version = served_version(opened, tmp_path)
    log = feedback.PredictionLog()
    log.add(version.model, version.version, LABELS, np.tile([0.9, 0.1], (2, 1)), ["ab", "cdé"])
    assert log.flush(opened) == {"tickets": (2 + 28) + (4 + 28)} and log.flush(opened) == {}
