"""Files vouched for by this store: a manifest of their SHA-256 and sizes, and an Ed25519 signature over it.

The compliance evidence pack and a model export archive are such sets. The manifest is signed with the store's
audit signing key (anchor.py), so they and the audit checkpoints share one public key. Checking a set needs no
store and no master key: the manifest names the key, and the signature and every file's hash are checked against
it. A key carried inside proves only that nothing was changed since someone holding that key signed; that it was
this appliance is shown by comparing the key with a checkpoint exported earlier or a key given separately
(`vouched`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.core.errors import ApplianceError
from appliance.store import Store, anchor

MANIFEST, SIGNATURE = "manifest.json", "manifest.sig"


def sign(store: Store, files: Mapping[str, bytes], **fields: Any) -> dict[str, bytes]:
    """The manifest of files (with fields beside the file list) and its signature, as the two files to add."""
    public_key = anchor.public_key(store)
    manifest = {**fields, "store_id": store.store_id, "public_key": public_key,
                "public_key_sha256": anchor.fingerprint(public_key),
                "files": {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
                          for name, data in sorted(files.items())}}
    manifest_bytes = json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n"
    return {MANIFEST: manifest_bytes, SIGNATURE: anchor.sign_bytes(store, manifest_bytes).encode() + b"\n"}


@dataclass(frozen=True)
class Checked:
    manifest: dict[str, Any]
    public_key: str
    trusted: str | None  # what vouched for the key, beyond the set itself

    @property
    def files(self) -> list[str]:
        return sorted(self.manifest["files"])


def check(files: Mapping[str, bytes], *, kind: str, noun: str, error: type[ApplianceError], again: str,
          public_key: str | None = None, checkpoint: Path | None = None) -> Checked:
    """Check the signature and every file of a set that holds its MANIFEST and SIGNATURE; `error` naming each thing
    that fails. kind is the manifest's format ("appliance-compliance-pack/1"), noun what a person calls the set
    ("pack"), again how to get a good copy."""
    if MANIFEST not in files or SIGNATURE not in files:
        raise error(f"no {MANIFEST} and {SIGNATURE} in it: this is not a signed {noun}", hint=again)
    manifest_bytes, signature = files[MANIFEST], files[SIGNATURE].decode(errors="replace").strip()
    try:
        manifest = json.loads(manifest_bytes)
        key, listed = manifest["public_key"], manifest["files"]
        if manifest.get("format") != kind or not isinstance(listed, dict):
            raise ValueError(f"its format is {manifest.get('format')!r}, not {kind!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise error(f"{MANIFEST} is not a {noun} manifest: {exc}", hint=f"{again}; it was changed, or it is not a"
                    f" {noun}") from exc
    if not anchor.is_signature(key, signature, manifest_bytes):
        raise error(f"{MANIFEST} does not match {SIGNATURE}: the manifest or its signature was changed",
                    hint=f"{again}; this copy cannot be trusted")
    trusted = vouched(key, manifest.get("store_id"), public_key, checkpoint, error)
    problems = []
    for name, entry in sorted(listed.items()):
        if name in (MANIFEST, SIGNATURE) or not isinstance(entry, dict):
            problems.append(f"{name}: not a file the manifest may list")
        elif name not in files:
            problems.append(f"{name}: listed in the signed manifest but missing")
        elif hashlib.sha256(files[name]).hexdigest() != entry.get("sha256"):
            problems.append(f"{name}: changed after the {noun} was signed (its SHA-256 differs from the manifest)")
    problems += [f"{name}: not covered by the signature (added after signing)" for name in sorted(files)
                 if name not in listed and name not in (MANIFEST, SIGNATURE)]
    if problems:
        raise error(f"the {noun} does not verify: " + "; ".join(problems),
                    hint=f"{again}; this copy was changed")
    return Checked(manifest, key, trusted)


def vouched(key: str, store_id: str | None, public_key: str | None, checkpoint: Path | None,
            error: type[ApplianceError]) -> str | None:
    """What, besides the set itself, vouches for its key: a key (or its SHA-256) given separately, or an audit
    checkpoint it signed."""
    vouchers = []
    if public_key is not None:
        given = public_key.strip().lower()
        if given not in (key, anchor.fingerprint(key)):
            raise error(f"it is signed by key {anchor.fingerprint(key)[:16]}..., not the key given",
                        hint="it was not signed by the appliance you trust")
        vouchers.append("the public key given")
    if checkpoint is not None:
        head = anchor.signed_checkpoint(checkpoint)
        if head is None:
            raise error(f"{checkpoint} is not a signed audit checkpoint",
                        hint="give a file written by 'appliance audit checkpoint'")
        if head.public_key != key or head.store_id != store_id:
            raise error(f"the checkpoint {checkpoint} was signed by another key or store",
                        hint="it was not signed by the appliance that exported the checkpoint")
        vouchers.append(f"the audit checkpoint of record {head.seq}")
    return " and ".join(vouchers) or None
