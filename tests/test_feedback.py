"""Feedback on a real store: predictions kept sealed, true labels checked and stored, feedback becoming data."""

from __future__ import annotations

import json
import os
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from appliance import registry
from appliance.core.errors import DatasetError, FeedbackError, Forbidden, PredictionNotFound
from appliance.data import datasets
from appliance.registry import feedback
from appliance.store import Store, audit, blobs
from appliance.train import runs
from tests.conftest import run_cli

LABELS = ["billing", "shipping"]


def served_version(opened: Store, tmp_path: Path, model: str = "tickets", accuracy: float = 0.9,
                   base_model: Path | None = None) -> registry.ModelVersion:
    """A version in production whose run trained on a two-label dataset (from the default base model unless told);
    no real model needed to label its answers."""
    path = tmp_path / f"{model}.csv"
    path.write_text("text,label\n" + "".join(f"old text {n},{LABELS[n % 2]}\n" for n in range(20)))
    data = datasets.import_file(opened, path, name=model)
    run_id = runs.create(opened, dataset_id=data.id, base_model=str(base_model or opened.settings.base_model),
                         task=data.task, params={"epochs": 3}, plan={"device": "cpu"})
    artifact = blobs.put(opened, f"{model} ir {accuracy}".encode())
    variant = registry.Variant("fp32", "openvino-ir", artifact, 10, {"accuracy": accuracy})
    version = registry.register(opened, model, run_id=run_id, task=data.task, chosen="fp32", reason="test",
                                variants=[variant])
    return registry.deploy(opened, version.ref)


def answer(opened: Store, log: feedback.PredictionLog, version: registry.ModelVersion, texts: list[str],
           first_label: bool = True) -> list[str]:
    """What the server does for a request: probabilities in, ids out, written at the next poll."""
    probabilities = np.tile([0.8, 0.2] if first_label else [0.3, 0.7], (len(texts), 1))
    ids = log.add(version.model, version.version, LABELS, probabilities, texts)
    log.flush(opened)
    return ids


def test_prediction_ids_are_distinct_and_in_the_order_the_predictions_were_made(opened: Store, tmp_path: Path) -> None:
    """So the predictions table's key grows at its end rather than anywhere in it; 64 random bits each."""
    version, log = served_version(opened, tmp_path), feedback.PredictionLog()
    earlier = answer(opened, log, version, ["one", "two", "three"])
    time.sleep(0.002)  # the next millisecond
    later = answer(opened, log, version, ["four"])
    assert all(re.fullmatch(r"p_[0-9a-f]{11}[0-9a-f]{16}", i) for i in earlier + later)
    assert len({i[-16:] for i in earlier + later}) == 4 and max(earlier) < later[0]
    stored = [row[0] for row in opened.db.execute("SELECT id FROM predictions ORDER BY rowid").fetchall()]
    assert stored == earlier + later


def test_predictions_are_kept_sealed_and_get_ids(opened: Store, tmp_path: Path) -> None:
    version = served_version(opened, tmp_path)
    log = feedback.PredictionLog()
    secret = "customer 4711 asks about the refund for order 99812"
    ids = answer(opened, log, version, [secret, "second text"])
    assert len(set(ids)) == 2 and all(i.startswith("p_") for i in ids)
    rows = opened.db.execute("SELECT id, model, version, label, text_sealed FROM predictions ORDER BY id").fetchall()
    assert {row[0] for row in rows} == set(ids) and {row[3] for row in rows} == {"billing"}
    opened.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    on_disk = b"".join(path.read_bytes() for path in opened.settings.state_dir.glob("appliance.db*"))
    # Parts of it too; but not digits alone, which the store's hex ids and hashes may hold by chance.
    assert secret.encode() not in on_disk and b"customer 4711" not in on_disk and b"order 99812" not in on_disk


def test_a_full_log_drops_the_oldest_and_counts_them(opened: Store, tmp_path: Path) -> None:
    version = served_version(opened, tmp_path)
    log = feedback.PredictionLog(limit=3)
    ids = log.add(version.model, version.version, LABELS, np.tile([0.9, 0.1], (5, 1)), [f"t{n}" for n in range(5)])
    assert log.dropped == 2
    log.flush(opened)
    kept = {row[0] for row in opened.db.execute("SELECT id FROM predictions")}
    assert kept == set(ids[2:])


