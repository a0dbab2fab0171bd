"""Schema migrations, numbered, recorded in the schema_version table.

Each migration runs with its version row in one transaction. A database that has a
version this code does not know was written by a newer appliance: it is refused,
since an older build might misread or damage it.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlite_utils

from appliance.core import clock
from appliance.core.errors import SchemaTooNew, StoreError
from appliance.store import db as store_db


def _v1_foundation(db: sqlite_utils.Database) -> None:
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value BLOB NOT NULL)")
    db.execute(
        """CREATE TABLE blobs (
            id TEXT PRIMARY KEY,             -- SHA-256 of the plaintext, hex
            storage_id BLOB NOT NULL UNIQUE, -- random; bound into every chunk's AAD
            size INTEGER NOT NULL,
            chunk_count INTEGER NOT NULL,
            wrapped_key BLOB NOT NULL,       -- data key under the master key
            created_at TEXT NOT NULL
        )"""
    )
    # A rowid table on purpose: WITHOUT ROWID would keep each 1 MiB row inside the key's
    # b-tree, so every seek would read whole chunks just to compare keys.
    db.execute(
        """CREATE TABLE blob_chunks (
            storage_id BLOB NOT NULL
                REFERENCES blobs(storage_id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
            idx INTEGER NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (storage_id, idx)
        )"""
    )
    db.execute(
        """CREATE TABLE audit (
            seq INTEGER PRIMARY KEY,
            ts TEXT NOT NULL,
            actor TEXT NOT NULL,
            action TEXT NOT NULL,
            object TEXT NOT NULL,
            outcome TEXT NOT NULL,
            details TEXT NOT NULL,
            prev_hash TEXT NOT NULL,
            hash TEXT NOT NULL,
            mac TEXT NOT NULL
        )"""
    )
    db.execute("CREATE INDEX audit_action ON audit(action)")
    db.execute("CREATE INDEX audit_actor ON audit(actor)")
    for verb in ("UPDATE", "DELETE"):
        db.execute(
            f"""CREATE TRIGGER audit_no_{verb.lower()} BEFORE {verb} ON audit
                BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END"""
        )


def _v2_datasets_and_runs(db: sqlite_utils.Database) -> None:
    db.execute(
        """CREATE TABLE datasets (
            id TEXT PRIMARY KEY,             -- SHA-256 of the normalised content (= blob id)
            name TEXT NOT NULL,
            version INTEGER NOT NULL,
            task TEXT NOT NULL,              -- text-classification | image-classification
            blob_id TEXT NOT NULL REFERENCES blobs(id),
            source TEXT NOT NULL,            -- the file or folder it was imported from
            examples INTEGER NOT NULL,
            labels TEXT NOT NULL,            -- JSON list, sorted
            split TEXT NOT NULL,             -- JSON: seed, validation fraction, train/validation indices
            warnings TEXT NOT NULL,          -- JSON list of what was dropped and why
            residency TEXT NOT NULL DEFAULT 'local-only',
            created_at TEXT NOT NULL,
            UNIQUE (name, version)
        )"""
    )
    db.execute(
        """CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            dataset_id TEXT NOT NULL REFERENCES datasets(id),
            base_model TEXT NOT NULL,
            task TEXT NOT NULL,
            params TEXT NOT NULL,            -- JSON hyperparameters
            plan TEXT NOT NULL,              -- JSON hardware plan
            status TEXT NOT NULL,            -- running | finished | failed | interrupted
            model_blob TEXT REFERENCES blobs(id),
            metrics TEXT,                    -- JSON final validation metrics
            created_at TEXT NOT NULL,
            finished_at TEXT
        )"""
    )
    db.execute(
        """CREATE TABLE run_epochs (
            run_id TEXT NOT NULL REFERENCES runs(id),
            epoch INTEGER NOT NULL,
            step INTEGER NOT NULL,
            train_loss REAL NOT NULL,
            metrics TEXT NOT NULL,           -- JSON: loss, accuracy, macro_f1 on validation
            samples_per_s REAL NOT NULL,
            elapsed_s REAL NOT NULL,         -- training time since the run started, resumes included
            ts TEXT NOT NULL,
            PRIMARY KEY (run_id, epoch)
        )"""
    )
    db.execute(
        """CREATE TABLE checkpoints (
            run_id TEXT NOT NULL REFERENCES runs(id),
            step INTEGER NOT NULL,
            blob_id TEXT NOT NULL REFERENCES blobs(id),
            created_at TEXT NOT NULL,
            PRIMARY KEY (run_id, step)
        )"""
    )


def _v3_registry(db: sqlite_utils.Database) -> None:
    db.execute(
        """CREATE TABLE model_versions (
            model TEXT NOT NULL,
            version INTEGER NOT NULL,
            run_id TEXT NOT NULL REFERENCES runs(id),
            task TEXT NOT NULL,
            chosen TEXT NOT NULL,            -- the variant that serves: fp32 | int8 | student-int8 ...
            reason TEXT NOT NULL,            -- why that one (the accuracy guard's verdict)
            created_at TEXT NOT NULL,
            PRIMARY KEY (model, version)
        )"""
    )
    db.execute(
        """CREATE TABLE model_artifacts (
            model TEXT NOT NULL,
            version INTEGER NOT NULL,
            variant TEXT NOT NULL,
            format TEXT NOT NULL,            -- openvino-ir | onnx | torch-bundle
            blob_id TEXT NOT NULL REFERENCES blobs(id),
            bytes INTEGER NOT NULL,
            metrics TEXT NOT NULL,           -- JSON: accuracy, macro_f1, latency, throughput on this box
            PRIMARY KEY (model, version, variant),
            FOREIGN KEY (model, version) REFERENCES model_versions(model, version)
        )"""
    )
    for table in ("model_versions", "model_artifacts"):
        db.execute(
            f"""CREATE TRIGGER {table}_immutable BEFORE UPDATE ON {table}
                BEGIN SELECT RAISE(ABORT, 'model versions are immutable'); END"""
        )
    db.execute(
        """CREATE TABLE model_aliases (
            model TEXT NOT NULL,
            alias TEXT NOT NULL,             -- production | candidate
            version INTEGER NOT NULL,
            moved_at TEXT NOT NULL,
            PRIMARY KEY (model, alias),
            FOREIGN KEY (model, version) REFERENCES model_versions(model, version)
        )"""
    )
    db.execute(
        """CREATE TABLE model_alias_moves (
            seq INTEGER PRIMARY KEY,
            model TEXT NOT NULL,
            alias TEXT NOT NULL,
            version INTEGER NOT NULL,
            kind TEXT NOT NULL,              -- set | rollback: replayed as push | pop
            moved_at TEXT NOT NULL
        )"""
    )


def _v4_serving(db: sqlite_utils.Database) -> None:
    db.execute(
        """CREATE TABLE api_keys (
            id TEXT PRIMARY KEY,             -- public part of the key, shown in listings and logs
            name TEXT NOT NULL,              -- who or what holds it
            secret_hash BLOB NOT NULL,       -- HMAC-SHA256 of the secret part under a store secret
            models TEXT NOT NULL,            -- JSON list of model names it may call; ["*"] for all
            created_at TEXT NOT NULL,
            last_used_at TEXT,
            revoked_at TEXT
        )"""
    )
    db.execute(
        """CREATE TABLE model_canary (
            model TEXT PRIMARY KEY,
            percent REAL NOT NULL CHECK (percent >= 0 AND percent <= 100),  -- share sent to the candidate
            set_at TEXT NOT NULL
        )"""
    )


def _v5_daemon(db: sqlite_utils.Database) -> None:
    db.execute(
        """CREATE TABLE jobs (
            id TEXT PRIMARY KEY,             -- 12 hex digits
            kind TEXT NOT NULL,              -- train | optimize | pipeline
            params TEXT NOT NULL,            -- JSON, as submitted
            priority INTEGER NOT NULL DEFAULT 0,  -- higher runs first and may preempt lower
            status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'finished', 'failed', 'cancelled')),
            stage TEXT,                      -- the step it is on (pipeline: import, train, optimize, deploy)
            state TEXT NOT NULL DEFAULT '{}',  -- JSON: what each finished step made, so a resumed attempt skips it
            result TEXT,                     -- JSON, once finished
            error TEXT,                      -- why it failed
            attempts INTEGER NOT NULL DEFAULT 0,  -- claims so far: a restart after a crash adds one
            owner TEXT,                      -- the claim of the attempt now running; NULL when none runs
            pid INTEGER,
            heartbeat_at TEXT,
            cancel_requested INTEGER NOT NULL DEFAULT 0,
            submitted_by TEXT NOT NULL,
            submitted_at TEXT NOT NULL,
            started_at TEXT,
            finished_at TEXT
        )"""
    )
    db.execute("CREATE INDEX jobs_queue ON jobs(status, priority DESC, submitted_at)")
    db.execute(
        """CREATE TABLE events (
            seq INTEGER PRIMARY KEY,         -- what an events client resumes after
            ts TEXT NOT NULL,
            topic TEXT NOT NULL,             -- job | deploy | drift
            subject TEXT NOT NULL,           -- job id or model name
            kind TEXT NOT NULL,              -- e.g. stage, progress, log, finished
            data TEXT NOT NULL               -- JSON
        )"""
    )
    db.execute("CREATE INDEX events_subject ON events(subject, seq)")
    db.execute(
        """CREATE TABLE users (
            id TEXT PRIMARY KEY,             -- public part of the token, shown in listings and the audit log
            name TEXT NOT NULL,
            role TEXT NOT NULL CHECK (role IN ('admin', 'operator', 'viewer')),
            secret_hash BLOB NOT NULL,       -- HMAC-SHA256 of the token's secret part under a store secret
            created_at TEXT NOT NULL,
            last_used_at TEXT,
            revoked_at TEXT
        )"""
    )


def _v6_burst(db: sqlite_utils.Database) -> None:
    # Residency decides whether a dataset may leave the box (for a burst to a Ray cluster). The column is
    # from v2; only these two values may be in it, and a change of it is a policy decision (audited).
    _residency_triggers(db)
    # Where a run trained: NULL on this appliance, else the remote job (ray://host:port/submission id).
    db.execute("ALTER TABLE runs ADD COLUMN trained_on TEXT")


def _residency_triggers(db: sqlite_utils.Database) -> None:
    for verb, when in (("INSERT", "INSERT"), ("UPDATE", "UPDATE OF residency")):
        db.execute(
            f"""CREATE TRIGGER datasets_residency_{verb.lower()} BEFORE {when} ON datasets
                WHEN NEW.residency NOT IN ('local-only', 'burst-allowed')
                BEGIN SELECT RAISE(ABORT, 'residency must be local-only or burst-allowed'); END"""
        )


def _v7_tuning(db: sqlite_utils.Database) -> None:
    # A hyperparameter search and its trials; each trial that trained is an ordinary run (curve in run_epochs),
    # so the study is rebuilt from here after a restart and no search state lives outside the store.
    db.execute(
        """CREATE TABLE studies (
            id TEXT PRIMARY KEY,             -- the job's id when the daemon runs it
            dataset_id TEXT NOT NULL REFERENCES datasets(id),
            base_model TEXT NOT NULL,
            task TEXT NOT NULL,
            metric TEXT NOT NULL,            -- maximised, on the validation split
            sampler TEXT NOT NULL,           -- tpe | random
            space TEXT NOT NULL,             -- JSON: the search space as searched
            base_params TEXT NOT NULL,       -- JSON: what every trial starts from; trial 0 uses it as is
            device TEXT,
            budget_s REAL NOT NULL,
            spent_s REAL NOT NULL DEFAULT 0, -- wall-clock time used, over every session
            status TEXT NOT NULL,            -- running | interrupted | finished
            best_run_id TEXT REFERENCES runs(id),
            importances TEXT NOT NULL DEFAULT '{}',  -- JSON: each parameter's share, as of the last trial
            created_at TEXT NOT NULL,
            finished_at TEXT
        )"""
    )
    db.execute(
        """CREATE TABLE trials (
            study_id TEXT NOT NULL REFERENCES studies(id),
            number INTEGER NOT NULL,
            run_id TEXT REFERENCES runs(id), -- NULL when the plan refused the trial
            params TEXT NOT NULL,            -- JSON: the sampled values
            distributions TEXT NOT NULL,     -- JSON: Optuna's distribution of each sampled value
            state TEXT NOT NULL,             -- running | complete | pruned | refused
            value REAL,                      -- the best validation metric it reached
            system_attrs TEXT NOT NULL DEFAULT '{}',  -- JSON: the pruner's rung records
            note TEXT,                       -- why it was refused or cut short
            PRIMARY KEY (study_id, number)
        )"""
    )


def _v8_dataset_erasure(db: sqlite_utils.Database) -> None:
    # A data subject's erasure removes a version's content but keeps its row, so lineage still reads: the row is
    # marked erased, its blob is gone (blob_id NULL) and replaced_by names the version written without the rows.
    # SQLite cannot relax NOT NULL in place, so the table is rebuilt. runs and studies refer to it: with foreign
    # keys deferred, dropping it counts their rows as violations and inserting the rows back counts them off.
    table = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'datasets'").fetchone()[0]
    changes = {
        "blob_id TEXT NOT NULL REFERENCES blobs(id),": "blob_id TEXT REFERENCES blobs(id),  -- NULL once erased",
        "UNIQUE (name, version)": """erased_at TEXT,                  -- when a data subject request removed its content
            replaced_by TEXT REFERENCES datasets(id),  -- the version written without the erased rows
            UNIQUE (name, version),
            CHECK ((blob_id IS NULL) = (erased_at IS NOT NULL))""",
    }
    for old, new in changes.items():
        if old not in table:
            raise StoreError(f"cannot migrate the datasets table: it has no {old!r}",
                             hint="the database was changed by hand; restore it from a backup")
        table = table.replace(old, new)
    db.execute("PRAGMA defer_foreign_keys = ON")  # ends with this transaction
    db.execute("CREATE TEMP TABLE datasets_before_v8 AS SELECT * FROM datasets")
    db.execute("DROP TABLE datasets")
    db.execute(table)
    db.execute("INSERT INTO datasets SELECT *, NULL, NULL FROM temp.datasets_before_v8")
    db.execute("DROP TABLE temp.datasets_before_v8")
    _residency_triggers(db)


def _v9_feedback(db: sqlite_utils.Database) -> None:
    # What the server answered, kept so a true label sent later can be attached to it. The text is customer
    # data: sealed per row (AES-256-GCM under a key derived from the store secret, the row's id as AAD).
    db.execute(
        """CREATE TABLE predictions (
            id TEXT PRIMARY KEY,             -- given to the caller with the answer
            model TEXT NOT NULL,
            version INTEGER NOT NULL,
            label TEXT NOT NULL,             -- what the model said
            confidence REAL NOT NULL,
            text_sealed BLOB NOT NULL,       -- nonce + ciphertext of the input text
            created_at TEXT NOT NULL
        )"""
    )
    db.execute("CREATE INDEX predictions_by_model ON predictions(model, created_at)")
    db.execute(
        """CREATE TABLE feedback (
            prediction_id TEXT PRIMARY KEY REFERENCES predictions(id) ON DELETE CASCADE,
            label TEXT NOT NULL,             -- the true label, as someone who knows said
            correct INTEGER NOT NULL,        -- whether the prediction had it right
            source TEXT NOT NULL,            -- api | the CSV file it was imported from
            actor TEXT NOT NULL,
            created_at TEXT NOT NULL,
            dataset_id TEXT REFERENCES datasets(id)  -- the dataset version it went into, once a retrain used it
        )"""
    )
    # A dataset version made from another one plus feedback names the version it extends.
    db.execute("ALTER TABLE datasets ADD COLUMN parent TEXT REFERENCES datasets(id)")


def _v10_usage_accounting(db: sqlite_utils.Database) -> None:
    """What each user and model used, by day: job CPU and GPU time, inference requests and their compute time."""
    db.execute(
        """CREATE TABLE usage (
            day TEXT NOT NULL,               -- UTC date, YYYY-MM-DD
            actor TEXT NOT NULL,             -- a job's submitter (user:NAME), or key:NAME for an API key's requests
            model TEXT NOT NULL,             -- the model name; '-' for a job that made none
            cpu_s REAL NOT NULL DEFAULT 0,   -- CPU seconds of job processes (user + system)
            gpu_s REAL NOT NULL DEFAULT 0,   -- wall seconds x GPUs of jobs that ran on CUDA
            job_attempts INTEGER NOT NULL DEFAULT 0,
            requests INTEGER NOT NULL DEFAULT 0,     -- inference requests answered
            compute_s REAL NOT NULL DEFAULT 0,       -- their inference time, batching wait included
            PRIMARY KEY (day, actor, model)
        ) WITHOUT ROWID"""
    )


def _v11_alerts(db: sqlite_utils.Database) -> None:
    """What needs an operator's eye, kept until acknowledged (store/alerts.py)."""
    db.execute(
        """CREATE TABLE alerts (
            id INTEGER PRIMARY KEY,
            source TEXT NOT NULL,            -- drift | job | autopilot | audit
            subject TEXT NOT NULL,           -- the model, job or store it is about
            severity TEXT NOT NULL,          -- warning | error
            message TEXT NOT NULL,           -- the latest raise's sentence: what happened, what to do
            raised_at TEXT NOT NULL,
            last_at TEXT NOT NULL,
            count INTEGER NOT NULL DEFAULT 1,    -- raises while open
            acknowledged_at TEXT,
            acknowledged_by TEXT
        )"""
    )
    db.execute("CREATE UNIQUE INDEX alerts_open ON alerts(source, subject) WHERE acknowledged_at IS NULL")


