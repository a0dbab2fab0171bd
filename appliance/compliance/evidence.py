"""The facts an auditor asks for, read from the store as it is now: one JSON-ready dict.

Everything comes from the store's own tables and its audit log, nothing from memory
or configuration alone: datasets and where each was used, the served texts kept for
feedback, model lineage, every transfer
off the box (the burst's `burst.send` records), the key's history and the key in force,
users and API keys, erasures, the audit chain's verification with a freshly signed head,
and the encryption settings with the modes of the files that hold them.
"""

from __future__ import annotations

import json
import stat
from collections import defaultdict
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

from appliance import registry
from appliance.access import auth, users
from appliance.core import clock
from appliance.data import datasets
from appliance.operations import privacy
from appliance.registry import feedback
from appliance.store import Store, anchor, audit, blobs, keys, migrations
from appliance.train import runs, studies

FORMAT = "appliance-compliance-report/1"


def collect(store: Store) -> dict[str, Any]:
    """Every section of the report, in the order the report shows them."""
    return {
        "format": FORMAT,
        "generated_at": clock.stamp(),
        "appliance_version": metadata.version("appliance"),
        "store": _store(store),
        "datasets": _datasets(store),
        "served_texts": _served_texts(store),
        "lineage": _lineage(store),
        "transfers": _transfers(store),
        "refused_transfers": [_record(row) for row in audit.rows(store, action="burst.refused")],
        "keys": _keys(store),
        "access": _access(store),
        "erasures": [_record(row) for row in audit.rows(store, action=privacy.ACTION)],
        "audit": _audit(store),
        "encryption": _encryption(store),
    }


def _store(store: Store) -> dict[str, Any]:
    return {"id": store.store_id, "path": str(store.settings.db_path), "created_at": migrations.created_at(store.db),
            "schema_version": migrations.current_version(store.db)}


def _datasets(store: Store) -> list[dict[str, Any]]:
    used_by: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for run in runs.list_runs(store):
        used_by[run.dataset_id]["runs"].add(run.id)
    for model in registry.list_versions(store):
        used_by[runs.get(store, model.run_id).dataset_id]["models"].add(model.ref)
    for study in studies.list_studies(store):
        used_by[study.dataset_id]["studies"].add(study.id)
    for row in audit.rows(store, action="burst.send"):
        used_by[json.loads(row["details"]).get("dataset")]["bursts"].add(row["object"])
    return [
        {
            "ref": version.ref, "name": version.name, "version": version.version, "id": version.id,
            "task": version.task, "examples": version.examples, "labels": len(version.labels),
            "bytes": blobs.size(store, version.blob_id) if version.blob_id else None,
            "residency": version.residency, "source": version.source, "created_at": version.created_at,
            "erased_at": version.erased_at, "replaced_by": version.replaced_by, "parent": version.parent,
            "removal": version.removal,
            "from_predictions": len(feedback.used_by(store, version.id)),
            "used_by": {use: sorted(used_by[version.id][use]) for use in ("runs", "studies", "models", "bursts")},
        }
        for version in datasets.list_versions(store)
    ]


def _served_texts(store: Store) -> list[dict[str, Any]]:
    """Customer texts (an image model's: images) the server answered and keeps (sealed) for feedback, per model, and
    for how long."""
    return [asdict(kept) | {"keep_days": store.settings.serve.keep_predictions_days}
            for kept in feedback.kept(store)]


def _lineage(store: Store) -> dict[str, Any]:
    """dataset -> run (params, where it trained) -> model versions -> variants -> aliases and their moves."""
    refs = {version.id: version.ref for version in datasets.list_versions(store)}
    versions: dict[str, list[registry.ModelVersion]] = defaultdict(list)
    for model in registry.list_versions(store):
        versions[model.run_id].append(model)
    return {
        "runs": [
            {
                "id": run.id, "dataset": refs.get(run.dataset_id), "dataset_id": run.dataset_id,
                "base_model": run.base_model, "task": run.task, "params": run.params, "status": run.status,
                "trained_on": run.trained_on or "this appliance", "metrics": run.metrics,
                "created_at": run.created_at, "finished_at": run.finished_at,
                "model_versions": [
                    {"ref": model.ref, "created_at": model.created_at, "chosen": model.chosen,
                     "aliases": list(model.aliases),
                     "variants": [{"name": v.name, "format": v.format, "bytes": v.bytes, "metrics": v.metrics}
                                  for v in model.variants.values()]}
                    for model in versions[run.id]
                ],
            }
            for run in runs.list_runs(store)
        ],
        "alias_moves": [asdict(move) for move in registry.alias_moves(store)],
        "canaries": [{"model": model, "percent": deployed.canary_percent, "set_at": deployed.canary_since}
                     for model, deployed in registry.deployments(store).items() if deployed.canary_percent > 0],
    }


