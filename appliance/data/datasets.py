"""Dataset versions: a file or folder turned into checked, hashed, encrypted training data.

import_data() reads a CSV (or TSV) or JSONL file of texts, or a folder of class subfolders of
images, from a source (sources.py: a local path, a name inside daemon.import_dir, or an
upload), checks every example and reports the problems together, each with the file
and line, column or image it is on, never with what the file holds. What passes is normalised to one canonical form (JSON
lines of text and label in file order; an uncompressed tar of label/file entries with
fixed metadata) whose SHA-256 is its blob id: the same data under the same name is one
version however often it is imported, and under another name a version of its own that
shares the stored content. The train/validation split is stratified per label and fixed
by its seed. Plaintext never touches the disk: files are read line by line, normalised
in memory and stored with blobs.put.

A version's content can go two ways, its row staying for the runs and models that name
it: erase_rows() for a data subject request, delete() when a person no longer wants it.
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import hashlib
import itertools
import json
import math
import random
import re
import sys
import tarfile
import types
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any, BinaryIO, Literal, overload

from appliance import pixels
from appliance.core import archive, clock, hardware, schema
from appliance.core.errors import ConfinementError, DatasetError, DatasetNotFound, PlanError
from appliance.core.text import counted, surrogate_at, whole_number
from appliance.data import sources
from appliance.store import Store, audit, blobs, seal
from appliance.store.db import transaction

TEXT = "text-classification"
IMAGE = "image-classification"
TASKS = (TEXT, IMAGE)
TEXT_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson")
# What separates a delimited file's fields: the first that splits its header into the named columns (a spreadsheet
# saves ";" where a comma is the decimal mark, and a .tsv has tabs), else a comma.
DELIMITERS = {",": "comma", ";": "semicolon", "\t": "tab"}
MAX_IMAGE_BYTES = pixels.MAX_IMAGE_BYTES
MAX_SHOWN = 20  # problems (and dropped lines) listed one by one; the rest are counted
PROGRESS_STEP = 256 * 1024  # bytes read between two progress reports on a text file
CANONICAL_PIECE = 1 << 20  # bytes of a text set's canonical content made at once (_canonical)
ID_PREFIX = re.compile(r"[0-9a-fA-F]{8,64}")
ACTION = "dataset.import"
LOCAL_ONLY, BURST_ALLOWED = "local-only", "burst-allowed"
RESIDENCIES = (LOCAL_ONLY, BURST_ALLOWED)  # whether a version may leave this box for a burst to a Ray cluster
MAX_TEXT_CHARS = 20_000  # the default bound on one text at import; a longer one is cut (or skipped) and counted
MAX_FIELD_CHARS = 64 * 2**20  # a CSV field the reader takes at all (Python's default, 128 Ki, refused whole files
csv.field_size_limit(MAX_FIELD_CHARS)  # for one long text); max_text_chars then cuts it or leaves it out
MAX_LINE_BYTES = 64 * 2**20  # a line read at all: a file with no line break is otherwise read whole into memory
Truncation = Literal["head", "head+tail"]  # how a model reads a text longer than its token window (words.py)
DEFAULT_WINDOW = 128  # tokens of a text a model reads unless its run names another (TrainParams.max_length)
WINDOW_SAMPLE = 2000  # texts read with the base model's tokenizer at import, to say how many the window cuts
LONG_TEXTS = ("truncate", "skip")  # what happens to a text over the bound: its two ends kept, or left out

Progress = Callable[[int, int], None]
Stream = Callable[[], Iterator[bytes]]  # a version's canonical content, as a stream that can be started again
ImageFile = tuple[str, "tuple[int, int] | bytes"]  # an image set's entry (label/file): its place in a stored
# version's canonical tar (start, size), or its bytes


@dataclass(frozen=True)
class DatasetVersion:
    """One immutable imported version of a named dataset, as its row in `datasets` holds it."""

    id: str
    name: str
    version: int
    task: str
    blob_id: str
    source: str
    examples: int
    labels: list[str]
    split: dict[str, Any]
    warnings: list[str]
    residency: str
    created_at: str
    erased_at: str | None = None  # when its content was removed: by a data subject request, or deleted_by
    replaced_by: str | None = None  # the id of the version written without the erased rows
    parent: str | None = None  # the version this one extends with feedback
    deleted_by: str | None = None  # who deleted its content (delete), when no data subject request did
    counts: dict[str, int] | None = None  # examples per label; None for a version kept before they were (label_counts)

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"

    @property
    def removal(self) -> str | None:
        """How its content went, as a sentence; None while it is kept."""
        if self.erased_at is None:
            return None
        if self.deleted_by is not None:
            return f"deleted on {self.erased_at[:19]} by {self.deleted_by}"
        return f"erased on {self.erased_at[:19]} by a data subject request"

    def summary(self) -> dict[str, Any]:
        """The version as JSON, with the split's sizes rather than its index lists (which grow with the data)."""
        split = {**self.split, "train": len(self.split["train"]), "validation": len(self.split["validation"])}
        return {**dataclasses.asdict(self), "ref": self.ref, "split": split, "removal": self.removal}


class StoredImages(Sequence[bytes]):
    """An image dataset's files by index, each read from the encrypted store when asked (decrypting only the chunks
    that hold it), so a set of any size trains in the memory of a few batches. Pickled (for a helper process that
    has no store) it is the list of its files."""

    def __init__(self, blob: blobs.Opened, spans: list[tuple[int, int]]) -> None:
        self._blob, self._spans = blob, spans  # each file's (start, size) in the canonical tar

    def __len__(self) -> int:
        return len(self._spans)

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...
    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            return [self._blob.read(*span) for span in self._spans[index]]
        return self._blob.read(*self._spans[index])

    def __reduce__(self) -> tuple[type[list], tuple[list[bytes]]]:
        return list, (list(self),)