def _v12_deletion(db: sqlite_utils.Database) -> None:
    """What people delete. A dataset version keeps its row without content (blob_id NULL, erased_at set), told
    apart from an erased one by who deleted it. A model version's rows go, and its number is kept here so it is
    never given again and asking for it says what happened."""
    db.execute("ALTER TABLE datasets ADD COLUMN deleted_by TEXT")  # who deleted it; NULL when erased or kept
    db.execute(
        """CREATE TABLE model_versions_deleted (
            model TEXT NOT NULL,
            version INTEGER NOT NULL,
            deleted_at TEXT NOT NULL,
            deleted_by TEXT NOT NULL,
            PRIMARY KEY (model, version)
        )"""
    )


def _v13_store_sizes(db: sqlite_utils.Database) -> None:
    """The bytes the store had in use, one sample a day, so its growth can be read (store/space.py)."""
    db.execute("CREATE TABLE store_sizes (day TEXT PRIMARY KEY, used_bytes INTEGER NOT NULL)")


def _v14_run_outcomes(db: sqlite_utils.Database) -> None:
    """How a run ended (its best epoch, why it stopped, how much of the validation set its figures are on), and
    per epoch the number of validation examples evaluated: a large set is sampled while training."""
    db.execute("ALTER TABLE runs ADD COLUMN outcome TEXT")  # JSON: train.runs.Outcome
    db.execute("ALTER TABLE run_epochs ADD COLUMN evaluated_on INTEGER")


