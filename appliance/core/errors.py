"""Every error the appliance reports to a person, as one tree.

    ApplianceError                anything else the operator can understand and act on (400)
     ├── ConfigError              a setting is missing, misspelt or of the wrong type
     ├── StoreError               the database or its key cannot be used as asked
     │    ├── KeyMissing          no master key from any source
     │    ├── KeyMismatch         the master key does not open this store
     │    ├── TamperDetected      stored bytes or audit records were changed
     │    ├── SchemaTooNew        the database was written by a newer appliance
     │    ├── StoreDamaged        SQLite finds the database file damaged (503)
     │    ├── StoreFull           the disk has no room for what the store, or a copy of it, writes (503)
     │    ├── StoreBusy           another process held the store's write lock longer than a command waits (503)
     │    ├── BlobNotFound        no blob with that id
     │    ├── BackupError         a backup cannot be made, fails its check, or cannot be restored now
     │    └── AlertNotFound       no alert with that id (404)
     ├── DatasetError             a dataset file is invalid, or cannot be used as asked
 │    └── DatasetNotFound     no dataset, or no version of it, by that name or id (404)
     ├── ConfinementError         a file outside the folders the daemon may read, through a link, or not plain
     ├── ErasureError             a data subject request cannot be carried out as asked
     ├── EvidenceError            a compliance evidence pack cannot be written, or does not verify
     ├── FeedbackError            true labels that cannot be taken
     │    └── PredictionNotFound  no prediction with that id, or no longer (404)
     ├── AuditWriteFailed         the audit record could not be written, so nothing happened
     │    └── AuditDiverged       the log no longer reaches its anchored head: nothing is written (503)
     ├── JobError                 a job cannot be submitted, start or go on
     │    ├── JobNotFound         no job with that id (404)
     │    ├── RunNotFound         no training run with that id (404)
     │    ├── StudyNotFound       no hyperparameter search with that id (404)
     │    └── JobInterrupted      a step was asked to stop before it finished: nothing was kept
     ├── PlanError                no training plan: the model is unreadable or does not fit
     ├── ArtifactError            a stored model bundle or artifact cannot be read
     ├── OptimizeError            export, quantisation or distillation failed
     ├── RegistryError            no such alias, or a move that cannot be made
 │    └── VersionNotFound     no model, or no version of it, by that name or number (404)
     ├── AuthError                a request has no valid API key or the key may not do this (401)
     │    ├── Unauthenticated     no key, or a malformed, unknown, revoked or wrong one
     │    └── Forbidden           a valid key that may not call this model (403)
     ├── DaemonError              the daemon cannot start, or none runs to ask (503)
     │    └── DaemonUnreachable   nothing answers on the control socket
     ├── BurstError               a burst to the Ray cluster cannot start, failed there, or came back bad
     │    └── ResidencyRefused    the dataset is local-only: it may not leave this box (403)
     └── ServeError               the inference server cannot answer this request (503)
          ├── ModelNotFound       no model of that name is being served (404)
          ├── BadRequest          the request is malformed or out of bounds (400)
          │    ├── PayloadTooLarge  the body, or one of its texts, is over its limit (413)
          │    └── RequestTimeout   the body did not arrive in time (408)
          ├── RateLimited         this API key sent more than its rate; retry after a while (429)
          └── Overloaded          too much is queued already; retry later

The statuses in brackets are what both HTTP APIs answer (a class without one takes its parent's); they come
from one table, `appliance.serve.web.STATUS`. An error body names its class (`type`), so the client raises the
same class again. Foreign errors (sqlite3, InvalidTag, OSError) are translated where they enter, with
``raise ... from exc``; the CLI turns any ApplianceError into a message and exit code 1.
"""

from __future__ import annotations


class ApplianceError(Exception):
    """Something went wrong that the operator can understand and act on."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class ConfigError(ApplianceError):
    """A setting is missing, misspelt or of the wrong type."""


class StoreError(ApplianceError):
    """The database or its key cannot be used as asked."""


class KeyMissing(StoreError):
    """No master key could be found in any of its sources."""


class KeyMismatch(StoreError):
    """The master key given does not open this store."""


class TamperDetected(StoreError):
    """Stored bytes or audit records no longer match their authentication tags."""


class SchemaTooNew(StoreError):
    """The database schema is newer than this version of the appliance."""


class StoreDamaged(StoreError):
    """SQLite finds the database file damaged (a failing disk, a copy cut short): only a backup brings it back."""


class StoreFull(StoreError):
    """The disk has no room for what the store, a backup or a restore writes."""


class StoreBusy(StoreError):
    """Another process held the database's write lock for longer than SQLite waits for it."""