@dataclass(frozen=True)
class LoadedDataset:
    """A version ready to train on: examples by index (texts in memory, images read when asked), and the split
    over them."""

    version: DatasetVersion
    labels: list[str]
    label_names: list[str]
    train: list[int]
    validation: list[int]
    texts: list[str] = field(default_factory=list)
    images: Sequence[bytes] = field(default_factory=list)

    @property
    def examples(self) -> Sequence[str] | Sequence[bytes]:
        """The examples by index: texts, or image files."""
        return self.images if self.version.task == IMAGE else self.texts

    @property
    def counts(self) -> dict[str, int]:
        """Examples per label, in label_names order (sorted, as the version's row keeps them)."""
        return _counts(self.labels)

    def validation_sample(self, size: int, seed: int) -> list[int]:
        """The validation split, or where it holds more than size, a stratified sample of that many (each label in
        its share, at least one each), the same for every call with the seed: what scores a model where scoring all
        of a large split would cost more than it tells."""
        if len(self.validation) <= size:
            return self.validation
        by_label: dict[str, list[int]] = {}
        for index in self.validation:
            by_label.setdefault(self.labels[index], []).append(index)
        labels = sorted(by_label)
        quotas = {label: size * len(by_label[label]) / len(self.validation) for label in labels}
        shares = {label: max(1, math.floor(quota)) for label, quota in quotas.items()}
        by_remainder = sorted(labels, key=lambda label: quotas[label] - math.floor(quotas[label]), reverse=True)
        for label in by_remainder[:max(0, size - sum(shares.values()))]:  # the largest remainders round up
            shares[label] += 1
        rng = random.Random(seed)
        return sorted(index for label in labels
                      for index in rng.sample(by_label[label], min(shares[label], len(by_label[label]))))


COLUMNS = tuple(f.name for f in dataclasses.fields(DatasetVersion))
JSON_COLUMNS = ("labels", "split", "warnings", "counts")


# -- importing ---------------------------------------------------------------------


def import_file(store: Store, path: str | Path, **options: Any) -> DatasetVersion:
    """import_data() from a file or folder the calling user named (the CLI without a daemon, tests, benchmarks)."""
    return import_data(store, sources.LocalPath(Path(path)), **options)


def import_data(
    store: Store,
    source: sources.Source,
    *,
    name: str,
    task: str = TEXT,
    text_column: str = "text",
    label_column: str = "label",
    validation_fraction: float = 0.2,
    seed: int = 13,
    min_per_class: int = 2,
    max_text_chars: int = MAX_TEXT_CHARS,
    long_texts: str = "truncate",
    residency: str = LOCAL_ONLY,
    actor: str | None = None,
    progress: Progress | None = None,
) -> DatasetVersion:
    """Check a source's examples and store them as the next version of the named dataset.

    Identical content under the same name returns the version that already holds it, residency unchanged
    (set_residency() changes it). Messages and the audit record name places (file, line, column), never
    what the file holds. A text over max_text_chars never refuses the file: it is cut to its first and last
    max_text_chars / 2 characters, or with long_texts="skip" left out, and the version's warnings say which lines.
    """
    check_request(store, source, name=name, task=task, validation_fraction=validation_fraction,
                  residency=residency, long_texts=long_texts, actor=actor)
    details: dict[str, Any] = {"source": source.origin, "task": task, "residency": residency}
    try:
        examples, warnings = _read(source, task, (text_column, label_column), (max_text_chars, long_texts),
                                   min_per_class, progress)
        if task == TEXT and (note := _window_note([str(e.content) for e in examples], store.settings.base_model,
                                                  seed)):
            warnings.append(note)
        canonical = _packed(source, task, examples)
        existing = _kept(store, name, _digest(canonical))
    except (DatasetError, ConfinementError):
        # A refusal is audited too: operation() writes the "failed" record and re-raises.
        with audit.operation(store, ACTION, name, actor=actor, **details):
            raise
    if existing is not None:
        return existing
    labels = [example.label for example in examples]
    with audit.operation(store, ACTION, name, actor=actor, **details) as recorded:
        blob_id = blobs.put(store, canonical())
        version = _next_version(store, name)
        dataset_id = _identity(name, version, blob_id)
        _insert(store, DatasetVersion(
            id=dataset_id, name=name, version=version, task=task, blob_id=blob_id, source=source.origin,
            examples=len(labels), labels=sorted(set(labels)), split=_split(labels, validation_fraction, seed),
            warnings=warnings, residency=residency, created_at=clock.stamp(), counts=_counts(labels)))
        recorded.update(id=dataset_id, version=version, examples=len(labels), warnings=len(warnings))
    return _select(store, "id = ?", (dataset_id,))[0]


def extend(store: Store, base: DatasetVersion, additions: list[tuple[str | bytes, str]], *, source: str,
           actor: str | None = None) -> DatasetVersion:
    """The next version of base's dataset: its examples plus (example, label) additions, such as feedback; an
    example is a text, or for an image dataset an image file's bytes (it joins its label's folder).

    An addition already in the data replaces that example's label: it is the newer word on it. The split is drawn
    again over the whole, with base's seed and fraction, so new examples reach both training and validation.
    Residency is inherited; `parent` names base. An image set is rewritten a file at a time (_image_stream), so
    a set of any size is extended in the memory of a few photos.
    """
    if base.task == IMAGE:
        labels, relabelled, canonical = _extended_images(store, base, additions)
    else:
        labels, relabelled, canonical = _extended_texts(store, base, additions)
    details = {"base": base.ref, "source": source, "added": len(labels) - base.examples, "relabelled": relabelled}
    with audit.operation(store, "dataset.extend", base.name, actor=actor, **details) as recorded:
        existing = _kept(store, base.name, _digest(canonical))
        if existing is not None:
            recorded["unchanged"] = existing.ref
            return existing
        blob_id = blobs.put(store, canonical())
        version = _next_version(store, base.name)
        dataset_id = _identity(base.name, version, blob_id)
        warnings = [f"{relabelled} examples of {base.ref} relabelled by newer feedback"] if relabelled else []
        _insert(store, DatasetVersion(
            id=dataset_id, name=base.name, version=version, task=base.task, blob_id=blob_id, source=source,
            examples=len(labels), labels=sorted(set(labels)),
            split=_split(labels, base.split["validation_fraction"], base.split["seed"]), warnings=warnings,
            residency=base.residency, created_at=clock.stamp(), parent=base.id, counts=_counts(labels)))
        recorded.update(id=dataset_id, version=version)
    return _select(store, "id = ?", (dataset_id,))[0]