def _v15_label_counts(db: sqlite_utils.Database) -> None:
    """A dataset version's examples per label (JSON), kept at import so showing them reads no content; NULL for the
    versions before, counted when first asked (datasets.label_counts)."""
    db.execute("ALTER TABLE datasets ADD COLUMN counts TEXT")


def _v16_labelling_keys(db: sqlite_utils.Database) -> None:
    """Whether an API key may send true labels (they go into retraining). A new key may not unless made to; the keys
    made before kept the right they had, so the apps that send labels go on working."""
    db.execute("ALTER TABLE api_keys ADD COLUMN may_label INTEGER NOT NULL DEFAULT 0")
    db.execute("UPDATE api_keys SET may_label = 1")


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [
    _v1_foundation,
    _v2_datasets_and_runs,
    _v3_registry,
    _v4_serving,
    _v5_daemon,
    _v6_burst,
    _v7_tuning,
    _v8_dataset_erasure,
    _v9_feedback,
    _v10_usage_accounting,
    _v11_alerts,
    _v12_deletion,
    _v13_store_sizes,
    _v14_run_outcomes,
    _v15_label_counts,
    _v16_labelling_keys,
]
LATEST = len(MIGRATIONS)


def current_version(db: sqlite_utils.Database) -> int:
    if "schema_version" not in db.table_names():
        return 0
    return db.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()[0]


def created_at(db: sqlite_utils.Database) -> str | None:
    """When the first migration ran: the store's birth."""
    if "schema_version" not in db.table_names():
        return None
    row = db.execute("SELECT applied_at FROM schema_version WHERE version = 1").fetchone()
    return row[0] if row else None


def migrate(db: sqlite_utils.Database) -> int:
    """Bring the schema to LATEST; refuse a database newer than this code."""
    if checked_version(db) == LATEST:
        return LATEST  # the common case takes no write lock
    with store_db.transaction(db):
        db.execute(
            "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
        )
        for number in range(checked_version(db) + 1, LATEST + 1):
            MIGRATIONS[number - 1](db)
            db.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                (number, clock.stamp()),
            )
    return LATEST


def checked_version(db: sqlite_utils.Database) -> int:
    """The schema version, or SchemaTooNew when a newer appliance wrote it."""
    version = current_version(db)
    if version > LATEST:
        raise SchemaTooNew(
            f"the database has schema version {version}, this appliance knows up to {LATEST}",
            hint="upgrade the appliance, or restore a backup made by this version",
        )
    return version
