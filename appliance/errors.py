"""Every error the appliance reports to a person, as one tree.

    ApplianceError
     ├── ConfigError              a setting is missing, misspelt or of the wrong type
     ├── StoreError               the database or its key cannot be used as asked
     │    ├── KeyMissing          no master key from any source
     │    ├── KeyMismatch         the master key does not open this store
     │    ├── TamperDetected      stored bytes or audit records were changed
     │    ├── SchemaTooNew        the database was written by a newer appliance
     │    └── BlobNotFound        no blob with that id
     ├── DatasetError             a dataset file is invalid, or no such dataset version
     ├── AuditWriteFailed         the audit record could not be written, so nothing happened
     ├── JobError                 a training job cannot start or go on
     ├── PlanError                no training plan: the model is unreadable or does not fit
     ├── OptimizeError            export or quantisation failed
     └── RegistryError            no such model, version or alias, or a move that cannot be made

Foreign errors (sqlite3, InvalidTag, OSError) are translated where they enter, with
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


class BlobNotFound(StoreError):
    """No blob with that id exists in the store."""


class DatasetError(ApplianceError):
    """A dataset file cannot be imported as it is, or the dataset version asked for does not exist."""


class AuditWriteFailed(ApplianceError):
    """The audit record could not be written, so the operation was not carried out."""


class JobError(ApplianceError):
    """A training job cannot start or go on as asked."""


class PlanError(ApplianceError):
    """No training plan can be made: the base model cannot be read, or does not fit this machine."""


class OptimizeError(ApplianceError):
    """Exporting or quantising a model failed."""


class RegistryError(ApplianceError):
    """No such model, version or alias, or an alias move that cannot be made."""