def _extended_texts(store: Store, base: DatasetVersion, additions: list[tuple[str | bytes, str]]
                    ) -> tuple[list[str], int, Stream]:
    """A text set with additions (extend()): its labels, how many were relabelled, its canonical content."""
    examples = _examples(store, base)
    position = {example.content: index for index, example in enumerate(examples)}
    relabelled = 0
    for added, label in additions:
        if added in position:
            relabelled += examples[position[added]].label != label
            examples[position[added]] = dataclasses.replace(examples[position[added]], label=label)
        else:
            position[added] = len(examples)
            examples.append(_Example(str(added), label, added))
    return [example.label for example in examples], relabelled, _canonical(examples)


def _extended_images(store: Store, base: DatasetVersion, additions: list[tuple[str | bytes, str]]
                     ) -> tuple[list[str], int, Stream]:
    """An image set with additions (extend()), matched to its photos by their SHA-256, each read once to hash it:
    its labels, how many were relabelled, its canonical content as a stream."""
    photos = [(added, label) for added, label in additions if isinstance(added, bytes)]
    if len(photos) < len(additions):
        raise DatasetError(f"{base.ref} is an image dataset: what joins it must be image files, not texts")
    blob = blobs.Opened(store, _blob_of(store, base))
    files: list[ImageFile] = list(_image_entries(blob))
    position = {hashlib.sha256(blob.read(*where)).digest(): index for index, (_, where) in enumerate(files)}
    relabelled = 0
    for added, label in photos:
        digest = hashlib.sha256(added).digest()
        if digest in position:
            name, where = files[position[digest]]
            relabelled += name.split("/", 1)[0] != label
            files[position[digest]] = f"{label}/{name.partition('/')[2]}", where
        else:
            position[digest] = len(files)
            files.append((f"{label}/feedback-{digest.hex()[:16]}", added))
    return [name.split("/", 1)[0] for name, _ in files], relabelled, _image_stream(blob, files)


def _image_stream(blob: blobs.Opened, files: list[ImageFile]) -> Stream:
    """An image set's canonical tar, made a file at a time: each stored file read from blob as the stream reaches
    it (only the chunks that hold it decrypted, each once when read in order), new ones given as bytes."""

    def entries() -> Iterator[tuple[str, bytes]]:
        for name, where in files:
            yield name, where if isinstance(where, bytes) else blob.read(*where)

    return lambda: archive.stream(entries(), mode=0o644)


def _digest(canonical: Stream) -> str:
    """The SHA-256 of a canonical content, which is its blob's id."""
    digest = hashlib.sha256()
    for piece in canonical():
        digest.update(piece)
    return digest.hexdigest()


def _identity(name: str, version: int, blob_id: str) -> str:
    """A version's id: one per name:version, and naming its content, so lineage that quotes it pins both."""
    return hashlib.sha256(f"{name}:{version}:{blob_id}".encode()).hexdigest()


def _counts(labels: list[str]) -> dict[str, int]:
    """Examples per label, sorted by label: what a version's row keeps."""
    return dict(sorted(Counter(labels).items()))


def label_counts(store: Store, version: DatasetVersion) -> dict[str, int]:
    """Examples per label: as the version's row keeps them, or for one kept before rows did, counted from its
    content once and kept (reading a large set takes a while, and a console shows them at every look); {} once its
    content is gone."""
    if version.counts is not None:
        return version.counts
    if version.removal:
        return {}
    counts = load(store, version).counts
    with transaction(store.db):
        store.db.execute("UPDATE datasets SET counts = ? WHERE id = ?", (json.dumps(counts), version.id))
    return counts


def _next_version(store: Store, name: str) -> int:
    return store.db.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM datasets WHERE name = ?", (name,)).fetchone()[0]


