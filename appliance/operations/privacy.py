"""Data subject requests: find and erase every record of one person (GDPR's right to erasure).

An identifier (an email address, a customer id) is matched as a substring, ignoring
case, in every erasure source. Each source finds what it holds and erases it; the
sources are a list (SOURCES): what dataset versions' rows say in plain text (warnings, the label
names of versions whose content is gone), dataset examples, and the texts the server answered
(kept for feedback) with their true labels. Datasets are immutable, so a dataset version with matching examples
is written again without them as the name's next version, and the old version's blob
(its chunks and wrapped data key) is deleted; its row stays, marked erased, so runs and
model lineage still read, and names only the labels (and counts) of the rows kept. The models
trained on an erased version are listed for retraining; their run records stay.

The whole request is one audited transaction (`privacy.erased`), run with SQLite's
secure_delete on, so freed pages are overwritten with zeros rather than left holding
ciphertext, and the WAL is folded in and truncated afterwards. The audit record names
the versions, row counts and affected models, and the identifier only as a keyed hash
(HMAC under a key derived from the store secret): the same person asked for again gives
the same hash, and the log itself never holds who it was.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from appliance import registry
from appliance.core.errors import ErasureError
from appliance.data import datasets
from appliance.operations import jobs
from appliance.registry import feedback
from appliance.store import Store, audit, keys

ACTION = "privacy.erased"
MIN_IDENTIFIER = 3  # shorter needles would match half of any dataset


@dataclass(frozen=True)
class Finding:
    """What one source holds of the subject: where (one object) and how many records."""

    source: str
    object: str  # e.g. the dataset version's name:version
    records: int
    ids: tuple[Any, ...] = field(repr=False, default=())  # what the source erases (rows, labels, warnings); never shown

    def summary(self) -> dict[str, Any]:
        return {"source": self.source, "object": self.object, "records": self.records}


class Source(Protocol):
    """A place that may hold records of a data subject: it finds them, then erases what it found."""

    name: str

    def find(self, store: Store, identifier: str) -> list[Finding]: ...

    def erase(self, store: Store, finding: Finding) -> dict[str, Any]: ...  # what it did, for the audit record

    def affected_models(self, store: Store, findings: list[Finding]) -> list[str]: ...  # name:version to retrain


class DatasetExamples:
    """Examples in every stored dataset version: text or label (or an image's file name) containing the identifier."""

    name = "datasets"

    def find(self, store: Store, identifier: str) -> list[Finding]:
        found = []
        for version in datasets.list_versions(store):
            rows = datasets.matching_rows(store, version, identifier)
            if rows:
                found.append(Finding(self.name, version.ref, len(rows), tuple(rows)))
        return found

    def erase(self, store: Store, finding: Finding) -> dict[str, Any]:
        version = datasets.get(store, finding.object)
        replacement = datasets.erase_rows(store, version, set(finding.ids))
        return {"dataset": version.ref, "id": version.id, "rows": finding.records,
                "replaced_by": replacement.ref if replacement else None}

    def affected_models(self, store: Store, findings: list[Finding]) -> list[str]:
        return _trained_on(store, findings)


class DatasetMetadata:
    """What the rows of dataset versions say in plain text: warnings (an image set's name the files they drop), and
    the label names of versions whose content is gone (deleted, or erased by an earlier request), which no example
    is left to match. It goes before DatasetExamples, so that a replacement copies warnings already without the
    subject. The models trained on a version whose label is taken out answer with it: they are listed to retrain."""

    name = "dataset metadata"

    def find(self, store: Store, identifier: str) -> list[Finding]:
        found = []
        for version in datasets.list_versions(store):
            entries = datasets.matching_metadata(version, identifier)
            if entries:
                found.append(Finding(self.name, version.ref, len(entries), tuple(entries)))
        return found

    def erase(self, store: Store, finding: Finding) -> dict[str, Any]:
        version = datasets.get(store, finding.object)
        datasets.forget(store, version, set(finding.ids))
        return {"dataset": version.ref, "id": version.id, "entries": finding.records}

    def affected_models(self, store: Store, findings: list[Finding]) -> list[str]:
        return _trained_on(store, [finding for finding in findings
                                   if set(finding.ids) & set(datasets.get(store, finding.object).labels)])


class ServedTexts:
    """Texts the server answered and keeps for feedback, with their true labels: matched on text or label.

    They train nothing until a retrain puts their feedback into a dataset version, which DatasetExamples
    covers, so they affect no model themselves.
    """

    name = "predictions"

    def find(self, store: Store, identifier: str) -> list[Finding]:
        return [Finding(self.name, model, len(ids), tuple(ids))
                for model, ids in sorted(feedback.matching(store, identifier).items())]

    def erase(self, store: Store, finding: Finding) -> dict[str, Any]:
        return {"model": finding.object, "predictions": feedback.forget(store, list(finding.ids))}

    def affected_models(self, store: Store, findings: list[Finding]) -> list[str]:
        return []


SOURCES: list[Source] = [DatasetMetadata(), DatasetExamples(), ServedTexts()]


@dataclass(frozen=True)
class Request:
    """What a request finds (a dry run) or erased: per source and object, and the models to retrain."""

    subject: str  # the keyed hash of the identifier, never the identifier
    findings: list[Finding]
    affected_models: list[str]
    erased: list[dict[str, Any]] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(finding.records for finding in self.findings)

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "findings": [finding.summary() for finding in self.findings], "records": self.records}