def _transfers(store: Store) -> list[dict[str, Any]]:
    """Each burst.send: what left (dataset, base model, sealed bytes), to which cluster, when, and how it ended."""
    steps = sorted((row for action in ("burst.submit", "burst.result", "burst.cancel")
                    for row in audit.rows(store, action=action)), key=lambda row: row["seq"])
    endings = {row["object"]: row for row in steps}  # the last step of each submission
    transfers = []
    for row in audit.rows(store, action="burst.send"):
        details = json.loads(row["details"])
        ending = endings.get(row["object"])
        transfers.append({
            "seq": row["seq"], "at": row["ts"], "actor": row["actor"], "submission": row["object"],
            "to": details.get("cluster"), "dataset": details.get("dataset_ref"), "dataset_id": details.get("dataset"),
            "dataset_bytes": details.get("dataset_bytes"), "base_model": details.get("base_model_path"),
            "base_model_sha256": details.get("base_model"), "base_model_bytes": details.get("base_model_bytes"),
            "sealed_bytes": details.get("sealed_bytes"), "job": details.get("job"),
            "last_step": None if ending is None else f"{ending['action']} {ending['outcome']}",
        })
    return transfers


def _keys(store: Store) -> dict[str, Any]:
    return {
        "in_force": {"source": store.master.source, "fingerprint": store.master.fingerprint},
        "history": [_record(row) for row in audit.rows(store, action="keys.*")],
    }


def _kdf(store: Store) -> dict[str, Any] | None:
    """The passphrase's scrypt cost in force (the salt is not secret, but not needed here); None for a key file."""
    params = store.master.kdf_params
    if store.master.source != "passphrase" or params is None:
        return None
    return {"algorithm": "scrypt", **{name: params[name] for name in ("n", "r", "p")}}


def _access(store: Store) -> dict[str, Any]:
    return {
        "roles": list(users.ROLES),
        "users": [asdict(user) for user in users.list_users(store)],
        "api_keys": [{**asdict(key), "models": list(key.models)} for key in auth.list_keys(store)],
        "refused_requests": audit.count(store, "api.refused"),
    }


def _audit(store: Store) -> dict[str, Any]:
    """The chain walked now, and its head as of that walk, signed with the key that signs the audit head."""
    verification = audit.verify(store)
    last = audit.newest(store)
    head = anchor.sign(store, *last) if last else None
    return {"verification": asdict(verification), "signed_head": head and asdict(head),
            "public_key": anchor.public_key(store), "public_key_sha256": anchor.fingerprint(anchor.public_key(store))}


def _encryption(store: Store) -> dict[str, Any]:
    settings = store.settings
    files = [(settings.state_dir, 0o700), (settings.db_path, 0o600), (settings.audit_head_path, 0o644),  # public
             (settings.wal_path, 0o600),
             (settings.db_path.with_name(settings.db_path.name + "-shm"), 0o600)]
    if store.master.source.startswith("key file"):
        files.append((settings.key_file, 0o600))
    return {
        "blobs": {"cipher": "AES-256-GCM", "chunk_bytes": blobs.CHUNK_SIZE,
                  "data_keys": "one random 256-bit key per blob, wrapped with AES-256-GCM under the master key",
                  "nonce": "the chunk index (unique: the key is fresh for every blob)",
                  "aad": "storage id, chunk index and last-chunk flag; the wrapped key binds content id, size, count",
                  "count": store.db.execute("SELECT COUNT(*) FROM blobs").fetchone()[0],
                  "bytes": store.db.execute("SELECT COALESCE(SUM(size), 0) FROM blobs").fetchone()[0]},
        "master_key": {"bits": keys.KEY_BYTES * 8, "wraps": "per-blob data keys and the store secret",
                       "source": store.master.source, "kdf": _kdf(store)},
        "audit": {"chain": "SHA-256 over each record and the previous hash",
                  "mac": "HMAC-SHA256, key derived from the store secret with HKDF-SHA256",
                  "head_signature": "Ed25519, key derived from the store secret with HKDF-SHA256"},
        "database": {"journal_mode": store.db.execute("PRAGMA journal_mode").fetchone()[0],
                     "page_size": store.db.execute("PRAGMA page_size").fetchone()[0],
                     "erasure": "secure_delete on (freed pages zeroed), then the WAL is truncated"},
        "files": [_mode(path, expected) for path, expected in files if path.exists()],
    }


def _mode(path: Path, expected: int) -> dict[str, Any]:
    mode = stat.S_IMODE(path.stat().st_mode)
    return {"path": str(path), "mode": f"{mode:04o}", "expected": f"{expected:04o}",
            "ok": not mode & ~expected & 0o777}


def _record(row: dict[str, Any]) -> dict[str, Any]:
    return {"seq": row["seq"], "at": row["ts"], "actor": row["actor"], "action": row["action"],
            "object": row["object"], "outcome": row["outcome"], "details": json.loads(row["details"])}
