"""Blobs: encrypted, chunked, content-addressed; any change to a stored chunk is caught."""

from __future__ import annotations

import hashlib
import os
import random

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from appliance.core.errors import BlobNotFound, TamperDetected
from appliance.store import Store, blobs, keys

CHUNK = blobs.CHUNK_SIZE


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17])
def test_put_then_get_returns_the_same_bytes(opened: Store, size: int) -> None:
    data = os.urandom(size)
    blob_id = blobs.put(opened, data)
    assert blob_id == hashlib.sha256(data).hexdigest()
    assert blobs.read(opened, blob_id) == data


def test_streams_and_files_are_stored_like_bytes(opened: Store, tmp_path) -> None:
    data = os.urandom(2 * CHUNK + 5)
    path = tmp_path / "payload"
    path.write_bytes(data)
    with path.open("rb") as f:
        from_file = blobs.put(opened, f)
    from_pieces = blobs.put(opened, (data[i : i + 1000] for i in range(0, len(data), 1000)))
    assert from_file == from_pieces == hashlib.sha256(data).hexdigest()


def test_identical_content_is_stored_once(opened: Store) -> None:
    data = os.urandom(CHUNK + 10)
    first, second = blobs.put(opened, data), blobs.put(opened, data)
    assert first == second
    assert opened.db.execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == 1
    assert opened.db.execute("SELECT COUNT(*) FROM blob_chunks").fetchone()[0] == 2


def test_no_plaintext_reaches_the_database_file(opened: Store) -> None:
    marker = b"CUSTOMER-RECORD-" * 4096
    blobs.put(opened, marker)
    opened.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw = opened.settings.db_path.read_bytes()
    assert b"CUSTOMER-RECORD-" not in raw


def test_unknown_blob_is_reported(opened: Store) -> None:
    with pytest.raises(BlobNotFound):
        blobs.read(opened, "0" * 64)


def _chunk_rows(opened: Store, blob_id: str) -> list[tuple[bytes, int, bytes]]:
    storage_id = opened.db.execute("SELECT storage_id FROM blobs WHERE id = ?", (blob_id,)).fetchone()[0]
    return opened.db.execute(
        "SELECT storage_id, idx, data FROM blob_chunks WHERE storage_id = ? ORDER BY idx", (storage_id,)
    ).fetchall()


def _set_chunk(opened: Store, storage_id: bytes, idx: int, data: bytes) -> None:
    opened.db.execute("UPDATE blob_chunks SET data = ? WHERE storage_id = ? AND idx = ?", (data, storage_id, idx))


def test_changing_any_byte_of_a_stored_chunk_is_detected(opened: Store) -> None:
    blob_id = blobs.put(opened, os.urandom(2 * CHUNK + 100))
    rows = _chunk_rows(opened, blob_id)
    rng = random.Random(7)
    for storage_id, idx, data in rows:
        positions = {0, len(data) - 1, len(data) - 16, *(rng.randrange(len(data)) for _ in range(5))}
        for position in positions:
            changed = bytearray(data)
            changed[position] ^= 0x01
            _set_chunk(opened, storage_id, idx, bytes(changed))
            with pytest.raises(TamperDetected, match=f"chunk {idx} of 3"):
                blobs.read(opened, blob_id)
            _set_chunk(opened, storage_id, idx, data)
    assert blobs.read(opened, blob_id)  # restored, readable again


def test_reordered_chunks_are_detected(opened: Store) -> None:
    blob_id = blobs.put(opened, os.urandom(3 * CHUNK))
    (sid, _, first), (_, _, second), _ = _chunk_rows(opened, blob_id)
    _set_chunk(opened, sid, 0, second)
    _set_chunk(opened, sid, 1, first)
    with pytest.raises(TamperDetected, match="chunk 0 of 3"):
        blobs.read(opened, blob_id)


def test_chunk_swapped_in_from_another_blob_is_detected(opened: Store) -> None:
    victim = blobs.put(opened, os.urandom(2 * CHUNK))
    other = blobs.put(opened, os.urandom(2 * CHUNK))
    sid = _chunk_rows(opened, victim)[0][0]
    _set_chunk(opened, sid, 0, _chunk_rows(opened, other)[0][2])
    with pytest.raises(TamperDetected, match="chunk 0 of 2"):
        blobs.read(opened, victim)