def _insert(store: Store, version: DatasetVersion) -> None:
    row = {column: getattr(version, column) for column in COLUMNS}
    row.update({column: json.dumps(row[column]) for column in JSON_COLUMNS})
    store.db.execute(f"INSERT INTO datasets ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                     list(row.values()))


def adopt(store: Store, version: DatasetVersion, content: bytes) -> DatasetVersion:
    """Keep a version made by another appliance (a burst job's), with its id, name, version and split."""
    if hashlib.sha256(content).hexdigest() != version.blob_id:
        raise DatasetError(f"the content sent for dataset {version.ref} does not match its hash {version.blob_id[:12]}")
    with audit.operation(store, "dataset.adopt", version.ref, id=version.id):
        blobs.put(store, content)
        _insert(store, dataclasses.replace(version, parent=None))  # its parent stays on the appliance that made it
    return get(store, version.ref)


def set_residency(store: Store, ref: str, residency: str, actor: str | None = None) -> list[DatasetVersion]:
    """Say whether a dataset may leave this box: every version of a name, or the one version of name:version."""
    with audit.operation(store, "dataset.residency", ref, actor=actor, residency=residency) as details:
        _check_residency(residency)
        named = [] if ":" in ref else _select(store, "name = ?", (ref,))
        versions = named or [get(store, ref)]  # get() also takes an id prefix, and names what is unknown
        details["changed"] = {version.ref: version.residency for version in versions if version.residency != residency}
        store.db.execute(
            f"UPDATE datasets SET residency = ? WHERE id IN ({', '.join('?' * len(versions))})",
            (residency, *(version.id for version in versions)),
        )
    return [get(store, version.ref) for version in versions]


def _check_residency(residency: str) -> None:
    if residency not in RESIDENCIES:
        raise DatasetError(f"unknown residency {residency!r}",
                           hint=f"use {LOCAL_ONLY} (never leaves this box) or {BURST_ALLOWED}")


def _read(
    source: sources.Source,
    task: str,
    columns: tuple[str, str],
    long_texts: tuple[int, str],
    min_per_class: int,
    progress: Progress | None,
) -> tuple[list[_Example], list[str]]:
    """Every example of the source, checked, and the warnings; raise with all the problems found."""
    collector = _Collector(source.name)
    try:
        if task == IMAGE:
            _read_images(source, collector, progress)
        else:
            _read_text(source, collector, progress, columns, long_texts)
    except OSError as exc:
        raise DatasetError(f"cannot read {source.name}: {exc.strerror}") from exc
    return collector.examples, collector.finish(min_per_class)


def _window_note(texts: list[str], base_dir: Path, seed: int) -> str | None:
    """How many texts are longer than the window training reads by default with the base model (counted on up to
    WINDOW_SAMPLE of them), for the version's warnings; None where none is, or where the base model's tokenizer
    cannot be read (training says why, where it matters)."""
    from appliance import words  # words takes Truncation from here

    try:
        files = {name: (base_dir / name).read_bytes() for name in ("tokenizer.json", "tokenizer_config.json")
                 if (base_dir / name).is_file()}
    except OSError:
        return None
    if "tokenizer.json" not in files or not texts:
        return None
    sample = texts if len(texts) <= WINDOW_SAMPLE else random.Random(seed).sample(texts, WINDOW_SAMPLE)
    longer = sum(words.Words.of(files, {"max_length": DEFAULT_WINDOW, "truncation": "head"}).encode(sample)[2])
    if not longer:
        return None
    counted_on = (f"{longer:,} of {len(texts):,} texts ({longer / len(texts):.0%})" if sample is texts else
                  f"about {longer / len(sample):.0%} of the texts ({longer:,} of {len(sample):,} sampled)")
    try:
        more = hardware.max_positions(base_dir)
    except PlanError:  # no config.json: training will say so
        more = DEFAULT_WINDOW
    return (f"{counted_on} are longer than the {DEFAULT_WINDOW} tokens training reads by default: it reads their"
            " beginning and end" + (f", or up to {more} tokens of them on a budget (--max-minutes)"
                                    if more > DEFAULT_WINDOW else ""))


def check_request(store: Store, source: sources.Source, *, name: str, task: str = TEXT,
                  validation_fraction: float = 0.2, residency: str = LOCAL_ONLY, long_texts: str = "truncate",
                  actor: str | None = None) -> None:
    """Refuse an import that cannot work before anything is read: the daemon checks an upload's name and options
    before it receives the body. Audited as a refused import."""
    try:
        _check_request(source, name, task, validation_fraction)
        _check_residency(residency)
        if long_texts not in LONG_TEXTS:
            raise DatasetError(f"unknown handling of long texts {long_texts[:40]!r}",
                               hint=f"use {' or '.join(LONG_TEXTS)}")
    except (DatasetError, ConfinementError):
        with audit.operation(store, ACTION, name, actor=actor, source=source.origin, task=task, residency=residency):
            raise


def _check_request(source: sources.Source, name: str, task: str, validation_fraction: float) -> None:
    schema.check_name(name, "dataset", DatasetError)
    if task not in TASKS:
        raise DatasetError(f"unknown task {task[:80]!r}", hint=f"use one of: {', '.join(TASKS)}")
    if not 0 < validation_fraction < 1:
        raise DatasetError(
            f"validation fraction {validation_fraction} is not between 0 and 1", hint="0.2 is a good start"
        )
    folder = source.is_folder()
    if task == IMAGE and not folder:
        raise DatasetError(
            f"{source.name} is not a folder", hint="image datasets are a folder with one subfolder of images per class"
        )
    if task == TEXT and (folder or Path(source.name).suffix.lower() not in TEXT_SUFFIXES):
        raise DatasetError(
            f"{source.name} is not a CSV or JSONL file",
            hint="text datasets are .csv or .tsv (with a header row) or .jsonl; a folder of images needs"
            " --task image-classification",
        )


def _kept(store: Store, name: str, blob_id: str) -> DatasetVersion | None:
    """The version of this name that holds this content now, if one does."""
    found = _select(store, "name = ? AND blob_id = ?", (name, blob_id))
    return found[-1] if found else None


@dataclass(frozen=True, slots=True)  # a large import holds millions
class _Example:
    where: str  # "customers.csv line 7" or "photos/cats/tabby.png", for messages
    label: str
    content: str | bytes  # the text, or the image file's bytes (while importing, their SHA-256: see _packed)
    entry: str = ""  # an image's name in the canonical tar: label/file


class _Collector:
    """Examples in file order with duplicates dropped, and every problem met on the way."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.examples: list[_Example] = []
        self.warnings: list[str] = []
        self.problems: list[str] = []
        self.problem_count = 0
        self._duplicates: list[str] = []
        self._seen: dict[str | bytes, _Example] = {}

    def problem(self, message: str) -> None:
        self.problem_count += 1
        if len(self.problems) < MAX_SHOWN:
            self.problems.append(message)

    def add(self, example: _Example) -> None:
        """Keep a new example, count a repeat with the same label, refuse one with another."""
        earlier = self._seen.setdefault(example.content, example)
        if earlier is example:
            self.examples.append(example)
        elif earlier.label == example.label:
            self._duplicates.append(example.where)
        else:
            kind = "text" if isinstance(example.content, str) else "image"
            self.problem(f"{example.where}: the same {kind} as {earlier.where}, with another label")

    def finish(self, min_per_class: int) -> list[str]:
        """Raise with every problem found, else return the warnings to keep with the version."""
        if not self.problem_count:  # rows with problems would skew the counts per class
            self._check_classes(min_per_class)
        if self.problem_count:
            raise DatasetError(_report(self.source, self.problems, self.problem_count), hint=_hint(self.problem_count))
        if self._duplicates:
            self.warnings.append(
                f"dropped {counted(len(self._duplicates), 'duplicate')} of earlier examples with the same label:"
                f" {_listing(self._duplicates)}"
            )
        return self.warnings

    def _check_classes(self, min_per_class: int) -> None:
        """Enough classes, and enough examples of each, to train and validate on."""
        places: dict[str, list[str]] = {}
        for example in self.examples:
            places.setdefault(example.label, []).append(example.where)
        for where in places.values():
            if len(where) < min_per_class:
                self.problem(
                    f"{_listing(where)}: {'the only example' if len(where) == 1 else 'the only examples'} of"
                    f" {'its' if len(where) == 1 else 'their'} label, fewer than the {min_per_class} each label needs"
                )
        if len(places) < 2:
            found = "every example has the same label" if places else "no examples found"
            self.problem(f"{self.source}: {found}; a classifier needs at least two classes")


def _report(source: str, shown: list[str], total: int) -> str:
    if total == 1:
        return shown[0]
    lines = [f"{source}: {total} problems", *(f"  {problem}" for problem in shown)]
    if total > len(shown):
        lines.append(f"  and {total - len(shown)} more")
    return "\n".join(lines)


def _hint(total: int) -> str:
    return f"fix {'it' if total == 1 else 'them'} and import again; nothing was stored"


def _listing(items: list[str]) -> str:
    rest = len(items) - MAX_SHOWN
    return ", ".join(items[:MAX_SHOWN]) + (f" and {rest} more" if rest > 0 else "")


# -- text files --------------------------------------------------------------------


def csv_rows(path: Path, columns: tuple[str, ...]) -> tuple[list[tuple[str, dict[str, str]]], list[str]]:
    """Every data row of a CSV file that has the named columns, with its place, and the problems met."""
    collector = _Collector(path.name)
    try:
        with path.open("rb") as file:
            rows = list(_csv_rows(path.name, _decoded_lines(path.name, file, 0, collector, None), collector, columns))
    except OSError as exc:
        raise DatasetError(f"cannot read {path.name}: {exc.strerror}") from exc
    return rows, collector.problems


def _read_text(
    source: sources.Source, collector: _Collector, progress: Progress | None, columns: tuple[str, str],
    long_texts: tuple[int, str],
) -> None:
    """Every row of a CSV or JSONL file, checked and collected; columns are (text, label); long_texts is the bound
    on a text's characters and what happens to a longer one."""
    max_chars, handling = long_texts
    over: list[str] = []
    with source.open() as file:
        lines = _decoded_lines(source.name, file, source.size() if progress else 0, collector, progress)
        if source.name.lower().endswith((".csv", ".tsv")):
            rows = _csv_rows(source.name, lines, collector, columns)
        else:
            rows = _jsonl_rows(source.name, lines, collector)
        for where, fields in rows:
            example = _text_example(where, fields, columns)
            if isinstance(example, str):
                collector.problem(example)
                continue
            if len(example.content) > max_chars:
                over.append(where.rpartition(" line ")[2])
                if handling == "skip":
                    continue
                example = dataclasses.replace(example, content=_ends(example.content, max_chars))
            collector.add(example)
    if over:
        done = ("cut to their beginning and end," if handling == "truncate" else "left out, being longer than")
        collector.warnings.append(f"{counted(len(over), 'text')} {done} {max_chars:,} characters"
                                  f" (max_text_chars): {source.name} line{'s' * (len(over) > 1)} {_listing(over)}")


def _ends(text: str, max_chars: int) -> str:
    """A text over max_chars as its first half and its last, joined by a space: what a model reads of a long text
    is its beginning, and with head+tail truncation its end too (words.py), never its middle."""
    head = max_chars // 2
    tail = max_chars - head - 1
    return text[:head] + " " + text[len(text) - tail :] if tail > 0 else text[:max_chars]


def _decoded_lines(
    name: str, file: BinaryIO, total: int, collector: _Collector, progress: Progress | None
) -> Iterator[str]:
    """The file's lines as text; a bad byte is reported with its line and column, then replaced. A line over
    MAX_LINE_BYTES is reported and read past, a blank line in its place so that the lines after keep their numbers."""
    done = reported = number = 0
    while raw := file.readline(MAX_LINE_BYTES + 1):
        number += 1
        done += len(raw)
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            done += _read_past_line(file)
            collector.problem(f"{name} line {number}: over {MAX_LINE_BYTES:,} bytes long, so not read (one example"
                              " a line is what a CSV or JSONL dataset holds)")
            yield "\n"
            continue
        if number == 1:
            raw = raw.removeprefix(codecs.BOM_UTF8)
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            collector.problem(f"{name} line {number} column {exc.start + 1}: not valid UTF-8")
            line = raw.decode("utf-8", errors="replace")
        yield line
        if progress is not None and done - reported >= PROGRESS_STEP:
            progress(done, max(done, total))
            reported = done
    if progress is not None:
        progress(done, max(done, total))


def _read_past_line(file: BinaryIO) -> int:
    """Read to the end of the line under way, a MiB at a time; how many bytes that was."""
    skipped = 0
    while chunk := file.readline(2**20):
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return skipped


def _csv_rows(
    name: str, lines: Iterable[str], collector: _Collector, columns: tuple[str, str]
) -> Iterator[tuple[str, dict[str, str]]]:
    """Each data row of a CSV file as {column: value}, with the line it starts on."""
    delimiter, lines = _delimiter(iter(lines), columns)
    records = _csv_records(name, lines, collector, delimiter)
    first = next(records, None)
    if first is None:
        return  # an empty file, or one that is not CSV: the collector says which
    header_line, header = first[0], [column.strip() for column in first[1]]
    missing = [column for column in columns if column not in header]
    if missing:
        raise DatasetError(
            f"{name} line {header_line}: no column {' or '.join(repr(column[:80]) for column in missing)}"
            f" among the header's {counted(len(header), 'column')}",
            hint="the first line must name the columns, separated by commas, semicolons or tabs (a dataset's text and"
            " label columns may have other names, given with --text-column and --label-column)",
        )
    if doubled := [column for column in columns if header.count(column) > 1]:
        raise DatasetError(f"{name} line {header_line}: the header names the column {doubled[0][:80]!r} twice, so"
                           " which of them to read is unclear",
                           hint="rename one of them (or give the one to read another name, with --text-column or"
                                " --label-column)")
    for start, row in records:
        if len(row) == len(header):
            yield f"{name} line {start}", dict(zip(header, row))
        else:
            collector.problem(
                f"{name} line {start}: {counted(len(row), 'field')}, but the header has {len(header)}"
                f" (a {DELIMITERS[delimiter]} in a text that is not in double quotes?)"
            )


def _delimiter(lines: Iterator[str], columns: tuple[str, ...]) -> tuple[str, Iterator[str]]:
    """The delimiter of a CSV file (DELIMITERS), read from its first line that is not blank, and all its lines."""
    read: list[str] = []
    for line in lines:
        read.append(line)
        if line.strip():
            break
    header = read[-1] if read else ""

    def names(delimiter: str) -> set[str]:
        try:
            return {name.strip() for name in next(csv.reader([header], delimiter=delimiter), [])}
        except csv.Error:  # reading the file says where and why (_csv_records)
            return set()

    found = next((delimiter for delimiter in DELIMITERS if set(columns) <= names(delimiter)), ",")
    return found, itertools.chain(read, lines)


def _csv_records(name: str, lines: Iterable[str], collector: _Collector, delimiter: str
                 ) -> Iterator[tuple[int, list[str]]]:
    """The non-blank records of a CSV file with the line each starts on; parsing stops at the first bad one."""
    reader = csv.reader(lines, delimiter=delimiter)
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader, None)
        except csv.Error as exc:
            reason = ("a line break (or carriage return) inside a field that is not in double quotes"
                      if "new-line character" in str(exc) else str(exc))
            collector.problem(f"{name} line {reader.line_num}: not readable as CSV ({reason})")
            return
        if row is None:
            return
        if row:
            yield start, row


