"""Dynamic batching: texts from concurrent requests share one inference, off the event loop.

Requests add their texts to a queue on the event loop. A collector task closes a batch
when it holds `max_batch_size` texts, or when an infer request is free to take it and
either the model is idle or the batch's first text has waited `max_delay_ms`. So a lone
request starts at once; while an inference runs, the next batch gathers company; and
while every infer request is busy a batch could not start anyway, so it keeps filling:
under load batches grow on their own instead of queueing small. The batch goes to a
dispatcher thread, which sorts it by length, cuts it
where lengths jump (so short texts are not padded to a long one), tokenises each piece
and starts it on one of OpenVINO's asynchronous infer requests. Results come back on
OpenVINO's threads and are handed to the event loop, which never waits on inference.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import openvino as ov
import tokenizers

from appliance import optimize
from appliance.errors import Overloaded, ServeError

log = logging.getLogger(__name__)
SPLIT_RATIO = 2.0  # start a new piece when a text is this much longer than the piece's shortest...
SPLIT_FLOOR = 256  # ...and this long (characters, ~64 tokens): below it, one more inference costs more than padding


@dataclass
class _Request:
    """One caller's texts and the future its logits arrive on, filled row by row."""

    texts: list[str]
    future: asyncio.Future[np.ndarray]
    rows: list[np.ndarray | None] = field(default_factory=list)
    remaining: int = 0


@dataclass
class _Flight:
    """A closed batch between the collector and its last answer; it holds one of the inference slots."""

    items: list[tuple[_Request, int]]
    pieces: int = 0  # set by the dispatcher before it starts the first piece


@dataclass(frozen=True)
class Batch:
    """One finished inference, for the metrics and the drift monitor (called on an OpenVINO thread)."""

    encodings: list[tokenizers.Encoding]
    logits: np.ndarray
    padded_tokens: int
    seconds: float


class Batcher:
    """Batches texts for one compiled model; `await infer(texts)` returns their logits."""

    def __init__(
        self,
        compiled: ov.CompiledModel,
        tokenizer: tokenizers.Tokenizer,
        *,
        max_batch_size: int = 32,
        max_delay_ms: float = 5.0,
        max_queue: int = 1024,
        on_batch: Callable[[Batch], None] | None = None,
    ) -> None:
        self._names, _ = optimize.inference(compiled)
        self._tokenizer = tokenizer
        self._max_batch, self._max_delay = max_batch_size, max_delay_ms / 1000
        self._max_queue = max_queue
        self.on_batch = on_batch or (lambda batch: None)
        slots = max(2, compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        self._infer = ov.AsyncInferQueue(compiled, slots)
        self._infer.set_callback(self._done)
        self._slots = asyncio.Semaphore(slots)  # batches in flight; made here, used only on the event loop
        self._pending: list[tuple[_Request, int]] = []
        self._arrived = asyncio.Event()
        self._batches: queue.SimpleQueue[_Flight | None] = queue.SimpleQueue()
        self._in_flight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._collector: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._dispatch, name="batcher", daemon=True)

    @property
    def depth(self) -> int:
        """Texts accepted and not yet answered: waiting, being tokenised or on an infer request."""
        return len(self._pending) + self._in_flight

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._collector = self._loop.create_task(self._collect())
        self._thread.start()

    async def infer(self, texts: list[str]) -> np.ndarray:
        """The logits of texts, in order; Overloaded when the queue is full."""
        if self.depth + len(texts) > self._max_queue:
            raise Overloaded(f"the queue holds {self.depth} texts; {len(texts)} more would pass {self._max_queue}")
        request = _Request(texts, asyncio.get_running_loop().create_future(), [None] * len(texts), len(texts))
        self._pending.extend((request, index) for index in range(len(texts)))
        self._arrived.set()
        return await request.future

    async def close(self) -> None:
        """Answer everything accepted, then stop: what a swap or a shutdown waits for."""
        while self.depth:
            await asyncio.sleep(0.005)
        if self._collector:
            self._collector.cancel()
        self._batches.put(None)
        await asyncio.to_thread(self._thread.join)

    async def _collect(self) -> None:
        while True:
            await self._arrived.wait()
            if not self._pending:  # an empty request: no batch, so no inference slot taken
                self._arrived.clear()
                continue
            # With nothing in flight the model is idle: waiting for company would only add latency.
            deadline = time.monotonic() + (self._max_delay if self._in_flight else 0.0)
            while len(self._pending) < self._max_batch and time.monotonic() < deadline:
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), deadline - time.monotonic())
                except TimeoutError:
                    break
            await self._slots.acquire()  # texts that arrive meanwhile join this batch
            batch, self._pending = self._pending[: self._max_batch], self._pending[self._max_batch :]
            self._in_flight += len(batch)
            if not self._pending:
                self._arrived.clear()
            self._batches.put(_Flight(batch))

    def _dispatch(self) -> None:
        """The dispatcher thread: cut by length, tokenise, start; blocks while every infer request is busy."""
        while (flight := self._batches.get()) is not None:
            pieces = _pieces(flight.items)
            flight.pieces = len(pieces)
            for piece in pieces:
                try:
                    encodings = self._tokenizer.encode_batch([request.texts[index] for request, index in piece])
                    feeds = optimize.feeds(encodings, self._names)
                    self._infer.start_async(feeds, (flight, piece, encodings, feeds["input_ids"].size))
                except Exception as exc:  # noqa: BLE001  a failure answers this piece's callers, never kills the thread
                    self._answer(flight, piece, None, exc)

    def _done(self, request: ov.InferRequest, userdata: tuple) -> None:
        flight, piece, encodings, padded = userdata
        logits = request.get_output_tensor(0).data.copy()
        self._answer(flight, piece, logits, None)
        try:
            self.on_batch(Batch(encodings, logits, padded, request.latency / 1000))  # device time, not queueing
        except Exception:
            log.exception("recording a batch failed")

    def _answer(self, flight: _Flight, piece: list[tuple[_Request, int]], logits: np.ndarray | None,
                error: Exception | None) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._deliver, flight, piece, logits, error)

    def _deliver(self, flight: _Flight, piece: list[tuple[_Request, int]], logits: np.ndarray | None,
                 error: Exception | None) -> None:
        self._in_flight -= len(piece)
        flight.pieces -= 1
        if not flight.pieces:
            self._slots.release()
        for row, (request, index) in enumerate(piece):
            if request.future.done():
                continue
            if error is not None:
                request.future.set_exception(ServeError(f"inference failed: {error}"))
                continue
            request.rows[index] = logits[row]
            request.remaining -= 1
            if not request.remaining:
                request.future.set_result(np.stack(request.rows))


def _pieces(batch: list[tuple[_Request, int]]) -> list[list[tuple[_Request, int]]]:
    """The batch sorted by text length and cut where long texts are much longer than their piece's shortest."""
    ordered = sorted(batch, key=lambda item: len(item[0].texts[item[1]]))
    pieces: list[list[tuple[_Request, int]]] = []
    for item in ordered:
        length = len(item[0].texts[item[1]])
        shortest = len(pieces[-1][0][0].texts[pieces[-1][0][1]]) if pieces else 0
        if pieces and (length <= SPLIT_FLOOR or length <= SPLIT_RATIO * shortest):
            pieces[-1].append(item)
        else:
            pieces.append([item])
    return pieces
