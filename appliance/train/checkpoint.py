"""Training checkpoints in the encrypted store: everything needed to continue exactly.

A checkpoint holds the model, optimizer, scheduler and grad-scaler states, the RNG
states and the data position; the batch order of an epoch is derived from the seed
and the epoch number, so the position is enough to replay the rest. Only the newest
checkpoint of a run is kept: the older one is deleted in the same transaction that
commits the new one, so there is always exactly one to resume from.
"""

from __future__ import annotations

import io
from typing import Any

import torch

from appliance.core import clock
from appliance.store import Store, audit, blobs


def save(store: Store, run_id: str, step: int, state: dict[str, Any]) -> bytes:
    """Store the state as the run's checkpoint; its bytes, as latest() will give them back."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    with audit.operation(store, "checkpoint.save", run_id, step=step) as details:
        blob_id = blobs.put(store, buffer.getbuffer())
        older = [row[0] for row in store.db.execute("SELECT blob_id FROM checkpoints WHERE run_id = ?", (run_id,))]
        store.db.execute("DELETE FROM checkpoints WHERE run_id = ?", (run_id,))
        store.db.execute(
            "INSERT INTO checkpoints (run_id, step, blob_id, created_at) VALUES (?, ?, ?, ?)",
            (run_id, step, blob_id, clock.stamp()),
        )
        for old in set(older) - {blob_id}:
            blobs.delete(store, old)
        details.update(blob=blob_id, bytes=buffer.tell())
    return buffer.getvalue()


def latest(store: Store, run_id: str) -> bytes | None:
    """The newest checkpoint, decrypted into memory (state() reads it); None before the first one."""
    row = store.db.execute("SELECT blob_id FROM checkpoints WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else blobs.read(store, row[0])


def state(saved: bytes) -> dict[str, Any]:
    """A checkpoint's state: fresh tensors each call, so the copies of a data-parallel run's ranks are their own."""
    return torch.load(io.BytesIO(saved), weights_only=True)


def discard(store: Store, run_id: str) -> None:
    """Drop a finished run's checkpoint: the model it produced is what stays."""
    row = store.db.execute("SELECT blob_id FROM checkpoints WHERE run_id = ?", (run_id,)).fetchone()
    if row is None:
        return
    with audit.operation(store, "checkpoint.discard", run_id, blob=row[0]):  # its hash stays on the record
        store.db.execute("DELETE FROM checkpoints WHERE run_id = ?", (run_id,))
        blobs.delete(store, row[0])
