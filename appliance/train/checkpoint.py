"""Training checkpoints in the encrypted store: everything needed to continue exactly.

A checkpoint holds the model, optimizer, scheduler and grad-scaler states, the best
weights so far, the RNG states and the data position; the batch order of an epoch is
derived from the seed and the epoch number, so the position is enough to replay the
rest. Only the newest checkpoint of a run is kept: the older one is deleted in the same
transaction that commits the new one, so there is always exactly one to resume from.

Training does not wait for a checkpoint to be stored: it copies its state to host memory
(snapshot) and a Writer serialises, encrypts and commits that copy in a background thread
while the next steps run.
"""

from __future__ import annotations

import io
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from appliance.core import clock
from appliance.store import Store, another_connection, audit, blobs


def snapshot(state: Any) -> Any:
    """A copy in host memory of a state (tensors on any device, in dicts, lists and tuples), which training may
    change at once: the checkpoint then holds this step's state, whenever it is written."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {key: snapshot(value) for key, value in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(snapshot(value) for value in state)
    return state


class Writer:
    """Stores a run's checkpoints from a background thread, one in flight at a time, over a store connection of its
    own. A write that failed raises from the next call; close() waits for the last one."""

    def __init__(self, store: Store, run_id: str) -> None:
        self._store, self._run_id = store, run_id
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-writer")
        self._own: Store | None = None
        self._pending: Future[bytes] | None = None

    def submit(self, step: int, state: dict[str, Any]) -> None:
        """Store a snapshot() as the run's checkpoint, once the write before it is done."""
        self.wait()
        self._pending = self._thread.submit(self._write, step, state)

    def wait(self) -> bytes | None:
        """The checkpoint in flight, once it is stored: its bytes, as latest() will give them; None if none was."""
        pending, self._pending = self._pending, None
        return None if pending is None else pending.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._thread.shutdown()
            if self._own is not None:
                self._own.close()

    def _write(self, step: int, state: dict[str, Any]) -> bytes:
        if self._own is None:
            self._own = another_connection(self._store)
        return save(self._own, self._run_id, step, state)


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