def test_dropped_chunk_is_detected(opened: Store) -> None:
    blob_id = blobs.put(opened, os.urandom(3 * CHUNK))
    sid = _chunk_rows(opened, blob_id)[0][0]
    opened.db.execute("DELETE FROM blob_chunks WHERE storage_id = ? AND idx = 1", (sid,))
    with pytest.raises(TamperDetected, match="chunk 1 of 3 is missing"):
        blobs.read(opened, blob_id)


def test_cut_off_tail_is_detected_even_with_the_count_edited(opened: Store) -> None:
    blob_id = blobs.put(opened, os.urandom(3 * CHUNK))
    sid = _chunk_rows(opened, blob_id)[0][0]
    opened.db.execute("DELETE FROM blob_chunks WHERE storage_id = ? AND idx = 2", (sid,))
    opened.db.execute("UPDATE blobs SET chunk_count = 2, size = ? WHERE id = ?", (2 * CHUNK, blob_id))
    with pytest.raises(TamperDetected, match="wrapped key"):
        blobs.read(opened, blob_id)


def test_a_changed_wrapped_key_is_detected(opened: Store) -> None:
    blob_id = blobs.put(opened, b"payload")
    wrapped = bytearray(opened.db.execute("SELECT wrapped_key FROM blobs WHERE id = ?", (blob_id,)).fetchone()[0])
    wrapped[-1] ^= 0x80
    opened.db.execute("UPDATE blobs SET wrapped_key = ? WHERE id = ?", (bytes(wrapped), blob_id))
    with pytest.raises(TamperDetected):
        blobs.read(opened, blob_id)


def test_a_failed_put_leaves_nothing(opened: Store) -> None:
    def source():
        yield os.urandom(CHUNK)
        yield os.urandom(CHUNK)
        raise OSError("disk went away")

    with pytest.raises(OSError):
        blobs.put(opened, source())
    assert opened.db.execute("SELECT COUNT(*) FROM blob_chunks").fetchone()[0] == 0
    assert opened.db.execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == 0


def test_a_stored_chunk_is_sealed_as_the_format_says(opened: Store) -> None:
    """Blobs already stored must open after any change of code: the format, spelled out without the code."""
    data = os.urandom(CHUNK + 10)
    blob_id = blobs.put(opened, data)
    storage_id, size, count, wrapped = opened.db.execute(
        "SELECT storage_id, size, chunk_count, wrapped_key FROM blobs WHERE id = ?", (blob_id,)).fetchone()
    aead = AESGCM(keys.unwrap(opened.master, wrapped, keys.key_aad(blob_id, storage_id, size, count)))
    for index, stored in opened.db.execute(
            "SELECT idx, data FROM blob_chunks WHERE storage_id = ? ORDER BY idx", (storage_id,)).fetchall():
        aad = b"appliance/chunk|" + storage_id + index.to_bytes(8, "big") + bytes([index == count - 1])
        assert aead.decrypt(index.to_bytes(12, "big"), stored, aad) == data[index * CHUNK:(index + 1) * CHUNK]


def test_a_part_of_a_blob_decrypts_only_its_chunks_and_each_is_still_checked(opened: Store) -> None:
    content = os.urandom(3 * CHUNK + 100)
    blob_id = blobs.put(opened, content)
    blob = blobs.Opened(opened, blob_id)
    rng = random.Random(3)
    for start, length in [(0, 0), (0, 1), (CHUNK - 5, 10), (2 * CHUNK, CHUNK + 100), (7, 3 * CHUNK),
                          *((s, rng.randrange(len(content) - s)) for s in rng.sample(range(len(content)), 20))]:
        assert blob.read(start, length) == content[start:start + length]
    with pytest.raises(ValueError, match="not within blob"):
        blob.read(len(content) - 1, 2)

    storage_id, _, second = _chunk_rows(opened, blob_id)[1]
    changed = bytearray(second)
    changed[100] ^= 0x01
    _set_chunk(opened, storage_id, 1, bytes(changed))
    fresh = blobs.Opened(opened, blob_id)
    assert fresh.read(10, 100) == content[10:110]  # chunk 0 alone: still readable
    with pytest.raises(TamperDetected, match="chunk 1 of 4"):
        fresh.read(CHUNK + 10, 100)
    _set_chunk(opened, storage_id, 1, _chunk_rows(opened, blob_id)[2][2])  # the next chunk in its place
    with pytest.raises(TamperDetected, match="chunk 1 of 4"):
        blobs.Opened(opened, blob_id).read(CHUNK, 1)
