"""The master key and envelope encryption.

The master key (256 bits) comes from, in order: the systemd credential
``$CREDENTIALS_DIRECTORY/master.key``, the key file, or a passphrase stretched with
scrypt. It never encrypts data itself: it wraps per-blob data keys and one random
store secret, from which the audit log's HMAC and signing keys are derived. So a
rotation re-wraps a few hundred bytes per blob and leaves payloads and audit MACs
untouched, and the old master key no longer opens anything.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlite_utils
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from appliance.core import files
from appliance.core.config import Settings
from appliance.core.errors import KeyMismatch, KeyMissing, StoreError, TamperDetected
from appliance.store.db import fsync, transaction

KEY_BYTES = 32
NONCE_BYTES = 12
CREDENTIAL_NAME = "master.key"
SCRYPT_PARAMS = {"n": 2**15, "r": 8, "p": 1}
MIN_PASSPHRASE = 12  # characters of a new master passphrase, or an export archive's; scrypt stretches either
_SECRET_AAD = b"appliance/store-secret"


@dataclass(frozen=True, repr=False)
class MasterKey:
    """Key material with where it came from; repr never shows the material."""

    material: bytes
    source: str
    kdf_params: dict[str, Any] | None = None  # salt and cost of a passphrase key, stored on first use

    def __repr__(self) -> str:
        return f"MasterKey(source={self.source!r})"

    @property
    def fingerprint(self) -> str:
        """A short public name for the key, to tell keys apart without revealing them."""
        return hashlib.sha256(b"appliance/fingerprint" + self.material).hexdigest()[:16]


def generate() -> bytes:
    return AESGCM.generate_key(bit_length=256)


# -- wrapping ----------------------------------------------------------------------


def wrap(master: MasterKey, key: bytes, aad: bytes) -> bytes:
    """Encrypt a data key under the master key; aad binds it to its owner."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(master.material).encrypt(nonce, key, aad)


def unwrap(master: MasterKey, wrapped: bytes, aad: bytes) -> bytes:
    """Decrypt a wrapped data key; a bad tag means the row was changed."""
    try:
        return AESGCM(master.material).decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], aad)
    except InvalidTag as exc:
        raise TamperDetected("a wrapped key does not authenticate: the store was changed") from exc


def derive(secret: bytes, purpose: str) -> bytes:
    """A key for one purpose (audit MAC, audit signing) from the store secret."""
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=purpose.encode()).derive(
        secret
    )


# -- finding the master key --------------------------------------------------------


def find(settings: Settings, db: sqlite_utils.Database, passphrase: str | None = None) -> MasterKey:
    """The master key from the first source that has one."""
    if (stored := stored_key(settings)) is not None:
        return stored
    if passphrase is not None:
        return from_passphrase(db, passphrase)
    raise missing(settings, made=is_initialised(db), passphrase_store=_stretched(db))


def stored_key(settings: Settings) -> MasterKey | None:
    """The master key from the systemd credential, else from the key file; None when neither is there."""
    credentials = os.environ.get("CREDENTIALS_DIRECTORY")
    if credentials and (Path(credentials) / CREDENTIAL_NAME).is_file():
        path = Path(credentials) / CREDENTIAL_NAME
        return MasterKey(_read_key(path), f"systemd credential {path}")
    if settings.key_file.exists():
        return read_key_file(settings.key_file)
    return None


def missing(settings: Settings, made: bool, passphrase_store: bool = False) -> KeyMissing:
    """No key from any source; for a store whose key was made (`made`), the way back is that key, never a new one:
    for a passphrase store (`passphrase_store`), its passphrase."""
    if passphrase_store:
        hint = "this store is opened by a passphrase: set APPLIANCE_PASSPHRASE, or run the command at a terminal"
    elif made:
        hint = (f"this store's key was made before: put its key file back at {settings.key_file} from where it was"
                " backed up (or set keys.file to where it is)")
    else:
        hint = ("run 'appliance keys init' to create one, or set APPLIANCE_PASSPHRASE for a passphrase store; check"
                " APPLIANCE_STATE_DIR if a store should be there already")
    return KeyMissing(f"no master key: no systemd credential, no key file at {settings.key_file}, no passphrase",
                      hint=hint)


def read_key_file(path: Path) -> MasterKey:
    """Read a key file, refusing one that others can read."""
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise StoreError(
            f"key file {path} is readable by group or others (mode {stat.S_IMODE(mode):04o})",
            hint=f"run 'chmod 600 {path}' and check who may have copied it",
        )
    return MasterKey(_read_key(path), f"key file {path}")