class BlobNotFound(StoreError):
    """No blob with that id exists in the store."""


class BackupError(StoreError):
    """A backup cannot be made, fails its end-to-end check, or cannot be restored now."""


class AlertNotFound(StoreError):
    """No alert with that id."""


class DatasetError(ApplianceError):
    """A dataset file cannot be imported as it is, or a dataset cannot be used as asked."""


class DatasetNotFound(DatasetError):
    """No dataset, or no version of it, by that name or id."""


class ConfinementError(ApplianceError):
    """A client named a file the daemon may not read: outside its configured folders, a link, or not a plain file."""


class ErasureError(ApplianceError):
    """A data subject request (erasure) cannot be carried out as asked: nothing was erased."""


class EvidenceError(ApplianceError):
    """A compliance evidence pack cannot be written, or was changed after it was signed."""


class FeedbackError(ApplianceError):
    """True labels that cannot be attached: unknown labels, too many at once, nothing new to train on."""


class PredictionNotFound(FeedbackError):
    """No prediction with that id: never made, or deleted after its keeping time."""


class AuditWriteFailed(ApplianceError):
    """The audit record could not be written, so the operation was not carried out."""


class AuditDiverged(AuditWriteFailed):
    """The audit log disagrees with its anchored head (records cut off, an older database put back): the appliance
    writes nothing until an admin accepts the rewind or restores a verified backup."""


class JobError(ApplianceError):
    """A training job cannot start or go on as asked."""


class JobNotFound(JobError):
    """No job with that id."""


class RunNotFound(JobError):
    """No training run with that id."""


class StudyNotFound(JobError):
    """No hyperparameter search with that id."""


class JobInterrupted(JobError):
    """A step of a job (a distillation) was asked to stop before it finished: nothing was kept."""


class PlanError(ApplianceError):
    """No training plan can be made: the base model cannot be read, or does not fit this machine."""


class ArtifactError(ApplianceError):
    """A stored model bundle or artifact is not in the form the appliance wrote."""


class OptimizeError(ApplianceError):
    """Exporting, quantising or distilling a model failed."""


class RegistryError(ApplianceError):
    """No such alias, or an alias move that cannot be made."""


class VersionNotFound(RegistryError):
    """No registered model, or no version of it, by that name or number."""


class AuthError(ApplianceError):
    """A request has no valid API key, or the key may not do this."""


class Unauthenticated(AuthError):
    """No API key, or one that is malformed, unknown, revoked or does not match."""


class Forbidden(AuthError):
    """A valid API key that is not allowed to call this model."""


class DaemonError(ApplianceError):
    """The daemon cannot start (its socket or port is taken), or no daemon answers."""


class DaemonUnreachable(DaemonError):
    """Nothing answers on the daemon's control socket: it is not running, or not yet, or no longer."""


class BurstError(ApplianceError):
    """A training job could not be sent to the Ray cluster, failed there, or its result did not check out."""


class ResidencyRefused(BurstError):
    """The dataset's residency keeps it on this box, so it may not be sent to a cluster."""


class ServeError(ApplianceError):
    """The inference server cannot answer this request."""


class ModelNotFound(ServeError):
    """No model of that name is being served."""


class BadRequest(ServeError):
    """The request body is malformed or out of bounds."""


class PayloadTooLarge(BadRequest):
    """The request body, or one of its texts, is over its limit."""


class RequestTimeout(BadRequest):
    """The request body did not arrive in full, or not in time."""


class RateLimited(ServeError):
    """The API key sent more texts than its rate allows; the client should retry after `retry_after_s`."""

    def __init__(self, message: str, *, retry_after_s: float, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.retry_after_s = retry_after_s


class Overloaded(ServeError):
    """Too much is queued already; the client should retry later."""
