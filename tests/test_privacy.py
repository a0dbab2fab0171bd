"""Data subject requests: every example naming a person goes, the old content really goes, the store stays whole."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from appliance import registry, store
from appliance.access import users
from appliance.core import config
from appliance.core.errors import DatasetError, ErasureError
from appliance.data import datasets
from appliance.operations import jobs, jobspec, privacy
from appliance.store import Store, audit, blobs
from tests.conftest import model_trained_on, run_cli, write_tickets
from tests.daemon import Daemon

SUBJECT = "Alice.Moreau@example.com"
LABEL = "CANARYLABEL9932"  # a subject's identifier used as a label


def _tickets_naming_the_subject(path: Path, mentions: int = 3) -> Path:
    """The tickets file with a few more rows that name the subject, in other cases than the request's."""
    write_tickets(path, per_class=10)
    with path.open("a") as f:
        for n in range(mentions):
            f.write(f'"please call me back at ALICE.MOREAU@example.COM, ticket {n}",billing\n')
    return path


def _labelled(path: Path, label: str) -> Path:
    """A tickets file with two more rows under label."""
    with path.open("a") as f:
        f.write(f'"an order that never came",{label}\n"a refund still not paid",{label}\n')
    return path


def _rows_holding(opened: Store, needle: str) -> list[tuple[object, ...]]:
    """The rows of `datasets` that hold needle, in any case, in any column."""
    return [row for row in opened.db.execute("SELECT * FROM datasets").fetchall()
            if needle.casefold() in repr(row).casefold()]


def _state(opened: Store) -> dict[str, object]:
    """Everything an erasure could change: dataset rows, blobs, chunks, the audit log."""
    return {table: opened.db.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            for table in ("datasets", "blobs", "audit")} | {
        "chunks": opened.db.execute("SELECT storage_id, idx FROM blob_chunks ORDER BY 1, 2").fetchall()}


def test_an_erasure_removes_the_rows_and_their_old_content_and_lists_the_models(opened: Store, tmp_path: Path) -> None:
    old = datasets.import_file(opened, _tickets_naming_the_subject(tmp_path / "t.csv"), name="tickets")
    model = model_trained_on(opened, old, "support")
    storage_id = opened.db.execute("SELECT storage_id FROM blobs WHERE id = ?", (old.blob_id,)).fetchone()[0]
    sealed = opened.db.execute("SELECT data FROM blob_chunks WHERE storage_id = ?", (storage_id,)).fetchone()[0]

    done = privacy.erase(opened, SUBJECT.lower())

    assert [(f.source, f.object, f.records) for f in done.findings] == [("datasets", "tickets:1", 3)]
    assert done.affected_models == [model.ref]
    erased, new = datasets.list_versions(opened)
    # The new version holds every other example, none naming the subject, with the split carried over.
    assert (new.ref, new.examples, new.residency) == ("tickets:2", old.examples - 3, old.residency)
    loaded = datasets.load(opened, new)
    assert not [text for text in loaded.texts if "alice.moreau" in text.lower()]
    assert sorted(loaded.train + loaded.validation) == list(range(new.examples))
    # The old version reads as erased, names its replacement, and its content is gone: row, key and chunks.
    assert erased.ref == "tickets:1" and erased.blob_id is None and erased.replaced_by == new.id
    assert not blobs.exists(opened, old.blob_id)
    assert opened.db.execute("SELECT COUNT(*) FROM blob_chunks WHERE storage_id = ?", (storage_id,)).fetchone()[0] == 0
    with pytest.raises(DatasetError, match="tickets:1 was erased") as refused:
        datasets.load(opened, erased)
    assert "tickets:2" in refused.value.hint
    # The run and the model version stay: lineage still reads, from model to the (erased) dataset version.
    assert registry.get(opened, model.ref).lineage(opened)["dataset"] == old.id

    # Consistent: SQLite's checks, and the audit chain, which names the subject only by a keyed hash.
    assert opened.db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert opened.db.execute("PRAGMA foreign_key_check").fetchall() == []
    assert audit.verify(opened).ok
    record = audit.rows(opened, action=privacy.ACTION)[-1]
    details = json.loads(record["details"])
    assert record["object"] == privacy.subject_hash(opened, SUBJECT) and record["outcome"] == "ok"
    assert details["records"] == 3 and details["affected_models"] == [model.ref]
    assert details["erased"][0] | {"id": None} == {"dataset": "tickets:1", "id": None, "rows": 3,
                                                   "replaced_by": "tickets:2"}
    assert "alice" not in json.dumps(audit.rows(opened)).lower()

    # secure_delete: the old ciphertext is not left in freed pages of the database file, nor in the WAL.
    opened.close()
    files = [opened.settings.db_path, opened.settings.db_path.with_name("appliance.db-wal")]
    assert not any(sealed[16:48] in path.read_bytes() for path in files if path.exists())