def _read_key(path: Path) -> bytes:
    fix = ("a key file holds one line: 32 random bytes in base64, as 'appliance keys init' writes it (a raw 32-byte"
           f" file converts with: base64 -w0 < RAW > {path.name}); give the right file with keys.file")
    try:
        text = files.read_file(path, "the master key file", files.MAX_SMALL_FILE, over=fix, error=StoreError).strip()
    except OSError as exc:
        raise StoreError(f"cannot read the master key file {path}: {exc.strerror}") from exc
    try:
        material = base64.b64decode(text, validate=True)
    except ValueError:
        raise StoreError(f"the master key file {path} is not base64 text", hint=fix) from None
    if len(material) != KEY_BYTES:
        raise StoreError(f"the master key file {path} holds {len(material)} bytes, not a 256-bit key (32 bytes)",
                         hint=fix)
    return material


def write_key_file(path: Path, material: bytes) -> None:
    """Create a key file with mode 0600, durably; never overwrite one."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise StoreError(
            f"a key file already exists at {path}", hint="it is kept; remove it only if you mean to"
        ) from exc
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64encode(material) + b"\n")
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(path.parent)


def _stretched(db: sqlite_utils.Database) -> bool:
    """Whether the store's master key is stretched from a passphrase (its salt is kept)."""
    return "meta" in db.table_names() and _kdf_params(db) is not None


def _kdf_params(db: sqlite_utils.Database) -> dict[str, Any] | None:
    row = db.execute("SELECT value FROM meta WHERE key = 'kdf'").fetchone()
    return json.loads(row[0]) if row else None


def from_passphrase(db: sqlite_utils.Database, passphrase: str) -> MasterKey:
    """Stretch a passphrase with the store's scrypt salt (a new salt on a new store, whose passphrase must be long
    enough; an older store's opens whatever its length). A store whose key is no passphrase's is said to be one."""
    if (params := _kdf_params(db)) is not None:
        return stretch(passphrase, params)
    if is_initialised(db):
        stored = stored_fingerprint(db)
        raise KeyMismatch("this store is opened by a key file or a systemd credential, not by a passphrase",
                          hint=f"give the key it was made with{f' (fingerprint {stored})' if stored else ''} and"
                               " unset APPLIANCE_PASSPHRASE; nothing was changed")
    return new_passphrase_key(passphrase)


def new_passphrase_key(passphrase: str) -> MasterKey:
    """A new master key from a passphrase, under a new salt."""
    check_new_passphrase(passphrase)
    return stretch(passphrase, new_kdf_params())


def check_new_passphrase(passphrase: str) -> None:
    """StoreError for a new master passphrase under MIN_PASSPHRASE characters."""
    if len(passphrase) < MIN_PASSPHRASE:
        raise StoreError(f"the new master passphrase is shorter than {MIN_PASSPHRASE} characters",
                         hint="choose a longer one (APPLIANCE_PASSPHRASE, or at the prompt); nothing was changed")


def new_kdf_params() -> dict[str, Any]:
    return {**SCRYPT_PARAMS, "salt": base64.b64encode(os.urandom(16)).decode()}


def stretch(passphrase: str, params: dict[str, Any]) -> MasterKey:
    kdf = Scrypt(salt=base64.b64decode(params["salt"]), length=KEY_BYTES, n=params["n"], r=params["r"], p=params["p"])
    return MasterKey(kdf.derive(passphrase.encode()), "passphrase", params)


# -- the store secret --------------------------------------------------------------


def unlock(db: sqlite_utils.Database, settings: Settings, passphrase: str | None = None) -> tuple[MasterKey, bytes]:
    """The master key and the store secret it opens; creates the secret on a new store.

    A rotation that crashed after committing but before renaming its new key file
    into place is finished here: the pending file is the one that opens the store.
    """
    master = find(settings, db, passphrase)
    try:
        return master, open_secret(db, master)
    except KeyMismatch:
        pending = pending_key_file(settings.key_file)
        if master.source != f"key file {settings.key_file}" or not pending.exists():
            raise
        candidate = read_key_file(pending)
        secret = open_secret(db, candidate)
        os.replace(pending, settings.key_file)
        fsync_dir(settings.key_file.parent)
        return MasterKey(candidate.material, master.source), secret


def in_memory(db: sqlite_utils.Database) -> tuple[MasterKey, bytes]:
    """A fresh master key that lives in this process only, and a new store's secret under it (a scratch store)."""
    master = MasterKey(generate(), "this process's memory")
    return master, _create_secret(db, master)