def test_true_labels_are_stored_audited_and_counted_by_version(opened: Store, tmp_path: Path) -> None:
    version = served_version(opened, tmp_path)
    log = feedback.PredictionLog()
    ids = answer(opened, log, version, [f"new text {n}" for n in range(4)])  # all answered "billing"
    labels = [(ids[0], "billing"), (ids[1], "shipping"), (ids[2], "shipping")]
    result = feedback.record(opened, labels, actor="user:ann")
    assert result == {"accepted": 3, "by_model": {"tickets": 3}}
    found = feedback.evidence(opened, "tickets", version.version)
    assert (found.feedback, found.correct) == (3, 1)
    feedback.record(opened, [(ids[0], "shipping")], actor="user:ann")  # a correction replaces the first label
    assert feedback.evidence(opened, "tickets", version.version).correct == 0
    [entry] = feedback.quality(opened, "tickets")
    assert entry["windows"]["1h"] == {"feedback": 3, "correct": 0, "accuracy": 0.0}
    records = [row for row in audit.rows(opened) if row["action"] == "feedback.add"]
    assert len(records) == 2 and json.loads(records[0]["details"])["labels"] == 3
    assert records[0]["actor"] == "user:ann"


def test_bad_feedback_is_refused_whole_and_names_each_problem(opened: Store, tmp_path: Path) -> None:
    version = served_version(opened, tmp_path)
    ids = answer(opened, feedback.PredictionLog(), version, ["a text", "another"])
    with pytest.raises(FeedbackError) as refused:
        feedback.record(opened, [(ids[0], "billing"), (ids[1], "returns"), ("p_0000000000000000", "billing")],
                        actor="user:ann")
    assert "2 of 3 labels cannot be taken" in refused.value.message
    assert "'returns' is not a label of tickets:1 (its labels: billing, shipping)" in refused.value.message
    assert "p_0000000000000000: no such prediction" in refused.value.message
    assert "nothing was stored" in refused.value.hint
    assert opened.db.execute("SELECT COUNT(*) FROM feedback").fetchone()[0] == 0
    with pytest.raises(PredictionNotFound):
        feedback.record(opened, [("p_0000000000000000", "billing")], actor="user:ann")
    with pytest.raises(Forbidden):
        feedback.record(opened, [(ids[0], "billing")], actor="apikey:x", allowed=lambda model: model == "other")
    with pytest.raises(FeedbackError, match="no feedback given"):
        feedback.record(opened, [], actor="user:ann")


def test_feedback_becomes_a_new_dataset_version_that_names_its_predictions(opened: Store, tmp_path: Path) -> None:
    version = served_version(opened, tmp_path)
    ids = answer(opened, feedback.PredictionLog(), version, ["old text 1", "a brand new text", "another new one"])
    feedback.record(opened, [(ids[0], "billing"), (ids[1], "shipping"), (ids[2], "billing")], actor="user:ann")
    assert feedback.unused(opened, "tickets") == 3
    made = feedback.extend_dataset(opened, "tickets", actor="service:autopilot")
    base = datasets.get(opened, "tickets:1")
    assert made.ref == "tickets:2" and made.parent == base.id and made.examples == base.examples + 2
    assert "1 examples of tickets:1 relabelled" in made.warnings[0]  # "old text 1" was shipping
    loaded = datasets.load(opened, made)
    texts = dict(zip(loaded.texts, loaded.labels))
    assert texts["a brand new text"] == "shipping" and texts["old text 1"] == "billing"
    assert sorted(feedback.used_by(opened, made.id)) == sorted(ids)
    assert feedback.unused(opened, "tickets") == 0
    with pytest.raises(FeedbackError, match="no new feedback"):
        feedback.extend_dataset(opened, "tickets", actor="service:autopilot")
    shown = run_cli("data", "show", "tickets:2", check=True).stdout
    assert f"extends     {base.id}" in shown and "true labels of 3 predictions" in shown


def test_old_predictions_without_feedback_are_purged(opened: Store, tmp_path: Path) -> None:
    version = served_version(opened, tmp_path)
    ids = answer(opened, feedback.PredictionLog(), version, ["labelled", "forgotten", "fresh"])
    feedback.record(opened, [(ids[0], "billing")], actor="user:ann")
    old = (datetime.now(UTC) - timedelta(days=40)).isoformat(timespec="seconds")
    opened.db.execute("UPDATE predictions SET created_at = ? WHERE id IN (?, ?)", (old, ids[0], ids[1]))
    assert feedback.purge(opened, keep_days=30) == 1
    assert {row[0] for row in opened.db.execute("SELECT id FROM predictions")} == {ids[0], ids[2]}