def test_a_dry_run_lists_what_would_go_and_changes_nothing(opened: Store, tmp_path: Path) -> None:
    old = datasets.import_file(opened, _tickets_naming_the_subject(tmp_path / "t.csv", mentions=2), name="tickets")
    model_trained_on(opened, old, "support")
    before = _state(opened)

    found = privacy.find(opened, SUBJECT)

    assert [(f.object, f.records) for f in found.findings] == [("tickets:1", 2)]
    assert found.affected_models == ["support:1"]
    assert _state(opened) == before


def test_what_is_left_may_be_an_earlier_version(opened: Store, tmp_path: Path) -> None:
    """Content-addressed: when the rows left are exactly an earlier version, that version is the replacement."""
    first = datasets.import_file(opened, write_tickets(tmp_path / "a.csv", per_class=10), name="tickets")
    second = datasets.import_file(opened, _tickets_naming_the_subject(tmp_path / "b.csv"), name="tickets")

    done = privacy.erase(opened, SUBJECT)

    assert done.erased == [{"dataset": "tickets:2", "id": second.id, "rows": 3, "replaced_by": "tickets:1"}]
    assert [(v.ref, v.erased_at is None) for v in datasets.list_versions(opened)] == [("tickets:1", True),
                                                                                    ("tickets:2", False)]
    assert datasets.get(opened, "tickets:2").replaced_by == first.id and blobs.exists(opened, first.blob_id)
    assert opened.db.execute("PRAGMA foreign_key_check").fetchall() == []


def test_an_image_whose_file_name_holds_the_identifier_is_erased(opened: Store, tmp_path: Path) -> None:
    colours = {"cats/1.png": (200, 10, 10), "cats/alice.moreau@example.com.png": (190, 20, 20),
               "cats/3.png": (180, 30, 30), "dogs/a.png": (0, 0, 200), "dogs/b.png": (0, 10, 180)}
    for name, colour in colours.items():
        (tmp_path / "photos" / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (4, 4), colour).save(tmp_path / "photos" / name, format="PNG")
    old = datasets.import_file(opened, tmp_path / "photos", name="pets", task=datasets.IMAGE)

    done = privacy.erase(opened, SUBJECT)

    assert done.erased[0]["rows"] == 1 and done.erased[0]["replaced_by"] == "pets:2"
    loaded = datasets.load(opened, datasets.get(opened, "pets:2"))
    assert loaded.labels == ["cats", "cats", "dogs", "dogs"] and len(loaded.images) == old.examples - 1
    assert not blobs.exists(opened, old.blob_id)


def test_an_image_set_s_warnings_that_name_the_label_stay_in_neither_row(opened: Store, tmp_path: Path) -> None:
    """A dropped duplicate is named in the version's warnings, label folder and all: the erased row and the
    replacement, which copies the warnings, keep none that names the subject."""
    colours = {"cats/1.png": (200, 10, 10), "cats/2.png": (190, 20, 20), f"{LABEL}/a.png": (0, 0, 200),
               f"{LABEL}/b.png": (0, 10, 180), f"{LABEL}/again.png": (0, 10, 180), "dogs/c.png": (0, 200, 0),
               "dogs/d.png": (10, 190, 0)}
    for name, colour in colours.items():
        (tmp_path / "photos" / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (4, 4), colour).save(tmp_path / "photos" / name, format="PNG")
    old = datasets.import_file(opened, tmp_path / "photos", name="pets", task=datasets.IMAGE)
    assert f"photos/{LABEL}/" in old.warnings[0]

    done = privacy.erase(opened, LABEL.lower())

    assert [(f.source, f.object, f.records) for f in done.findings] == [("dataset metadata", "pets:1", 1),
                                                                        ("datasets", "pets:1", 2)]
    assert _rows_holding(opened, LABEL) == []
    kept = (["cats", "dogs"], {"cats": 2, "dogs": 2}, [])
    assert [(v.ref, (v.labels, v.counts, v.warnings)) for v in datasets.list_versions(opened)] == [("pets:1", kept),
                                                                                                ("pets:2", kept)]


def test_a_job_on_the_dataset_holds_the_erasure_back_and_short_identifiers_are_refused(
    opened: Store, tmp_path: Path
) -> None:
    datasets.import_file(opened, _tickets_naming_the_subject(tmp_path / "t.csv"), name="tickets")
    job = jobs.submit(opened, jobspec.TrainJob(dataset="tickets"))
    before = _state(opened)["datasets"]
    with pytest.raises(ErasureError, match=f"jobs {job.id} use a dataset"):
        privacy.erase(opened, SUBJECT)
    assert _state(opened)["datasets"] == before
    assert audit.rows(opened, action=privacy.ACTION)[-1]["outcome"] == "failed"
    with pytest.raises(ErasureError, match="too short"):
        privacy.find(opened, " a ")


