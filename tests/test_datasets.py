"""Datasets: files become checked, hashed, encrypted versions; every problem is named by file and line."""

from __future__ import annotations

import io
import json
import os
import zlib
from importlib import resources
from pathlib import Path

import pytest
from PIL import Image

from appliance.core.errors import DatasetError
from appliance.data import datasets
from appliance.store import Store, audit, blobs
from tests.conftest import run_cli

ROWS = [
    ("my card was charged twice", "billing"),
    ("please send the invoice again", "billing"),
    ("refund has not arrived", "billing"),
    ("where is my parcel", "shipping"),
    ("the courier lost the box", "shipping"),
    ("can you deliver on Saturday", "shipping"),
    ("the app crashes on start", "technical"),
    ("error 500 on the settings page", "technical"),
]


def _csv(rows: list[tuple[str, str]], header: str = "text,label", delimiter: str = ",") -> str:
    return header.replace(",", delimiter) + "\n" + "".join(f'"{text}"{delimiter}{label}\n' for text, label in rows)


def _jsonl(rows: list[tuple[str, str]]) -> str:
    return "".join(json.dumps({"text": text, "label": label}) + "\n" for text, label in rows)


def _write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    return path


def _count(opened: Store, table: str) -> int:
    return opened.db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def claiming(png: bytes, width: int, height: int) -> bytes:
    """A PNG whose header claims width x height pixels (its CRC fixed to match), over the data of a small one: a
    decompression bomb's header at no cost."""
    header = png[12:16] + width.to_bytes(4, "big") + height.to_bytes(4, "big") + png[24:29]
    return png[:12] + header + zlib.crc32(header).to_bytes(4, "big") + png[33:]


def _png(colour: tuple[int, int, int], size: int = 4) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("tickets.csv", _csv(ROWS)),
        ("tickets-bom.csv", "\ufeff" + _csv(ROWS).replace("\n", "\r\n")),
        ("tickets.jsonl", _jsonl(ROWS)),
        ("tickets-excel.csv", _csv([(text.replace(" ", ", ", 1), label) for text, label in ROWS], delimiter=";")),
        ("tickets.tsv", _csv(ROWS, delimiter="\t")),
    ],
)
def test_a_file_round_trips_through_load(opened: Store, tmp_path: Path, name: str, content: str) -> None:
    version = datasets.import_file(opened, _write(tmp_path, name, content), name="tickets")
    assert (version.name, version.version, version.examples) == ("tickets", 1, len(ROWS))
    assert version.labels == ["billing", "shipping", "technical"]
    assert version.residency == "local-only"
    assert blobs.exists(opened, version.blob_id) and version.removal is None
    loaded = datasets.load(opened, datasets.get(opened, "tickets"))
    assert [(text.replace(",", ""), label) for text, label in zip(loaded.texts, loaded.labels)] == ROWS
    assert loaded.label_names == ["billing", "shipping", "technical"]
    assert loaded.counts == {"billing": 3, "shipping": 3, "technical": 2} == version.counts
    assert loaded.images == []


def test_the_id_is_the_same_for_the_same_examples_in_either_format(opened: Store, tmp_path: Path) -> None:
    from_csv = datasets.import_file(opened, _write(tmp_path, "a.csv", _csv(ROWS)), name="tickets")
    from_jsonl = datasets.import_file(opened, _write(tmp_path, "a.jsonl", _jsonl(ROWS)), name="tickets")
    assert from_jsonl == from_csv