def _jsonl_rows(name: str, lines: Iterable[str], collector: _Collector) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each JSON object of a JSONL file, with its line."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{name} line {number}"
        try:
            value = json.loads(line, object_pairs_hook=_once_each)
        except json.JSONDecodeError as exc:
            collector.problem(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})")
            continue
        except _RepeatedKey as exc:
            collector.problem(f"{where}: the key {str(exc)[:80]!r} twice in one object, so which value is meant is"
                              " unclear")
            continue
        except RecursionError:
            collector.problem(f"{where}: JSON nested too deeply to read")
            continue
        if not isinstance(value, dict):
            collector.problem(f"{where}: expected a JSON object, found {type(value).__name__}")
            continue
        yield where, value


class _RepeatedKey(ValueError):
    """A JSON object names a key twice: Python's reader would keep the last value without a word."""


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) < len(pairs):
        raise _RepeatedKey(next(key for key, _ in pairs if [k for k, _ in pairs].count(key) > 1))
    return found


def _text_example(where: str, fields: dict[str, Any], columns: tuple[str, str]) -> _Example | str:
    """The row as an example, or the problem that stops it being one."""
    for column in columns:
        if column not in fields:
            return f"{where}: no field {column[:80]!r} (the object has {counted(len(fields), 'field')})"
    text = _as_text(fields[columns[0]])
    label = _as_text(fields[columns[1]], numbers=True)
    if text is None or label is None:
        return f"{where}: the {'text' if text is None else 'label'} is not a string"
    if not text:
        return f"{where}: empty text"
    if not label:
        return f"{where}: missing label"
    for field_name, value in (("text", text), ("label", label)):
        if (at := surrogate_at(value)) is not None:  # a lone \ud800-\udfff escape in JSON: no text can hold it
            return f"{where}: the {field_name} is not valid Unicode (an unpaired surrogate escape at character {at + 1})"
    return _Example(where, sys.intern(label), text)  # one string per label, not per row