def test_the_cli_dry_run_then_erases_with_the_identifier_on_stdin(tmp_path: Path) -> None:
    run_cli("keys", "init", check=True)
    run_cli("data", "import", str(_tickets_naming_the_subject(tmp_path / "t.csv")), "--name", "tickets", check=True)

    dry = run_cli("privacy", "erase", "--subject", SUBJECT, "--dry-run", check=True)
    assert "would erase 3 record(s) in datasets tickets:1" in dry.stdout
    assert "tickets:2" not in run_cli("data", "list", check=True).stdout

    erased = subprocess.run([sys.executable, "-m", "appliance", "privacy", "erase", "--subject", "-", "--yes"],
                            input=SUBJECT + "\n", capture_output=True, text=True, timeout=300, check=False)
    assert erased.returncode == 0, erased.stderr
    assert "erased 3 record(s) in datasets tickets:1" in erased.stdout and "tickets:2 holds the rest" in erased.stdout
    listing = run_cli("data", "list", check=True).stdout
    assert "tickets:1" in listing and "erased" in listing and "tickets:2" in listing
    assert run_cli("audit", "verify", check=True).returncode == 0

    again = run_cli("privacy", "erase", "--subject", SUBJECT, "--yes", check=True)
    assert "no records of this subject" in again.stdout
    shown = run_cli("data", "show", "tickets:1")
    assert shown.returncode == 0 and "erased" in shown.stdout


def test_a_label_that_is_the_identifier_stays_in_no_dataset_row_nor_in_data_show(
    settings: config.Settings, tmp_path: Path
) -> None:
    """The erased version's row keeps no label or count of the erased rows; the replacement's are counted from the
    rows kept."""
    run_cli("keys", "init", check=True)
    path = _labelled(write_tickets(tmp_path / "t.csv", per_class=10), LABEL)
    run_cli("data", "import", str(path), "--name", "tickets", check=True)
    assert LABEL in run_cli("data", "show", "tickets:1", check=True).stdout

    erased = subprocess.run([sys.executable, "-m", "appliance", "privacy", "erase", "--subject", "-", "--yes"],
                            input=LABEL.lower() + "\n", capture_output=True, text=True, timeout=300, check=False)

    assert erased.returncode == 0 and "erased 2 record(s) in datasets tickets:1" in erased.stdout, erased.stderr
    for ref in ("tickets:1", "tickets:2"):
        for shown in (run_cli("data", "show", ref, check=True), run_cli("data", "show", ref, "--json", check=True)):
            assert LABEL.casefold() not in shown.stdout.casefold()
    with store.open(settings) as opened:
        assert _rows_holding(opened, LABEL) == []
        old, new = datasets.list_versions(opened)
        kept = datasets.load(opened, new).counts
        assert old.counts == new.counts == kept and old.labels == new.labels == sorted(kept)
        assert sum(kept.values()) == new.examples == old.examples - 2


def test_a_label_kept_by_a_version_whose_content_is_gone_is_taken_out_of_its_row(opened: Store, tmp_path: Path) -> None:
    """A version erased by an earlier request, or deleted, has no example left to match, but its row kept its
    labels: a later request for a label takes it out of them, and lists the models trained on them."""
    path = _labelled(_tickets_naming_the_subject(tmp_path / "t.csv", mentions=2), LABEL)
    model = model_trained_on(opened, datasets.import_file(opened, path, name="tickets"), "support")
    privacy.erase(opened, SUBJECT)  # tickets:1 erased, tickets:2 holds the rest, the label's rows among them
    datasets.delete(opened, "tickets:2")

    found = privacy.find(opened, LABEL.lower())
    done = privacy.erase(opened, LABEL.lower())

    assert [(f.source, f.object, f.records) for f in found.findings] == [("dataset metadata", "tickets:1", 1),
                                                                         ("dataset metadata", "tickets:2", 1)]
    assert done.affected_models == [model.ref] and _rows_holding(opened, LABEL) == []
    for version in datasets.list_versions(opened):
        assert version.labels == sorted(version.counts) == ["billing", "shipping", "technical"]
    assert privacy.find(opened, LABEL).findings == []
    assert LABEL.lower() not in json.dumps(audit.rows(opened)).lower()
    assert audit.verify(opened).ok


def test_through_the_daemon_an_admin_erases_under_their_name_and_a_viewer_is_refused(
    daemon: Daemon, tmp_path: Path
) -> None:
    imported = daemon.cli("data", "import", str(_tickets_naming_the_subject(tmp_path / "s.csv")), "--name", "tickets")
    assert imported.returncode == 0, imported.stderr
    with store.open(daemon.settings) as opened:
        _, viewer = users.add(opened, "auditor", "viewer")
    with daemon.api(viewer) as api:
        refused = api.post("/v1/privacy/erase", json={"subject": SUBJECT, "dry_run": True})
    assert refused.status_code == 403 and "admin" in refused.json()["error"]

    erased = daemon.cli("privacy", "erase", "--subject", SUBJECT, "--yes")

    assert erased.returncode == 0 and "erased 3 record(s) in datasets tickets:1" in erased.stdout, erased.stderr
    with store.open(daemon.settings) as opened:
        (record,) = audit.rows(opened, action=privacy.ACTION)
        assert record["actor"] == f"user:{users.LOCAL_ADMIN}" and record["outcome"] == "ok"
        assert [v.ref for v in datasets.list_versions(opened) if v.erased_at is None] == ["tickets:2"]