def test_the_stored_form_is_one_json_line_per_example_whatever_the_text_holds(opened: Store, tmp_path: Path) -> None:
    """A version's id is the hash of this form, so it stays what it was when the first versions were stored: a file
    imported again is the same version."""
    texts = ['a "quoted" word', "back\\slash", "tab\there", "日本語 and é", "emoji 🙂", "line\u2028separator",
             "control \x01", "del \x7f"] + [f"filler text {n} " * 40 for n in range(3000)]  # over a piece: 1 MiB
    rows = [{"text": text, "label": ("billing", "shipping")[index % 2]} for index, text in enumerate(texts)]
    path = _write(tmp_path, "odd.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    version = datasets.import_file(opened, path, name="odd")
    assert datasets.content(opened, version) == "".join(
        json.dumps({"text": row["text"].strip(), "label": row["label"]}, ensure_ascii=False) + "\n"
        for row in rows).encode()


def test_custom_columns_and_numeric_labels(opened: Store, tmp_path: Path) -> None:
    lines = [{"body": text, "category": index % 2} for index, (text, _) in enumerate(ROWS)]
    path = _write(tmp_path, "t.jsonl", "".join(json.dumps(line) + "\n" for line in lines))
    version = datasets.import_file(opened, path, name="binary", text_column="body", label_column="category")
    assert version.labels == ["0", "1"]


def test_the_counts_per_label_of_a_version_kept_before_they_were_are_counted_once_and_kept(
    opened: Store, tmp_path: Path
) -> None:
    version = datasets.import_file(opened, _write(tmp_path, "t.csv", _csv(ROWS)), name="tickets")
    opened.db.execute("UPDATE datasets SET counts = NULL")  # as an older appliance left its rows
    older = datasets.get(opened, "tickets")
    assert older.counts is None
    assert datasets.label_counts(opened, older) == {"billing": 3, "shipping": 3, "technical": 2} == version.counts
    assert datasets.get(opened, "tickets").counts == version.counts  # the next look reads no content


def test_reimport_of_the_same_content_returns_the_same_version(opened: Store, tmp_path: Path) -> None:
    path = _write(tmp_path, "t.csv", _csv(ROWS))
    first = datasets.import_file(opened, path, name="tickets")
    records = _count(opened, "audit")
    assert datasets.import_file(opened, path, name="tickets") == first
    assert _count(opened, "datasets") == 1 and _count(opened, "audit") == records

    path.write_text(_csv([*ROWS, ("the parcel is wet", "shipping")]))
    second = datasets.import_file(opened, path, name="tickets")
    assert second.version == 2 and second.id != first.id
    assert datasets.get(opened, "tickets") == second
    assert datasets.get(opened, "tickets:1") == first
    assert datasets.get(opened, first.id[:8]) == first
    assert datasets.get(opened, first.id) == first
    assert [v.ref for v in datasets.list_versions(opened)] == ["tickets:1", "tickets:2"]
    assert datasets.import_file(opened, _write(tmp_path, "old.csv", _csv(ROWS)), name="tickets") == first


def test_the_same_content_under_another_name_is_a_version_of_its_own_sharing_the_stored_content(
        opened: Store, tmp_path: Path) -> None:
    path = _write(tmp_path, "t.csv", _csv(ROWS))
    tickets = datasets.import_file(opened, path, name="tickets")
    other = datasets.import_file(opened, path, name="other")
    assert (other.ref, other.blob_id) == ("other:1", tickets.blob_id) and other.id != tickets.id
    assert _count(opened, "blobs") == 1

    # Deleting one name's version leaves the other readable; the stored content goes with the last of them.
    datasets.delete(opened, "tickets", actor="user:admin")
    assert datasets.load(opened, datasets.get(opened, "other")).texts == [text for text, _ in ROWS]
    datasets.delete(opened, "other:1", actor="user:admin")
    assert _count(opened, "blobs") == 0


def test_a_deleted_version_keeps_its_row_and_says_who_deleted_it(opened: Store, tmp_path: Path) -> None:
    path = _write(tmp_path, "t.csv", _csv(ROWS))
    first = datasets.import_file(opened, path, name="tickets")
    path.write_text(_csv([*ROWS, ("the parcel is wet", "shipping")]))
    second = datasets.import_file(opened, path, name="tickets")

    assert [v.ref for v in datasets.delete(opened, "tickets:1", actor="user:alice")] == ["tickets:1"]
    gone = datasets.get(opened, first.id)
    assert gone.blob_id is None and gone.removal.startswith("deleted on ") and gone.removal.endswith("by user:alice")
    with pytest.raises(DatasetError, match=r"tickets:1 was deleted on .* by user:alice") as refused:
        datasets.load(opened, gone)
    assert refused.value.hint == "import the data again"
    assert datasets.load(opened, second).version == second  # the other version is untouched
    record = audit.rows(opened)[-1]
    assert (record["action"], record["object"], record["actor"]) == ("dataset.delete", "tickets:1", "user:alice")

    # The name alone deletes what is left; once nothing is left, deleting again says so and changes nothing.
    assert [v.ref for v in datasets.delete(opened, "tickets")] == ["tickets:2"]
    with pytest.raises(DatasetError, match="no version of it holds content any more"):
        datasets.delete(opened, "tickets")

    # The same data imported again is a new version: numbers are never given twice.
    again = datasets.import_file(opened, _write(tmp_path, "again.csv", _csv(ROWS)), name="tickets")
    assert again.ref == "tickets:3" and again.blob_id == first.blob_id != again.id


def test_an_unknown_ref_names_the_datasets_there_are(opened: Store, tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as empty:
        datasets.get(opened, "tickets")
    assert "none imported yet" in empty.value.hint
    datasets.import_file(opened, _write(tmp_path, "t.csv", _csv(ROWS)), name="tickets")
    for ref in ("nope", "tickets:7", "tickets:x", "tickets:\u00b2", "deadbeef"):
        with pytest.raises(DatasetError) as missing:
            datasets.get(opened, ref)
        assert "known datasets: tickets" in missing.value.hint


GOOD = _csv(ROWS)[len("text,label\n") :]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (
            "customers.csv",
            b"text,label\n" + GOOD.encode() + b'"caf\xe9 au lait",billing\n',
            "customers.csv line 10 column 5: not valid UTF-8",
        ),
        ("customers.csv", "text,label\n" + GOOD + '"   ",billing\n', "customers.csv line 10: empty text"),
        ("customers.csv", "text,label\n" + GOOD + '"where is it",\n', "customers.csv line 10: missing label"),
        (
            "customers.csv",
            "message,category\n" + GOOD,
            "customers.csv line 1: no column 'text' or 'label' among the header's 2 columns",
        ),
        (
            "customers.csv",
            "text,label\n" + GOOD + '"please call me",callback\n',
            "customers.csv line 10: the only example of its label, fewer than the 2 each label needs",
        ),
        ("customers.csv", "text,label\n" + GOOD + "a,b,c\n", "customers.csv line 10: 3 fields, but the header has 2"),
        (
            "customers.csv",
            "text,label,label\n" + GOOD.replace(",", ",x,"),
            "customers.csv line 1: the header names the column 'label' twice",
        ),
        (
            "customers.jsonl",
            _jsonl(ROWS) + '{"text": "hi", "label": "billing", "label": "shipping"}\n',
            "customers.jsonl line 9: the key 'label' twice in one object",
        ),
        (
            "customers.csv",
            "text;label\n" + GOOD.replace('",', '";') + "a;b;c\n",
            "customers.csv line 10: 3 fields, but the header has 2 (a semicolon in a text that is not in double quotes?)",
        ),
        ("customers.jsonl", _jsonl(ROWS) + '{"text": "oops",\n', "customers.jsonl line 9: not valid JSON"),
        ("customers.jsonl", _jsonl(ROWS) + '["a", "b"]\n', "customers.jsonl line 9: expected a JSON object"),
        (
            "customers.jsonl",
            _jsonl(ROWS) + '{"body": "hi", "label": "billing"}\n',
            "customers.jsonl line 9: no field 'text' (the object has 2 fields)",
        ),
        ("customers.jsonl", _jsonl(ROWS) + '{"text": "hi", "label": null}\n', "customers.jsonl line 9: missing label"),
        ("customers.jsonl", _jsonl(ROWS) + '{"text": 7, "label": "b"}\n', "customers.jsonl line 9: the text is not"),
        (
            "customers.jsonl",
            _jsonl(ROWS) + '{"text": "caf\\ud800", "label": "billing"}\n',
            "customers.jsonl line 9: the text is not valid Unicode (an unpaired surrogate escape at character 4)",
        ),
        ("customers.jsonl", _jsonl(ROWS) + "[" * 100_000 + "\n", "customers.jsonl line 9: JSON nested too deeply"),
        (
            "customers.csv",
            "text,la\rbel\n" + GOOD,
            "customers.csv line 1: not readable as CSV (a line break (or carriage return) inside a field",
        ),
    ],
)
def test_a_problem_is_named_by_file_and_line(
    opened: Store, tmp_path: Path, name: str, content: str, message: str
) -> None:
    with pytest.raises(DatasetError) as error:
        datasets.import_file(opened, _write(tmp_path, name, content), name="tickets")
    assert message in error.value.message
    assert error.value.hint