def test_the_cli_imports_a_labelled_csv_all_or_nothing(opened: Store, tmp_path: Path) -> None:
    version = served_version(opened, tmp_path)
    ids = answer(opened, feedback.PredictionLog(), version, ["one", "two"])
    bad = tmp_path / "bad.csv"
    bad.write_text(f"prediction_id,label\n{ids[0]},billing\n{ids[1]}\n,shipping\n")
    refused = run_cli("feedback", "import", str(bad))
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "bad.csv line 3" in refused.stderr and "bad.csv line 4: prediction_id is empty" in refused.stderr
    assert opened.db.execute("SELECT COUNT(*) FROM feedback").fetchone()[0] == 0
    good = tmp_path / "labels.csv"
    good.write_text(f"prediction_id,label\n{ids[0]},billing\n{ids[1]},shipping\n")
    assert "2 labels stored (tickets 2)" in run_cli("feedback", "import", str(good), check=True).stdout
    shown = run_cli("feedback", "show", check=True).stdout
    assert "tickets:1" in shown and "50.0% of 2" in shown and "tickets: 2 labels not trained on yet" in shown
    mistyped = run_cli("feedback", "show", "tickts")  # not "no feedback yet", which would send the user looking
    assert mistyped.returncode == 1 and "no model named 'tickts'" in mistyped.stderr
    with pytest.raises(DatasetError, match="no column 'prediction_id'"):
        feedback.read_csv(tmp_path / "tickets.csv")
    (tmp_path / "empty.csv").write_text("prediction_id,label\n")
    with pytest.raises(DatasetError, match="empty.csv holds no labels"):
        feedback.read_csv(tmp_path / "empty.csv")


def test_feedback_import_refuses_a_pipe_or_an_outsized_file_at_once(tmp_path: Path) -> None:
    """A pipe would hang the import and a huge file fill the memory: each is refused before it is read, saying
    why (a timeout, not a hang, if it is not)."""
    os.mkfifo(tmp_path / "pipe.csv")
    piped = run_cli("feedback", "import", str(tmp_path / "pipe.csv"), timeout=60)
    assert piped.returncode == 1 and "Traceback" not in piped.stderr
    assert "the feedback file " in piped.stderr and "pipe.csv is a named pipe (FIFO), not a regular file" in piped.stderr
    huge = tmp_path / "huge.csv"
    huge.touch()
    os.truncate(huge, 3 * 2**30)  # sparse: nothing is written
    outsized = run_cli("feedback", "import", str(huge), timeout=60)
    assert outsized.returncode == 1
    assert f"huge.csv holds 3,221,225,472 bytes, over its limit of {feedback.MAX_FILE_BYTES:,}" in outsized.stderr
    assert "split it into files of at most 10,000 labels" in outsized.stderr


def test_an_erasure_request_reaches_served_texts_and_their_feedback(opened: Store, tmp_path: Path) -> None:
    from appliance.operations import privacy

    version = served_version(opened, tmp_path)
    ids = answer(opened, feedback.PredictionLog(), version, ["mail from Jane.Doe@example.com", "nothing personal"])
    feedback.record(opened, [(ids[0], "billing"), (ids[1], "shipping")], actor="user:ann")
    found = privacy.find(opened, "jane.doe@EXAMPLE.com")
    assert [f.summary() for f in found.findings] == [{"source": "predictions", "object": "tickets", "records": 1}]
    privacy.erase(opened, "jane.doe@example.com", actor="user:dpo")
    assert [row[0] for row in opened.db.execute("SELECT id FROM predictions")] == [ids[1]]
    assert [row[0] for row in opened.db.execute("SELECT prediction_id FROM feedback")] == [ids[1]]
    assert audit.verify(opened).ok


def test_the_compliance_report_lists_the_served_texts_kept_and_feedback_lineage(opened: Store, tmp_path: Path) -> None:
    from appliance.compliance import evidence

    version = served_version(opened, tmp_path)
    ids = answer(opened, feedback.PredictionLog(), version, ["kept one", "kept two"])
    feedback.record(opened, [(ids[0], "billing")], actor="user:ann")
    feedback.extend_dataset(opened, "tickets", actor="user:ann")
    facts = evidence.collect(opened)
    [served] = facts["served_texts"]
    assert (served["model"], served["kept"], served["labelled"], served["keep_days"]) == ("tickets", 2, 1, 30.0)
    extended = next(d for d in facts["datasets"] if d["ref"] == "tickets:2")
    assert extended["parent"] == datasets.get(opened, "tickets:1").id and extended["from_predictions"] == 1