def is_initialised(db: sqlite_utils.Database) -> bool:
    return db.execute("SELECT 1 FROM meta WHERE key = 'store_secret'").fetchone() is not None


def open_secret(db: sqlite_utils.Database, master: MasterKey) -> bytes:
    row = db.execute("SELECT value FROM meta WHERE key = 'store_secret'").fetchone()
    if row is None:
        return _create_secret(db, master)
    try:
        return AESGCM(master.material).decrypt(row[0][:NONCE_BYTES], row[0][NONCE_BYTES:], _SECRET_AAD)
    except InvalidTag as exc:
        if master.source == "passphrase":
            raise KeyMismatch("the passphrase does not open this store",
                              hint="type it as it was set (APPLIANCE_PASSPHRASE, or at the prompt); nothing was"
                                   " changed") from exc
        stored = stored_fingerprint(db)
        raise KeyMismatch(
            f"master key does not match this store (key from {master.source})",
            hint=f"use the key this store was created with{f' (fingerprint {stored})' if stored else ''}; nothing"
                 " was changed",
        ) from exc


def _create_secret(db: sqlite_utils.Database, master: MasterKey) -> bytes:
    secret = os.urandom(KEY_BYTES)
    with transaction(db):
        db.execute("INSERT INTO meta (key, value) VALUES ('store_id', ?)", (os.urandom(8).hex(),))
        db.execute("INSERT INTO meta (key, value) VALUES ('store_secret', ?)", (wrap(master, secret, _SECRET_AAD),))
        note_key(db, master)
    return secret


def note_key(db: sqlite_utils.Database, master: MasterKey) -> None:
    """Keep in meta what names the key that wraps the store: its fingerprint, so that a backup says which key it
    needs, and its scrypt salt where it is stretched from a passphrase (none otherwise, so that no passphrase is
    stretched for a store whose key is a file's). Writes only what changed."""
    if stored_fingerprint(db) == master.fingerprint and _kdf_params(db) == master.kdf_params:
        return
    with transaction(db):
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('key_fingerprint', ?)", (master.fingerprint,))
        if master.kdf_params is None:
            db.execute("DELETE FROM meta WHERE key = 'kdf'")
        else:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('kdf', ?)", (json.dumps(master.kdf_params),))


def stored_id(db: sqlite_utils.Database) -> str | None:
    """The store's id, made with its secret (None before)."""
    row = db.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()
    return row[0] if row else None


def stored_fingerprint(db: sqlite_utils.Database) -> str | None:
    """The fingerprint of the master key that wrapped this store (None if written before it was kept)."""
    row = db.execute("SELECT value FROM meta WHERE key = 'key_fingerprint'").fetchone()
    return row[0] if row else None


def rewrap_all(db: sqlite_utils.Database, old: MasterKey, new: MasterKey) -> int:
    """Re-wrap the store secret and every data key under new, and note new as the store's key; caller holds the
    transaction."""
    count = 0
    for storage_id, blob_aad, wrapped in list(_wrapped_keys(db)):
        db.execute(
            "UPDATE blobs SET wrapped_key = ? WHERE storage_id = ?",
            (wrap(new, unwrap(old, wrapped, blob_aad), blob_aad), storage_id),
        )
        count += 1
    secret = open_secret(db, old)
    db.execute("UPDATE meta SET value = ? WHERE key = 'store_secret'", (wrap(new, secret, _SECRET_AAD),))
    note_key(db, new)
    return count


def key_aad(blob_id: str, storage_id: bytes, size: int, chunk_count: int) -> bytes:
    """What a blob's wrapped data key is bound to: its content id, storage id and shape."""
    return b"appliance/blob-key|%s|%s|%d|%d" % (blob_id.encode(), storage_id.hex().encode(), size, chunk_count)


def _wrapped_keys(db: sqlite_utils.Database) -> Iterator[tuple[bytes, bytes, bytes]]:
    for row in db.execute("SELECT id, storage_id, size, chunk_count, wrapped_key FROM blobs"):
        blob_id, storage_id, size, chunk_count, wrapped = row
        yield storage_id, key_aad(blob_id, storage_id, size, chunk_count), wrapped


def pending_key_file(path: Path) -> Path:
    return path.with_name(path.name + ".new")


def write_private(path: Path, text: str) -> None:
    """Replace path atomically with a file no other user could ever read, not even for a moment (tokens)."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


fsync_dir = fsync  # a directory is made durable the same way as a file