@pytest.mark.parametrize("handling", ["truncate", "skip"])
def test_a_text_over_the_character_bound_is_cut_or_left_out_and_never_refuses_the_file(
    opened: Store, tmp_path: Path, handling: str
) -> None:
    long = "x" * 10001 + "m" * 200_000 + "z" * 10000  # past the csv module's own field limit too (128 Ki)
    content = "text,label\n" + GOOD + f'"{long}",billing\n' + f'"{"y" * 40}",billing\n'
    path = _write(tmp_path, "customers.csv", content)
    version = datasets.import_file(opened, path, name="tickets", long_texts=handling)
    kept = datasets.load(opened, version).texts
    if handling == "truncate":
        assert version.examples == len(ROWS) + 2 and "x" * 10000 + " " + "z" * 9999 in kept  # its two ends
        assert ("1 text cut to their beginning and end, 20,000 characters (max_text_chars): customers.csv line 10"
                in version.warnings)
    else:
        assert version.examples == len(ROWS) + 1 and not any(text.startswith("x") for text in kept)
        assert ("1 text left out, being longer than 20,000 characters (max_text_chars): customers.csv line 10"
                in version.warnings)
    shorter = datasets.import_file(opened, path, name="short", max_text_chars=35)
    assert ("2 texts cut to their beginning and end, 35 characters (max_text_chars): customers.csv lines 10, 11"
            in shorter.warnings)
    assert "y" * 17 + " " + "y" * 17 in datasets.load(opened, shorter).texts
    with pytest.raises(DatasetError) as unknown:
        datasets.import_file(opened, path, name="other", long_texts="refuse")
    assert "truncate or skip" in (unknown.value.hint or "")


