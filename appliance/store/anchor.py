"""The audit chain's head, signed and kept outside the database.

A hash chain inside the database cannot notice its own tail being cut off, so the
head (sequence number and hash) is also written, Ed25519-signed, to a file in the
state directory after every commit, and can be exported as a checkpoint for
safekeeping elsewhere. The signing key derives from the store secret, so the public
key stays the same across master-key rotations and old checkpoints stay valid.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from appliance.core import files
from appliance.core.errors import ApplianceError
from appliance.store import Store, keys


@dataclass(frozen=True)
class Head:
    """A signed claim that the chain of store_id reached record seq with this hash."""

    store_id: str
    seq: int
    hash: str
    signature: str
    public_key: str

    def payload(self) -> bytes:
        return f"appliance/audit-head|{self.store_id}|{self.seq}|{self.hash}".encode()

    def is_signed_by(self, public_key: str) -> bool:
        return is_signature(public_key, self.signature, self.payload())


def _signing_key(store: Store) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(keys.derive(store.secret, "appliance audit signing"))


def public_key(store: Store) -> str:
    raw = _signing_key(store).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return raw.hex()


def fingerprint(public_key: str) -> str:
    """The SHA-256 of the raw public key, to compare a key by eye or over the phone."""
    return hashlib.sha256(bytes.fromhex(public_key)).hexdigest()


def sign_bytes(store: Store, data: bytes) -> str:
    """The store's Ed25519 signature over data (hex), under the key that signs the audit head.

    Other signed things (a compliance pack's manifest, a JSON object) can never read as a
    head's payload, which starts with "appliance/audit-head|".
    """
    return _signing_key(store).sign(data).hex()


def is_signature(public_key: str, signature: str, data: bytes) -> bool:
    """Whether signature (hex) is public_key's (hex) over data; anything malformed is simply not."""
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key)).verify(bytes.fromhex(signature), data)
    except (InvalidSignature, ValueError):
        return False
    return True


def sign(store: Store, seq: int, chain_hash: str) -> Head:
    unsigned = Head(store.store_id, seq, chain_hash, "", public_key(store))
    signature = _signing_key(store).sign(unsigned.payload()).hex()
    return Head(store.store_id, seq, chain_hash, signature, unsigned.public_key)


def write_head(store: Store, head: Head, *, backwards: bool = False) -> None:
    """Replace the head file atomically, never moving it backwards unless a rewind is being recorded.

    Several processes write audit records; the lock and the comparison keep a slow
    writer from replacing a newer head with an older one.
    """
    path = store.settings.audit_head_path
    with _locked(path.with_name(path.name + ".lock")):
        current = read_head(path)
        if (not backwards and current is not None and current.store_id == head.store_id
                and current.seq >= head.seq):
            return
        keys.write_private(path, json.dumps(asdict(head), indent=2) + "\n")


def read_head(path: Path) -> Head | None:
    """The head in a head file or checkpoint; None if there is no file."""
    try:
        data = json.loads(files.read_file(path, "the audit head", files.MAX_SMALL_FILE))
        return Head(**{name: data[name] for name in Head.__dataclass_fields__})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, ApplianceError):
        # Unreadable (a pipe, a device, an outsized file too) counts as forged: verify reports it rather than crashing.
        return Head("?", -1, "?", "", "")


def signed_checkpoint(path: Path) -> Head | None:
    """The head a checkpoint file holds if the key it names signed it; None for a file that is no checkpoint."""
    head = read_head(path)
    return head if head is not None and head.is_signed_by(head.public_key) else None


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
