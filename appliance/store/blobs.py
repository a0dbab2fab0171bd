"""Encrypted, chunked, content-addressed blobs inside the database.

A blob's id is the SHA-256 of its plaintext, so identical content is stored once.
Each blob has its own random data key (wrapped by the master key) and is cut into
1 MiB chunks, each sealed with AES-256-GCM (seal.py, counted). The chunk's nonce is its
index, unique because the key is fresh for every put. Its AAD binds the blob's random
storage id, the chunk index and whether it is the last chunk (the STREAM construction:
the count is not known while streaming), and the wrapped data key's AAD binds the
content id, size and chunk count. So a chunk edited, reordered, moved between blobs,
dropped or cut off the tail fails to authenticate. Put and get stream in constant
memory; a put is one transaction, so a crash leaves no partial blob. Each hashes and
seals (or opens) one chunk in a worker thread while SQLite writes (or reads) the next:
hashlib, AESGCM and sqlite3 release the GIL, so the crypto and the database overlap.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterator

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from appliance.core import clock
from appliance.core.ahead import one_ahead
from appliance.core.errors import BlobNotFound, TamperDetected
from appliance.store import Store, keys, seal
from appliance.store.db import start_writeback, transaction

CHUNK_SIZE = 1 << 20
WRITEBACK_EVERY = 32  # chunks: how often a put has the kernel start writing its WAL pages out

class _AlreadyStored(Exception):
    """The content was already there: roll back the chunks just written."""


def put(store: Store, source: seal.Source) -> str:
    """Store the bytes of source encrypted and return their content id."""
    storage_id = os.urandom(16)
    data_key = keys.generate()
    sealer = AESGCM(data_key)
    digest = hashlib.sha256()
    size = count = 0

    aad = functools.partial(_chunk_aad, storage_id)

    def seal_chunk(chunk: tuple[int, tuple[bytes, bool]]) -> tuple[int, bytes]:
        index, (plain, last) = chunk
        digest.update(plain)
        return len(plain), seal.seal_counted(sealer, index, plain, last, aad)

    try:
        with transaction(store.db):
            # The worker seals the next chunk while this thread writes this one, and the disk
            # writes the WAL behind them both, so the commit's fsync finds little left to do.
            for index, (length, sealed) in enumerate(one_ahead(seal_chunk, enumerate(seal.pieces(source, CHUNK_SIZE)))):
                size += length
                count = index + 1
                store.db.execute(
                    "INSERT INTO blob_chunks (storage_id, idx, data) VALUES (?, ?, ?)",
                    (storage_id, index, sealed),
                )
                if count % WRITEBACK_EVERY == 0:
                    start_writeback(store.settings.wal_path)
            blob_id = digest.hexdigest()
            if exists(store, blob_id):
                raise _AlreadyStored
            wrapped = keys.wrap(store.master, data_key, keys.key_aad(blob_id, storage_id, size, count))
            store.db.execute(
                "INSERT INTO blobs (id, storage_id, size, chunk_count, wrapped_key, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (blob_id, storage_id, size, count, wrapped, clock.stamp()),
            )
    except _AlreadyStored:
        pass
    store.checkpointer.request()  # fold the new WAL frames in, off this thread
    return blob_id


def get(store: Store, blob_id: str) -> Iterator[bytes]:
    """Yield the plaintext of a blob chunk by chunk, checking every chunk."""
    blob = Opened(store, blob_id)
    digest = hashlib.sha256()

    def open_chunk(chunk: tuple[int, bytes | None]) -> bytes:
        plain = blob.open_chunk(*chunk)
        digest.update(plain)
        return plain

    # This thread reads the next chunk from SQLite while the worker opens this one.
    yield from one_ahead(open_chunk, map(blob.fetch, range(blob.count)))
    if digest.hexdigest() != blob_id:
        raise TamperDetected(f"blob {blob_id}: content does not match its id")


class Opened:
    """A blob opened to read, whole (get()) or a part at a time (read()).

    A part decrypts only the chunks that hold it, each checked on its own: its tag binds the blob, its place and
    whether it is the last, so no chunk from elsewhere passes. The whole content's hash is get()'s to check. The
    last chunk read is kept, so parts read in order decrypt each chunk once.
    """

    def __init__(self, store: Store, blob_id: str) -> None:
        row = store.db.execute(
            "SELECT storage_id, size, chunk_count, wrapped_key FROM blobs WHERE id = ?", (blob_id,)
        ).fetchone()
        if row is None:
            raise BlobNotFound(f"no blob {blob_id} in the store")
        self.store, self.blob_id = store, blob_id
        self.storage_id, self.size, self.count, wrapped = row
        self._opener = AESGCM(keys.unwrap(store.master, wrapped,
                                          keys.key_aad(blob_id, self.storage_id, self.size, self.count)))
        self._aad = functools.partial(_chunk_aad, self.storage_id)
        self._last: tuple[int, bytes] = (-1, b"")

    def read(self, start: int, length: int) -> bytes:
        """length bytes of the plaintext from start."""
        if start < 0 or length < 0 or start + length > self.size:
            raise ValueError(f"bytes {start}..{start + length} are not within blob {self.blob_id}'s {self.size}")
        parts, at, end = [], start, start + length
        while at < end:
            index, plain = self._last  # one read of it: another thread may replace it meanwhile
            if index != at // CHUNK_SIZE:
                index = at // CHUNK_SIZE
                plain = self.open_chunk(*self.fetch(index))
                self._last = (index, plain)
            piece = plain[at - index * CHUNK_SIZE:end - index * CHUNK_SIZE]
            parts.append(piece)
            at += len(piece)
        return b"".join(parts)

    def fetch(self, index: int) -> tuple[int, bytes | None]:
        found = self.store.db.execute(
            "SELECT data FROM blob_chunks WHERE storage_id = ? AND idx = ?", (self.storage_id, index)
        ).fetchone()
        return index, None if found is None else found[0]

    def open_chunk(self, index: int, sealed: bytes | None) -> bytes:
        return seal.open_counted(self._opener, index, self.count, sealed, self._aad, f"blob {self.blob_id}")


def read(store: Store, blob_id: str) -> bytes:
    """The whole plaintext of a small blob."""
    return b"".join(get(store, blob_id))


def delete(store: Store, blob_id: str) -> None:
    """Remove a blob that nothing refers to any more; a foreign key refuses one still in use."""
    with transaction(store.db):
        store.db.execute("DELETE FROM blobs WHERE id = ?", (blob_id,))


def release(store: Store, blob_id: str) -> bool:
    """Remove a blob once no row refers to it; True if it went.

    Identical content is stored once, so one blob may back several rows (a dataset under two names, a run's
    model and the variants registered from it): whoever lets go of one asks here, and the last one removes it.
    The referring columns are read from the schema's foreign keys, so a new table that refers to blobs counts.
    """
    for table, column in _references(store):
        if store.db.execute(f"SELECT 1 FROM {table} WHERE {column} = ? LIMIT 1", (blob_id,)).fetchone():
            return False
    delete(store, blob_id)
    return True


def _references(store: Store) -> list[tuple[str, str]]:
    return store.db.execute(
        "SELECT m.name, f.\"from\" FROM sqlite_master AS m, pragma_foreign_key_list(m.name) AS f"
        " WHERE m.type = 'table' AND f.\"table\" = 'blobs' AND f.\"to\" = 'id'"
    ).fetchall()


def size(store: Store, blob_id: str) -> int:
    """The plaintext size of a blob, without decrypting it."""
    row = store.db.execute("SELECT size FROM blobs WHERE id = ?", (blob_id,)).fetchone()
    if row is None:
        raise BlobNotFound(f"no blob {blob_id} in the store")
    return row[0]


def exists(store: Store, blob_id: str) -> bool:
    return store.db.execute("SELECT 1 FROM blobs WHERE id = ?", (blob_id,)).fetchone() is not None


def _chunk_aad(storage_id: bytes, index: int, last: bool) -> bytes:
    return b"appliance/chunk|" + storage_id + index.to_bytes(8, "big") + (b"\x01" if last else b"\x00")