def test_import_says_how_many_texts_are_longer_than_the_window_training_reads(
    opened: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    long = " ".join(["refund"] * 300)  # 300 tokens of the bundled base model: past its default 128, within its 512
    content = _csv([*ROWS, (long, "billing"), (long + " twice", "shipping")])
    version = datasets.import_file(opened, _write(tmp_path, "t.csv", content), name="tickets")
    assert version.warnings == [(f"2 of {len(ROWS) + 2} texts ({2 / (len(ROWS) + 2):.0%}) are longer than the 128"
                                 " tokens training reads by default: it reads their beginning and end, or up to 512"
                                 " tokens of them on a budget (--max-minutes)")]
    assert datasets.import_file(opened, _write(tmp_path, "s.csv", _csv(ROWS)), name="short").warnings == []
    # A large set is counted on a sample, and says so.
    monkeypatch.setattr(datasets, "WINDOW_SAMPLE", 4)
    sampled = datasets.import_file(opened, _write(tmp_path, "m.csv", content), name="sampled")
    [said] = sampled.warnings
    assert said.startswith("about ") and "% of the texts (" in said and " of 4 sampled) are longer than the 128" in said


def test_many_problems_are_reported_together(opened: Store, tmp_path: Path) -> None:
    content = "text,label\n" + GOOD + '"",billing\n' * 30
    with pytest.raises(DatasetError) as error:
        datasets.import_file(opened, _write(tmp_path, "t.csv", content), name="tickets")
    lines = error.value.message.splitlines()
    assert lines[0] == "t.csv: 30 problems"
    assert lines[1].strip() == "t.csv line 10: empty text"
    assert lines[-1].strip() == "and 10 more"
    assert len(lines) == 1 + datasets.MAX_SHOWN + 1


def test_duplicates_are_dropped_with_a_warning(opened: Store, tmp_path: Path) -> None:
    content = _csv([*ROWS, ROWS[0], (f"  {ROWS[3][0]} ", ROWS[3][1])])
    version = datasets.import_file(opened, _write(tmp_path, "t.csv", content), name="tickets")
    assert version.examples == len(ROWS)
    assert version.warnings == [
        "dropped 2 duplicates of earlier examples with the same label: t.csv line 10, t.csv line 11"
    ]


def test_the_same_text_with_another_label_is_an_error_naming_both_lines(opened: Store, tmp_path: Path) -> None:
    content = _csv([*ROWS, (ROWS[0][0], "shipping")])
    with pytest.raises(DatasetError) as error:
        datasets.import_file(opened, _write(tmp_path, "t.csv", content), name="tickets")
    assert error.value.message == (
        "t.csv line 10: the same text as t.csv line 2, with another label"
    )


def test_a_single_class_is_refused(opened: Store, tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="a classifier needs at least two classes"):
        datasets.import_file(opened, _write(tmp_path, "t.csv", _csv(ROWS[:3])), name="tickets")


def test_a_failed_import_leaves_nothing_but_a_failed_audit_record(opened: Store, tmp_path: Path) -> None:
    datasets.import_file(opened, _write(tmp_path, "good.csv", _csv(ROWS)), name="tickets")
    before = {table: _count(opened, table) for table in ("datasets", "blobs", "blob_chunks")}
    bad = _write(tmp_path, "bad.csv", _csv([*ROWS[3:], ("", "billing")]))
    with pytest.raises(DatasetError):
        datasets.import_file(opened, bad, name="tickets")
    assert {table: _count(opened, table) for table in before} == before
    last = audit.rows(opened, action="dataset.import")[-1]
    assert (last["object"], last["outcome"]) == ("tickets", "failed")
    assert "empty text" in json.loads(last["details"])["error"]
    assert audit.verify(opened).ok


def test_no_plaintext_reaches_the_database_file(opened: Store, tmp_path: Path) -> None:
    marker = "CONFIDENTIAL-CUSTOMER-COMPLAINT"
    rows = [*ROWS, (f"{marker} one", "technical"), (f"{marker} two", "technical")]
    datasets.import_file(opened, _write(tmp_path, "t.csv", _csv(rows)), name="tickets")
    opened.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert marker.encode() not in opened.settings.db_path.read_bytes()


def test_the_split_is_stratified_disjoint_complete_and_reproducible(opened: Store, tmp_path: Path) -> None:
    rows = [
        (f"message number {i} about {label}", label) for label, n in (("a", 50), ("b", 20), ("c", 2)) for i in range(n)
    ]
    path = _write(tmp_path, "t.csv", _csv(rows))
    version = datasets.import_file(opened, path, name="split", validation_fraction=0.2, seed=7)
    loaded = datasets.load(opened, version)
    train, validation = set(loaded.train), set(loaded.validation)
    assert not train & validation
    assert train | validation == set(range(len(rows)))
    held_out = [loaded.labels[i] for i in loaded.validation]
    assert {label: held_out.count(label) for label in "abc"} == {"a": 10, "b": 4, "c": 1}
    assert version.split["seed"] == 7 and version.split["validation_fraction"] == 0.2

    again = datasets._split(loaded.labels, 0.2, 7)
    assert (again["train"], again["validation"]) == (loaded.train, loaded.validation)
    assert datasets._split(loaded.labels, 0.2, 8)["validation"] != loaded.validation


def test_an_image_folder_imports_and_loads(opened: Store, tmp_path: Path) -> None:
    images = {"cats/1.png": _png((200, 10, 10)), "cats/2.png": _png((190, 20, 20)), "dogs/a.png": _png((0, 0, 200))}
    images["dogs/b.png"] = _png((0, 10, 180))
    images["dogs/copy.png"] = images["dogs/a.png"]
    for name, content in images.items():
        (tmp_path / "photos" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "photos" / name).write_bytes(content)
    (tmp_path / "photos" / ".DS_Store").write_bytes(b"finder junk")

    def import_photos() -> datasets.DatasetVersion:
        return datasets.import_file(opened, tmp_path / "photos", name="pets", task="image-classification")

    version = import_photos()
    assert (version.examples, version.labels) == (4, ["cats", "dogs"])
    assert "photos/dogs/copy.png" in version.warnings[0]
    loaded = datasets.load(opened, version)
    assert loaded.labels == ["cats", "cats", "dogs", "dogs"]
    assert list(loaded.images) == [images[name] for name in ("cats/1.png", "cats/2.png", "dogs/a.png", "dogs/b.png")]
    assert loaded.texts == []
    assert import_photos() == version  # the canonical tar does not depend on file times

    (tmp_path / "photos" / "dogs" / "broken.png").write_bytes(images["dogs/b.png"][:30])
    (tmp_path / "photos" / "cats" / "notes.txt").write_text("not an image")
    (tmp_path / "photos" / "cats" / "empty.png").write_bytes(b"")
    (tmp_path / "photos" / "dogs" / "huge.png").write_bytes(claiming(_png((9, 9, 9)), 20_000, 20_000))
    jpeg = io.BytesIO()
    Image.new("RGB", (8, 8), (40, 50, 60)).save(jpeg, "JPEG")
    (tmp_path / "photos" / "dogs" / "named-png.png").write_bytes(jpeg.getvalue())  # read by content, not name
    with pytest.raises(DatasetError) as error:
        import_photos()
    assert "photos/cats/notes.txt: not a readable image" in error.value.message
    assert "photos/dogs/broken.png: not a readable image" in error.value.message
    assert "photos/cats/empty.png: not a readable image" in error.value.message
    assert "photos/dogs/huge.png: not a readable image (said by its header to hold over 178 megapixels (where" \
        " Pillow stops), over the limit of 50)" in error.value.message
    assert "named-png" not in error.value.message and "4 problems" in error.value.message


def test_an_image_folder_needs_class_folders(opened: Store, tmp_path: Path) -> None:
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "1.png").write_bytes(_png((1, 2, 3)))
    with pytest.raises(DatasetError, match="flat has no class folders with images"):
        datasets.import_file(opened, tmp_path / "flat", name="flat", task="image-classification")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "has space"}, "not a usable dataset name"),
        ({"name": "t", "task": "translation"}, "unknown task"),
        ({"name": "t", "validation_fraction": 1.0}, "not between 0 and 1"),
        ({"name": "t", "task": "image-classification"}, "is not a folder"),
    ],
)
def test_impossible_requests_are_refused_before_reading(
    opened: Store, tmp_path: Path, kwargs: dict, message: str
) -> None:
    with pytest.raises(DatasetError, match=message):
        datasets.import_file(opened, _write(tmp_path, "t.csv", _csv(ROWS)), **kwargs)