def _as_text(value: object, *, numbers: bool = False) -> str | None:
    """A JSON or CSV value as stripped text: null is empty, numbers only where asked (0/1 labels)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if numbers and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


# -- image folders -----------------------------------------------------------------


def _read_images(source: sources.Source, collector: _Collector, progress: Progress | None) -> None:
    """Every image in the class subfolders of the source, labelled by its subfolder and checked."""
    done, total = 0, source.size() if progress else 0
    stray: list[str] = []
    for image in source.files():
        where = f"{source.name}/{image.entry}"
        label, slash, _rest = image.entry.partition("/")
        if not slash:
            stray.append(image.entry)
        elif image.size > MAX_IMAGE_BYTES:
            collector.problem(f"{where}: {image.size / 2**20:.1f} MiB, over the {MAX_IMAGE_BYTES // 2**20} MiB limit")
        else:
            content = image.read()
            unreadable = pixels.problem(content)
            if unreadable:
                collector.problem(f"{where}: not a readable image ({unreadable})")
            else:  # the file is read again to be stored (_packed): only its hash is kept meanwhile
                collector.add(_Example(where, label, hashlib.sha256(content).digest(), image.entry))
        done += image.size
        if progress is not None:
            progress(done, max(done, total))
    if not collector.examples and not collector.problem_count:
        raise DatasetError(
            f"{source.name} has no class folders with images",
            hint=f"put each class's images in a subfolder named after it, e.g. {source.name}/cats/1.png",
        )
    if stray:
        collector.warnings.append(f"ignored {counted(len(stray), 'file')} outside class folders: {_listing(stray)}")


# -- canonical form and split ------------------------------------------------------


def _packed(source: sources.Source, task: str, examples: list[_Example]) -> Callable[[], Iterator[bytes]]:
    """The canonical form of an import's examples, as a stream that can be started again (once to hash it, once
    to store it). An image set's files are read from the source again as the stream reaches them, a file at a
    time, and one that changed since it was checked (its hash differs) fails the import: so a folder of any size
    is imported in the memory of one photo."""
    if task != IMAGE:
        return _canonical(examples)

    def files() -> Iterator[tuple[str, bytes]]:
        kept = {example.entry: example for example in examples}
        for image in source.files():
            example = kept.pop(image.entry, None)  # popped: a name a tar holds twice is packed once
            if example is None:
                continue  # a duplicate, a stray file
            try:
                content = image.read()
            except OSError as exc:
                raise DatasetError(f"cannot read {example.where} again to store it: {exc.strerror}") from exc
            if hashlib.sha256(content).digest() != example.content:
                raise DatasetError(f"{example.where} changed while it was being imported",
                                   hint="import the folder again once nothing writes to it")
            yield example.entry, content
        if kept:
            raise DatasetError(f"{next(iter(kept.values())).where} went missing while it was being imported",
                               hint="import the folder again once nothing writes to it")

    return lambda: archive.stream(files(), mode=0o644)


def _canonical(examples: list[_Example]) -> Stream:
    """The one byte form of a text set's examples that the version's id is the hash of, made in pieces of about
    CANONICAL_PIECE bytes each time it is read (to hash it, then to store it), so that it is never whole in memory
    beside the examples (an image set's is made a file at a time: _packed, _image_stream)."""

    def pieces() -> Iterator[bytes]:
        lines: list[bytes] = []
        size = 0
        for example in examples:
            # json.dumps({"text": ..., "label": ...}, ensure_ascii=False), byte for byte, by json's own string
            # encoder: a quarter of the time, which matters at a million rows
            text, label = encode_basestring(example.content), encode_basestring(example.label)
            lines.append(f'{{"text": {text}, "label": {label}}}\n'.encode())
            size += len(lines[-1])
            if size >= CANONICAL_PIECE:
                yield b"".join(lines)
                lines, size = [], 0
        yield b"".join(lines)

    return pieces



def _split(labels: list[str], fraction: float, seed: int) -> dict[str, Any]:
    """Train and validation indices, stratified per label and fixed by the seed.

    Every class of two or more examples gets at least one validation and one training example.
    """
    rng = random.Random(seed)
    by_label: dict[str, list[int]] = {}
    for index, label in enumerate(labels):
        by_label.setdefault(label, []).append(index)
    validation: set[int] = set()
    for label in sorted(by_label):
        indices = by_label[label]
        rng.shuffle(indices)
        validation.update(indices[: min(max(round(len(indices) * fraction), 1), len(indices) - 1)])
    return {
        "seed": seed,
        "validation_fraction": fraction,
        "train": [index for index in range(len(labels)) if index not in validation],
        "validation": sorted(validation),
    }


# -- reading versions --------------------------------------------------------------


def list_versions(store: Store) -> list[DatasetVersion]:
    """Every version of every dataset, by name then version."""
    return _select(store, "1", ())


def get(store: Store, ref: str) -> DatasetVersion:
    """The version a person or a run names: 'name' (its latest), 'name:version' or an id prefix."""
    name, colon, number = ref.partition(":")
    if colon:
        version = whole_number(number)
        found = [] if version is None else _select(store, "name = ? AND version = ?", (name, version))
    else:
        found = _select(store, "name = ?", (ref,))[-1:]
        if not found and ID_PREFIX.fullmatch(ref):
            found = _select(store, "id LIKE ?", (ref.lower() + "%",))
    if len(found) > 1:
        raise DatasetError(
            f"{ref!r} is the start of {len(found)} dataset ids: {', '.join(v.ref for v in found)}",
            hint="give more of the id, or name:version",
        )
    if not found:
        names = sorted({version.name for version in list_versions(store)})
        raise DatasetNotFound(
            f"no dataset {ref!r}",
            hint=f"known datasets: {', '.join(names)} (see 'appliance data list')"
            if names
            else "none imported yet: 'appliance data import PATH --name NAME'",
        )
    return found[0]


def load(store: Store, version: DatasetVersion) -> LoadedDataset:
    """A version in the form training reads, decrypted into memory and never onto disk: a text set whole; an image
    set as the place of each file, each read when asked (StoredImages)."""
    split = (version.split["train"], version.split["validation"])
    if version.task == IMAGE:
        blob = blobs.Opened(store, _blob_of(store, version))
        entries = _image_entries(blob)
        return LoadedDataset(version, [name.split("/", 1)[0] for name, _ in entries], version.labels, *split,
                             images=StoredImages(blob, [span for _, span in entries]))
    texts: list[str] = []
    labels: list[str] = []
    for text, label in _records(store, version):
        texts.append(text)
        labels.append(label)
    return LoadedDataset(version, labels, version.labels, *split, texts=texts)


def _image_entries(blob: blobs.Opened) -> list[tuple[str, tuple[int, int]]]:
    """Each file of an image set's canonical tar, by name, with its place (start, size) in the tar: one pass over
    the blob, a chunk in memory at a time, that also checks the whole content against its id."""
    chunks = blobs.get(blob.store, blob.blob_id)
    stream = types.SimpleNamespace(read=seal.reader(chunks))  # all tarfile's stream mode calls
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        entries = [(member.name, (member.offset_data, member.size)) for member in tar if member.isfile()]
    for _rest in chunks:  # the padding after the last member: the id is checked once every chunk has been read
        pass
    return entries


def content(store: Store, version: DatasetVersion) -> bytes:
    """The canonical content of a version, decrypted into memory; a removed one says how and names what to use."""
    return blobs.read(store, _blob_of(store, version))


def content_chunks(store: Store, version: DatasetVersion) -> tuple[int, Iterator[bytes]]:
    """The canonical content of a version, decrypted a chunk at a time as the caller reads (an image set may hold
    gigabytes), and its size in bytes; a removed one says how and names what to use."""
    blob_id = _blob_of(store, version)
    return blobs.size(store, blob_id), blobs.get(store, blob_id)


def _blob_of(store: Store, version: DatasetVersion) -> str:
    """The blob that holds a version's content; a removed one says how and names what to use."""
    if version.blob_id is None:
        replacement = _select(store, "id = ?", (version.replaced_by,)) if version.replaced_by else []
        raise DatasetError(
            f"dataset {version.ref} was {version.removal}",
            hint=f"use {replacement[0].ref}, written without the erased rows" if replacement
            else "import the data again" if version.deleted_by
            else "no rows were left to keep; import the data again without them",
        )
    return version.blob_id


# -- erasing a data subject's rows -------------------------------------------------


def matching_rows(store: Store, version: DatasetVersion, needle: str) -> list[int]:
    """The indices of the examples whose text, label or image file name contains needle, in any case."""
    if version.erased_at is not None:
        return []
    folded = needle.casefold()
    if version.task == IMAGE:  # an image's name (label/file) is all there is to match: the photos stay unread
        entries = _image_entries(blobs.Opened(store, _blob_of(store, version)))
        return [index for index, (name, _) in enumerate(entries) if folded in name.casefold()]
    return [index for index, example in enumerate(_examples(store, version))
            if folded in example.where.casefold() or folded in example.label.casefold()]


def matching_metadata(version: DatasetVersion, needle: str) -> list[str]:
    """What a version's row says in plain text that contains needle, in any case: its warnings (an image set's name
    the files they drop, label folder and all), and where its content is gone (deleted, or erased by an earlier
    request) its label names, which no example is left to match. A version that keeps its content names no such
    label: matching_rows() finds every example of it, and erase_rows() takes it out of the row."""
    folded = needle.casefold()
    labels = [] if version.erased_at is None else sorted({*version.labels, *(version.counts or {})})
    return [entry for entry in [*labels, *version.warnings] if folded in entry.casefold()]


def forget(store: Store, version: DatasetVersion, entries: set[str]) -> None:
    """Take what matching_metadata() found out of a version's row: a label with its count, a warning whole. The
    caller holds the audited transaction (privacy.erase)."""
    counts = None if version.counts is None else {label: n for label, n in version.counts.items()
                                                  if label not in entries}
    store.db.execute("UPDATE datasets SET labels = ?, counts = ?, warnings = ? WHERE id = ?",
                     (json.dumps([label for label in version.labels if label not in entries]), json.dumps(counts),
                      json.dumps([warning for warning in version.warnings if warning not in entries]), version.id))


def erase_rows(store: Store, version: DatasetVersion, rows: set[int]) -> DatasetVersion | None:
    """Write version again without rows as the name's next version, then remove the old content.

    The old row stays, marked erased and naming its replacement, so runs, studies and the lineage of models
    still read; its blob (every chunk, and the wrapped data key) is deleted, and its labels and counts become
    those of the rows kept (_label_as). Returns the replacement, or None when no example is left. The caller holds
    the audited transaction (privacy.erase).
    """
    kept = [index for index in range(version.examples) if index not in rows]
    if version.task == IMAGE:  # rewritten a file at a time, as extend() does
        blob = blobs.Opened(store, _blob_of(store, version))
        files = _image_entries(blob)
        labels = [files[index][0].split("/", 1)[0] for index in kept]
        canonical = _image_stream(blob, [files[index] for index in kept])
    else:
        examples = _examples(store, version)
        labels = [examples[index].label for index in kept]
        canonical = _canonical([examples[index] for index in kept])
    replacement = _without(store, version, kept, labels, canonical) if kept else None
    _drop_content(store, version, replaced_by=replacement and replacement.id)
    _label_as(store, version, labels)
    return replacement


def delete(store: Store, ref: str, actor: str | None = None) -> list[DatasetVersion]:
    """Delete the content of a dataset: every version of a name, or the one version of name:version.

    The rows stay, marked deleted, so the runs, models and audit records that name a version still read; a
    version erased or deleted before is left as it is. operations.delete_dataset() refuses while a job uses it.
    """
    with audit.operation(store, "dataset.delete", ref, actor=actor) as details:
        named = [] if ":" in ref else _select(store, "name = ?", (ref,))
        versions = [version for version in named or [get(store, ref)] if version.removal is None]
        if not versions:
            raise DatasetError(f"{ref}: no version of it holds content any more ({get(store, ref).removal})")
        for version in versions:
            _drop_content(store, version, deleted_by=actor or audit.default_actor())
        details["deleted"] = [version.ref for version in versions]
    return [get(store, version.ref) for version in versions]


def _drop_content(store: Store, version: DatasetVersion, *, replaced_by: str | None = None,
                  deleted_by: str | None = None) -> None:
    """Keep the row, without its content; the blob goes once no other version (of another name) shares it."""
    store.db.execute(
        "UPDATE datasets SET blob_id = NULL, erased_at = ?, replaced_by = ?, deleted_by = ? WHERE id = ?",
        (clock.stamp(), replaced_by, deleted_by, version.id),
    )
    blobs.release(store, version.blob_id)


def _label_as(store: Store, version: DatasetVersion, labels: list[str]) -> None:
    """Let an erased version's row name only the labels of the rows kept, and count only those: the labels and
    counts it had would keep, in plain text, a label that is the subject's identifier, and say by what each count
    lost which labels the subject's examples had."""
    store.db.execute("UPDATE datasets SET labels = ?, counts = ? WHERE id = ?",
                     (json.dumps(sorted(set(labels))), json.dumps(_counts(labels)), version.id))


def _without(store: Store, version: DatasetVersion, kept: list[int], labels: list[str], canonical: Stream
             ) -> DatasetVersion:
    """The version written again with only the kept rows (their labels, and the canonical content they make)."""
    found = _kept(store, version.name, _digest(canonical))
    if found is not None:
        return found  # an earlier version held exactly the rows that are left
    blob_id = blobs.put(store, canonical())
    position = {old: new for new, old in enumerate(kept)}
    split = {**version.split, **{part: [position[i] for i in version.split[part] if i in position]
                                 for part in ("train", "validation")}}
    number = _next_version(store, version.name)
    dataset_id = _identity(version.name, number, blob_id)
    _insert(store, dataclasses.replace(
        version, id=dataset_id, blob_id=blob_id, version=number,
        source=f"{version.ref} without {version.examples - len(kept)} erased examples", examples=len(kept),
        labels=sorted(set(labels)), split=split, created_at=clock.stamp(), counts=_counts(labels)))
    return _select(store, "id = ?", (dataset_id,))[0]


def _records(store: Store, version: DatasetVersion) -> Iterator[tuple[str, str]]:
    """A text set's canonical content back as (text, label), decrypted and read a line at a time: never whole in
    memory beside what the caller keeps of it (an image set's is read a file at a time: _image_entries)."""
    rest = b""
    for chunk in itertools.chain(content_chunks(store, version)[1], [b"\n"]):  # the last line, whatever ends it
        *lines, rest = (rest + chunk).split(b"\n")
        for line in filter(None, lines):
            record = json.loads(line)
            yield record["text"], sys.intern(record["label"])


def _examples(store: Store, version: DatasetVersion) -> list[_Example]:
    """A text set's examples, as an import holds them."""
    return [_Example(text, label, text) for text, label in _records(store, version)]


def _select(store: Store, where: str, params: tuple[Any, ...]) -> list[DatasetVersion]:
    rows = store.db.execute(
        f"SELECT {', '.join(COLUMNS)} FROM datasets WHERE {where} ORDER BY name, version", params
    ).fetchall()
    versions = []
    for row in rows:
        values = dict(zip(COLUMNS, row))
        values.update({column: json.loads(values[column]) for column in JSON_COLUMNS if values[column] is not None})
        versions.append(DatasetVersion(**values))
    return versions