def subject_hash(store: Store, identifier: str) -> str:
    """The keyed hash the audit log names a subject by: HMAC-SHA256 of the case-folded identifier."""
    key = keys.derive(store.secret, "appliance erasure subject")
    return hmac.new(key, identifier.strip().casefold().encode(), hashlib.sha256).hexdigest()


def find(store: Store, identifier: str) -> Request:
    """Everything the subject's erasure would remove, changing nothing (a dry run)."""
    identifier = _checked(identifier)
    findings = [finding for source in SOURCES for finding in source.find(store, identifier)]
    return Request(subject_hash(store, identifier), findings, _affected(store, findings))


def erase(store: Store, identifier: str, actor: str | None = None) -> Request:
    """Erase every record of the subject in one audited transaction; refused while a job uses what it changes."""
    identifier = _checked(identifier)
    subject = subject_hash(store, identifier)
    previous = store.db.execute("PRAGMA secure_delete").fetchone()[0]
    store.db.execute("PRAGMA secure_delete = ON")  # freed pages are zeroed, not left holding ciphertext
    try:
        with audit.operation(store, ACTION, subject, actor=actor) as details:
            request = find(store, identifier)
            _refuse_busy(store, request)
            erased = [_source(finding.source).erase(store, finding) for finding in request.findings]
            details.update(records=request.records, erased=erased, affected_models=request.affected_models)
    finally:
        store.db.execute(f"PRAGMA secure_delete = {int(previous)}")
    if request.findings:
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # fold the zeroed pages in and empty the WAL
    return Request(subject, request.findings, request.affected_models, erased)


def _checked(identifier: str) -> str:
    identifier = identifier.strip()
    if len(identifier) < MIN_IDENTIFIER:
        raise ErasureError(f"the identifier {identifier!r} is too short to erase by (fewer than {MIN_IDENTIFIER}"
                           " characters)", hint="give the whole email address or customer id")
    return identifier


def _affected(store: Store, findings: list[Finding]) -> list[str]:
    return sorted({model for source in SOURCES
                   for model in source.affected_models(store, [f for f in findings if f.source == source.name])})


def _trained_on(store: Store, findings: list[Finding]) -> list[str]:
    """The model versions trained on the dataset versions found."""
    return registry.trained_on(store, {datasets.get(store, finding.object).id for finding in findings})


def _source(name: str) -> Source:
    return next(source for source in SOURCES if source.name == name)


def _refuse_busy(store: Store, request: Request) -> None:
    """A queued or running job on a dataset being erased would train on the rows (or fail): refuse until it ends."""
    busy = jobs.using_datasets(store, {finding.object.partition(":")[0] for finding in request.findings
                                       if finding.source == "datasets"})
    if busy:
        raise ErasureError(f"jobs {', '.join(busy)} use a dataset this request changes, so nothing was erased",
                           hint="wait for them to finish or cancel them ('appliance jobs cancel ID'), then ask again")