def test_progress_is_reported_up_to_the_file_size(opened: Store, tmp_path: Path) -> None:
    path = _write(tmp_path, "t.csv", _csv(ROWS))
    seen: list[tuple[int, int]] = []
    datasets.import_file(opened, path, name="tickets", progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (path.stat().st_size, path.stat().st_size)


def test_the_sample_dataset_imports_cleanly(opened: Store) -> None:
    with resources.as_file(resources.files("appliance.samples") / "support_tickets.csv") as sample:
        version = datasets.import_file(opened, sample, name="support-tickets")
    assert version.warnings == []
    assert version.labels == ["account", "billing", "shipping", "technical"]
    assert datasets.load(opened, version).counts == {label: 75 for label in version.labels}


def test_the_cli_imports_lists_and_shows(tmp_path: Path) -> None:
    run_cli("keys", "init", check=True)
    path = _write(tmp_path, "t.csv", _csv([*ROWS, ROWS[0]]))
    imported = run_cli("data", "import", str(path), "--name", "tickets", "--seed", "3", check=True)
    assert "imported as tickets:1" in imported.stdout
    assert "billing" in imported.stdout and "warning: dropped 1 duplicate" in imported.stdout
    again = run_cli("data", "import", str(path), "--name", "tickets", "--seed", "3", "--residency", "burst-allowed").stdout
    assert "already stored as tickets:1" in again and "--seed" not in again  # the seed it was stored with
    assert ("note: --residency burst-allowed is not used: the version keeps local-only; 'appliance data residency"
            " tickets:1 burst-allowed' changes it") in again

    listed = json.loads(run_cli("data", "list", "--json", check=True).stdout)
    assert [(v["ref"], v["examples"]) for v in listed] == [("tickets:1", len(ROWS))]
    shown = json.loads(run_cli("data", "show", "tickets", "--json", check=True).stdout)
    assert shown["counts"] == {"billing": 3, "shipping": 3, "technical": 2}
    assert shown["split"] == {"seed": 3, "validation_fraction": 0.2, "train": 5, "validation": 3}
    text = run_cli("data", "show", listed[0]["id"][:10], check=True).stdout
    assert "residency   local-only" in text and str(path) in text


def test_the_cli_refuses_a_pipe_or_a_device_as_a_dataset_file_at_once(tmp_path: Path) -> None:
    """A pipe would hang the import (a timeout, not a hang, if it does) and a device never end: refused, named."""
    run_cli("keys", "init", check=True)
    os.mkfifo(tmp_path / "pipe.csv")
    (tmp_path / "null.csv").symlink_to("/dev/null")
    for name, kind in (("pipe.csv", "a named pipe (FIFO)"), ("null.csv", "a character device")):
        result = run_cli("data", "import", str(tmp_path / name), "--name", "tickets", timeout=60)
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert f"{tmp_path / name} is {kind}, not a regular file" in result.stderr
    assert run_cli("data", "show", "tickets").returncode == 1


def test_a_line_too_long_to_be_an_example_is_read_past_not_held(opened: Store, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A file with no line breaks (or one enormous line) would be read whole into memory: the reader holds at most
    MAX_LINE_BYTES of a line, names it, and the lines after keep their numbers."""
    monkeypatch.setattr(datasets, "MAX_LINE_BYTES", 1000)
    path = _write(tmp_path, "t.jsonl", _jsonl(ROWS) + "x" * 5000 + "\n" + _jsonl(ROWS[:1]) + "{oops\n")
    with pytest.raises(DatasetError) as refused:
        datasets.import_file(opened, path, name="tickets")
    assert "t.jsonl line 9: over 1,000 bytes long, so not read" in refused.value.message
    assert "t.jsonl line 11: not valid JSON" in refused.value.message
    endless = _write(tmp_path, "endless.csv", "text,label\n" + "y" * 5000)
    with pytest.raises(DatasetError, match="endless.csv line 2: over 1,000 bytes long"):
        datasets.import_file(opened, endless, name="endless")


def test_the_cli_reports_a_bad_file_without_a_traceback(tmp_path: Path) -> None:
    run_cli("keys", "init", check=True)
    path = _write(tmp_path, "t.csv", b"text,label\n" + GOOD.encode() + b"caf\xe9,billing\n")
    result = run_cli("data", "import", str(path), "--name", "tickets")
    assert result.returncode == 1
    assert "error: t.csv line 10 column 4: not valid UTF-8" in result.stderr
    assert "Traceback" not in result.stderr
    assert run_cli("data", "show", "tickets").returncode == 1
