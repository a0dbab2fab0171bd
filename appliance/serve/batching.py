"""Dynamic batching: examples from concurrent requests share one inference, off the event loop.

An example is a text, or an image (encoded, or the model's input prepared by its caller);
what follows says texts, and images go the same way with three differences: a batch of
images is never cut into pieces (they are all the model's size), never inferred on the
event loop (decoding one takes longer than the hand-offs it would save), and nothing of an
image is truncated.

Requests add their texts to a queue on the event loop. A collector task closes a batch
when it holds `max_batch_size` texts, or when an infer request is free to take it and
either the model is idle or the batch's first text has waited `max_delay_ms`. So a lone
request starts at once; while an inference runs, the next batch gathers company; and
while every infer request is busy a batch could not start anyway, so it keeps filling:
under load batches grow on their own instead of queueing small. The batch is sorted by
length and cut where lengths jump (so short texts are not padded to a long one); a
dispatcher thread tokenises each piece and starts it on one of OpenVINO's asynchronous
infer requests. Results come back on OpenVINO's threads and are handed to the event
loop, which does not wait on inference, with one exception: a batch of at most
`INLINE_TEXTS` texts, all from requests that reached the server whole (`inline`: HTTP, or
a gRPC call alone),
is inferred on the event loop itself when the model is idle, as a hand-built server does
with every request. At one client the hand-offs to the dispatcher thread and back from
OpenVINO's cost a tenth of a request's time; under load, the requests that arrive while
the loop infers are read together when it returns and make the next batch. A lone such
request on an idle model waits one turn of the loop, so that requests read with it can
join it, and then, still alone, starts its inference itself instead of waking the
collector, which would answer it a turn later. A gRPC call reaches the batcher over
several turns of the loop, so blocking it would serialise calls in company: the gRPC
service asks for inline only for a call alone (`grpc_api.Service.model_infer`).

Two engines run the batches, both the same model. The latency engine, compiled as OpenVINO
compiles for latency (one stream, every core's thread on each inference), takes the
inline path and every batch while the load is light: a batch of a few texts is done
soonest when all the cores work on it. Under load those threads wait on each other at every
layer, more so when the event loop, busy with HTTP, takes a core from them. So when more
examples wait and run than one batch per stream (`busy_depth`), batches go to the throughput
engine (`inference.load_ir(throughput=True)`: a stream per core, each with one thread of
its own, never waiting on another), which holds two batches per stream, one running and
one queued, so a stream never idles while answers go out and texts come in. On the
README's 2-core box `appliance serve` answered 1.1-1.5x as many requests at 64 clients
(about 1.3x in most interleaved runs); at 8 clients (batches of a few texts, one stream
left idle) the throughput engine alone lost a fifth, hence the two.

One text never fails the others: a piece whose tokenisation or inference fails is tried
again text by text, so only the guilty request fails (400 when its text would not
tokenise, 503 when the model failed on it alone). And a text's CPU is bounded by what
the model can see: what the window would drop anyway is cut before tokenising
(`words.Words.cut`), so a long text costs no more than one the length of the model's
window. Each answer says which texts the window cut short (`Inferred.truncated`).
Each piece's probabilities are worked out once, where its inference ends (on OpenVINO's
thread, or inline): a softmax over a piece costs what one over a single row does, about
8 µs, which the event loop used to pay for every request. OpenVINO's threads hold the GIL
no longer than that: the batch is recorded (`on_batch`: metrics, drift) on the event loop
once its answers have gone out.

A burst of large batches leaves OpenVINO holding buffers sized for them (tens of MB per
infer request); once the model has been quiet for `RELEASE_AFTER_S`, the collector hands
them back (`release_memory`), and the C heap's freed pages go back to the system
(`_trim_heap`), so a server at rest holds what a server at rest needs. That includes the
throughput engine itself, which a server at rest does not use: its weights, laid out again
for its streams, are 20-50 MB of a MiniLM's (more where the CPU computes in FP32 rather
than BF16). It is let go with the buffers and compiled again, off the event loop, when the
load comes back (`_compile_throughput`: a fifth of a second for MiniLM), while the latency
engine takes the batches meanwhile.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import openvino as ov

from appliance import inference, pixels, words
from appliance.core.config import ServeSettings
from appliance.core.errors import BadRequest, Overloaded, ServeError

log = logging.getLogger(__name__)
SPLIT_RATIO = 2.0  # start a new piece when a text is this much longer than the piece's shortest...
SPLIT_FLOOR = 256  # ...and this long (characters, ~64 tokens): below it, one more inference costs more than padding
INLINE_TEXTS = 4  # an idle model's batch of up to this many texts may be inferred on the event loop
ROWS_MULTIPLE = 8  # the throughput engine's batches are padded to a multiple of this many rows (see _padded)
RELEASE_AFTER_S = 5.0  # quiet this long, the model's intermediate buffers go back; the next batch makes them again


class Inferred(NamedTuple):
    """A request's answer: per example, the labels' probabilities and whether the model's window cut it short."""

    probabilities: np.ndarray
    truncated: list[bool]


@dataclass
class _Request:
    """One caller's examples and the future its answer arrives on, filled row by row."""

    examples: list[str] | list[bytes | np.ndarray]
    future: asyncio.Future[Inferred]
    inline: bool = False
    rows: list[np.ndarray | None] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    remaining: int = 0

    def answer(self) -> Inferred:
        """The rows gathered, as one array; a lone example's is a view of its piece's (np.stack would copy it)."""
        rows = self.rows[0][None] if len(self.rows) == 1 else np.stack(self.rows)
        return Inferred(rows, self.truncated)


Item = tuple[_Request, int]  # a request and the index of one of its examples


@dataclass
class _Engine:
    """A compiled model and its asynchronous infer requests, one of the two ways a batch reaches OpenVINO."""

    compiled: ov.CompiledModel
    queue: ov.AsyncInferQueue
    slots: int  # batches it may have in flight: those it runs at once and as many waiting behind them
    rows_multiple: int = 1  # its batches padded to a multiple of this many rows


@dataclass
class _Flight:
    """A closed batch between the collector and its last answer; it holds one of the inference slots."""

    pieces: int  # not answered yet; changed only on the event loop
    engine: _Engine


class _Rows(NamedTuple):
    """A piece's answer, row by row in the piece's order."""

    probabilities: np.ndarray
    truncated: list[bool]

    @classmethod
    def of(cls, logits: np.ndarray, inputs: words.Read | pixels.Seen) -> _Rows:
        return cls(inference.softmax(logits), _truncated(inputs))


@dataclass(frozen=True)
class _Failure:
    """Why a piece got no logits: its reading (the examples' doing: tokenising, decoding) or its inference (the
    model's)."""

    error: Exception
    input_fault: bool


@dataclass(frozen=True)
class Batch:
    """One finished inference, for the metrics and the drift monitor (on the event loop, after its answers)."""

    inputs: words.Read | pixels.Seen  # what the model was given: texts read, or images seen
    probabilities: np.ndarray  # what it answered
    seconds: float

    @property
    def size(self) -> int:
        return len(self.probabilities)


class Batcher:
    """Batches examples for one compiled model; `await infer(examples)` returns their answers (`Inferred`)."""

    def __init__(
        self,
        compiled: ov.CompiledModel,
        reader: inference.Reader,
        *,
        max_batch_size: int = ServeSettings.max_batch_size,  # the settings' defaults, so a test batches as a server
        max_delay_ms: float = ServeSettings.max_delay_ms,
        max_queue: int = ServeSettings.max_queue,
        on_batch: Callable[[Batch], None] | None = None,
        compile_batched: Callable[[], ov.CompiledModel | None] | None = None,
    ) -> None:
        self._names, _ = inference.bind(compiled)
        self._reader = reader
        self._images = isinstance(reader, pixels.Pictures)
        self._max_batch, self._max_delay = max_batch_size, max_delay_ms / 1000
        self._max_queue = max_queue
        self.on_batch = on_batch or (lambda batch: None)
        self._latency = self._engine(compiled, max(2, compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
        self._throughput: _Engine | None = None  # see the module's notes: for batches when more wait than one can run
        self._compile_batched = compile_batched  # None: no throughput engine (not asked for, or one stream anyway)
        self._compiling: asyncio.Task[ov.CompiledModel | None] | None = None
        self._busy_depth = 0  # from this many examples waiting and in flight, batches go to the throughput engine
        self._started: dict[int, tuple[_Flight, list[Item], words.Read | pixels.Seen, dict[str, np.ndarray]]] = {}
        self._starts = itertools.count()  # keys of _started: what an infer request carries to its callback
        self._inline = compiled.create_infer_request()
        self._batches = 0  # closed and not answered yet, on either engine; at most the engine chosen now has slots
        self._slot_freed = asyncio.Event()
        self._pending: list[Item] = []
        self._arrived = asyncio.Event()
        self._work: queue.SimpleQueue[tuple[_Flight, list[Item]] | None] = queue.SimpleQueue()
        self._in_flight = 0
        self._holding = False  # buffers an inference left behind, not yet released (see _collect)
        self._releasing = False  # the buffers are being released: nothing may start meanwhile
        self._last_start = 0.0  # time.monotonic() when the last batch started (or the throughput engine came)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._collector: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._dispatch, name="batcher", daemon=True)

    @classmethod
    def serving(cls, servable: inference.Servable, serve: ServeSettings) -> Batcher:
        """The batcher the server puts in front of a loaded version: its engines and the batching settings."""
        return cls(servable.compiled, servable.reader, max_batch_size=serve.max_batch_size,
                   max_delay_ms=serve.max_delay_ms, max_queue=serve.max_queue, compile_batched=servable.compile_batched)

    def _engine(self, compiled: ov.CompiledModel, slots: int, rows_multiple: int = 1) -> _Engine:
        infer = ov.AsyncInferQueue(compiled, slots)
        infer.set_callback(self._done)
        return _Engine(compiled, infer, slots, rows_multiple)

    @property
    def depth(self) -> int:
        """Examples accepted and not yet answered: waiting, being read or on an infer request."""
        return len(self._pending) + self._in_flight

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._collector = self._loop.create_task(self._collect())
        self._thread.start()
        self._compile_throughput()

    async def infer(self, examples: list[str] | list[bytes | np.ndarray], inline: bool = False) -> Inferred:
        """The probabilities of examples, in order, and which were truncated; Overloaded when the queue
        is full, BadRequest naming an example that could not be read, ServeError when the model failed on one.
        `inline`: the caller's request reached the server whole, so it may be inferred on the event loop when the
        model is idle."""
        if self.depth + len(examples) > self._max_queue:
            raise Overloaded(f"the queue holds {self.depth} examples; {len(examples)} more would pass "
                             f"{self._max_queue}")
        if not self._images:
            examples = [self._reader.cut(text) for text in examples]
        count = len(examples)
        request = _Request(examples, asyncio.get_running_loop().create_future(), inline and not self._images,
                           [None] * count, [False] * count, count)
        items = [(request, index) for index in range(count)]
        self._pending.extend(items)
        if request.inline and count <= INLINE_TEXTS and not self._in_flight:
            # The model is idle. One turn of the event loop lets the requests that arrived with this one join it;
            # if none did, this request is the batch, started here rather than by the collector a turn later.
            await asyncio.sleep(0)
            alone = len(self._pending) == count and self._pending[0][0] is request  # a request's items are together
            if alone and not self._in_flight and not self._releasing:
                self._pending = []
                self._start(items)  # every slot is free while nothing is in flight
                return await request.future
        self._arrived.set()
        return await request.future

    async def close(self) -> None:
        """Answer everything accepted, then stop: what a swap or a shutdown waits for."""
        while self.depth:
            await asyncio.sleep(0.005)
        if self._compiling is not None:
            await asyncio.wait([self._compiling])
        if self._collector:
            self._collector.cancel()
        self._work.put(None)
        await asyncio.to_thread(self._thread.join)

    async def _collect(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._arrived.wait(), self._until_release())
            except TimeoutError:
                if not self.depth and time.monotonic() - self._last_start >= RELEASE_AFTER_S:
                    self._releasing = True  # so that no request starts an inference while the buffers and engine go
                    try:
                        self._holding = not await asyncio.to_thread(self._release)
                    finally:
                        self._releasing = False
                continue
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
            while self._batches >= self._engine_now().slots:  # texts that arrive meanwhile join this batch
                self._slot_freed.clear()
                await self._slot_freed.wait()
            batch, self._pending = self._pending[: self._max_batch], self._pending[self._max_batch :]
            if not self._pending:
                self._arrived.clear()
            self._start(batch)

    def _until_release(self) -> float | None:
        """How long the collector waits for texts before it looks at giving the buffers back; None: it holds none."""
        if not self._holding:
            return None
        quiet_for = time.monotonic() - self._last_start
        return RELEASE_AFTER_S - quiet_for if quiet_for < RELEASE_AFTER_S else RELEASE_AFTER_S

    def _engine_now(self) -> _Engine:
        """The throughput engine while more examples wait or run than the latency engine's one stream takes well;
        the latency engine while the throughput one is being compiled again."""
        if self._busy_depth and self.depth >= self._busy_depth:
            if self._throughput is not None:
                return self._throughput
            self._compile_throughput()
        return self._latency

    def _compile_throughput(self) -> None:
        """Compile the throughput engine on a worker thread, unless that is under way or there is none to compile."""
        if self._compile_batched is None or self._compiling is not None or self._loop is None:
            return
        self._compiling = self._loop.create_task(asyncio.to_thread(self._compile_batched))
        self._compiling.add_done_callback(self._adopt)

    def _adopt(self, compiling: asyncio.Task[ov.CompiledModel | None]) -> None:
        self._compiling = None
        if compiling.cancelled():
            return
        error = compiling.exception()
        batched = None if error else compiling.result()
        if batched is None:  # one stream, or it failed: no second try
            if error:
                log.warning("the model was not compiled for throughput, so its latency engine takes every batch: %s",
                            error)
            self._compile_batched = None
            return
        streams = batched.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")
        self._throughput = self._engine(batched, inference.BATCHES_PER_STREAM * streams, ROWS_MULTIPLE)
        self._busy_depth = streams * self._max_batch
        self._hold()  # compiled at start and no crowd came: it goes again after a quiet spell

    def _hold(self) -> None:
        """From now, the model holds what a quiet spell gives back: buffers a batch sized, the throughput engine."""
        self._last_start = time.monotonic()
        if not self._holding:
            self._holding = True
            self._arrived.set()  # the collector, waiting with no timer, sets the one that gives them back

    def _start(self, batch: list[Item]) -> None:
        """Start a closed batch, which holds a slot of the engine chosen now: inferred here when it may be (see the
        module's notes), else piece by piece on the dispatcher thread."""
        idle = not self._in_flight
        self._in_flight += len(batch)
        engine = self._engine_now()  # the batch counted, as it was while it waited: the collector chose the same
        self._batches += 1
        self._hold()
        pieces = [batch] if self._images else _pieces(batch)
        flight = _Flight(len(pieces), engine)
        if idle and len(pieces) == 1 and len(batch) <= INLINE_TEXTS and all(r.inline for r, _ in batch):
            self._run_inline(flight, pieces[0])
            return
        for piece in pieces:
            self._work.put((flight, piece))

    def _release(self) -> bool:
        """Hand back the buffers the last batches sized and the throughput engine where it can be compiled again, once
        the last callback has returned; False while another user of a compiled model (a warm-up, an evaluation) has an
        inference running, to try again later. On a worker thread: the engine's last reference goes here, waiting
        for nothing, not on the event loop."""
        if self._throughput is not None:
            dropped, self._throughput = self._throughput, None
            dropped.queue.wait_all()
            del dropped
        released = True
        for engine in filter(None, (self._latency, self._throughput)):
            engine.queue.wait_all()
            try:
                engine.compiled.release_memory()
            except RuntimeError as exc:  # OpenVINO refuses while any infer request of the model is busy
                log.debug("the model's buffers stay for now: %s", exc)
                released = False
        _trim_heap()
        return released

    def _dispatch(self) -> None:
        """The dispatcher thread: read a piece and start it; blocks while every infer request is busy."""
        while self._dispatch_next():
            pass

    def _dispatch_next(self) -> bool:
        """Start the next piece; False to stop. Its own frame, so that between pieces the thread holds none."""
        if (work := self._work.get()) is None:
            return False
        flight, piece = work
        if (read := self._read(flight, piece)) is None:
            return True
        inputs, feeds = read
        feeds = _padded(feeds, flight.engine.rows_multiple)
        # The infer request carries a key, not the piece: OpenVINO keeps a request's userdata until its next start,
        # and a flight there would hold its engine, a cycle Python cannot see, so a dropped engine would never go.
        key = next(self._starts)
        self._started[key] = (flight, piece, inputs, feeds)  # the feeds, shared not copied, live until it is done
        try:
            flight.engine.queue.start_async(feeds, key, share_inputs=True)
        except Exception as exc:  # noqa: BLE001  a failure answers this piece's callers, never kills the thread
            del self._started[key]
            self._answer(flight, piece, None, _Failure(exc, input_fault=False))
        return True

    def _run_inline(self, flight: _Flight, piece: list[Item]) -> None:
        """Infer a small piece right here, on the event loop, while the model is idle (see the module's notes)."""
        if (read := self._read(flight, piece)) is None:
            return
        inputs, feeds = read
        try:
            self._inline.infer(feeds, share_inputs=True)
            logits = self._inline.get_output_tensor(0).data.copy()
        except Exception as exc:  # noqa: BLE001
            self._answer(flight, piece, None, _Failure(exc, input_fault=False))
            return
        rows = _Rows.of(logits, inputs)
        self._deliver(flight, piece, rows, None, Batch(inputs, rows.probabilities, self._inline.latency / 1000))

    def _read(self, flight: _Flight, piece: list[Item]) -> tuple[words.Read | pixels.Seen,
                                                                  dict[str, np.ndarray]] | None:
        """A piece as the model reads it (texts tokenised, images decoded) and its feeds, or None when that fails
        (its callers are answered)."""
        examples = [request.examples[index] for request, index in piece]
        try:
            inputs = self._reader.see(examples)
        except Exception as exc:  # noqa: BLE001
            self._answer(flight, piece, None, _Failure(exc, input_fault=True))
            return None
        try:
            return inputs, inputs.feeds if self._images else {name: inputs.feeds[name] for name in self._names}
        except Exception as exc:  # noqa: BLE001
            self._answer(flight, piece, None, _Failure(exc, input_fault=False))
            return None

    def _done(self, request: ov.InferRequest, key: int) -> None:
        flight, piece, inputs, _feeds = self._started.pop(key)
        try:
            logits = request.get_output_tensor(0).data[: len(piece)].copy()  # the padding's rows left out
        except Exception as exc:  # noqa: BLE001  on OpenVINO's thread: the callers hear of it, the thread goes on
            self._answer(flight, piece, None, _Failure(exc, input_fault=False))
            return
        rows = _Rows.of(logits, inputs)
        batch = Batch(inputs, rows.probabilities, request.latency / 1000)  # device time, not queueing
        self._answer(flight, piece, rows, None, batch)

    def _answer(self, flight: _Flight, piece: list[Item], rows: _Rows | None, failure: _Failure | None,
                batch: Batch | None = None) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._deliver, flight, piece, rows, failure, batch)

    def _observe(self, batch: Batch) -> None:
        try:
            self.on_batch(batch)
        except Exception:
            log.exception("recording a batch failed")

    def _deliver(self, flight: _Flight, piece: list[Item], rows: _Rows | None, failure: _Failure | None,
                 batch: Batch | None = None) -> None:
        if failure is not None and len(piece) > 1:  # try each example alone, so only the guilty one fails
            log.warning("a batch of %d examples failed (%s: %s); trying them one by one", len(piece),
                        type(failure.error).__name__, failure.error)
            flight.pieces += len(piece) - 1
            for item in piece:
                self._work.put((flight, [item]))
            return
        self._in_flight -= len(piece)
        flight.pieces -= 1
        if not flight.pieces:
            self._batches -= 1
            self._slot_freed.set()
        for row, (request, index) in enumerate(piece):
            if request.future.done():
                continue
            if failure is not None:
                request.future.set_exception(_refusal(failure, index, self._images))
                continue
            request.rows[index], request.truncated[index] = rows.probabilities[row], rows.truncated[row]
            request.remaining -= 1
            if not request.remaining:
                request.future.set_result(request.answer())
        if batch is not None:  # after the callers' wake-ups, so that recording it is nobody's wait
            asyncio.get_running_loop().call_soon(self._observe, batch)


def _padded(feeds: dict[str, np.ndarray], multiple: int) -> dict[str, np.ndarray]:
    """Feeds with rows of zeros added up to a multiple of rows. Each of the throughput engine's streams keeps
    kernels and buffers for every input shape it has seen, never given back: a server that had seen 256 shapes
    (batches of 1 to 16 texts, 16 lengths) held 190 MB more at rest; batches under load are nearly all full anyway."""
    rows = len(next(iter(feeds.values())))
    missing = -rows % multiple
    if not missing:
        return feeds
    return {name: np.concatenate([feed, np.zeros((missing, *feed.shape[1:]), feed.dtype)])
            for name, feed in feeds.items()}


def _trim_heap() -> None:
    """Give the pages freed in the C heap back to the system (glibc's malloc_trim): the buffers a burst of batches
    left, once released, would otherwise stay resident, a few tens of MB of the server's memory at rest."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _glibc()  # None where malloc is not glibc's: nothing to trim


def _truncated(inputs: words.Read | pixels.Seen) -> list[bool]:
    """Which examples the model's window cut short: texts longer than it; never an image."""
    if isinstance(inputs, pixels.Seen):
        return [False] * len(inputs.sides)
    return inputs.truncated


def _refusal(failure: _Failure, index: int, images: bool) -> ServeError:
    """What the caller of an example that failed alone hears: never the example, nor the library's words (those go
    to the log)."""
    if failure.input_fault and images:
        return BadRequest(f"instance {index} cannot be decoded as an image (it may be truncated or damaged)",
                          hint="send the image file as it was saved")
    if failure.input_fault:
        return BadRequest(f"instance {index} cannot be tokenised", hint="send it as plain text, or leave it out")
    log.error("the model failed on one example (instance %d of its request): %s: %s", index,
              type(failure.error).__name__, failure.error)
    return ServeError("the model failed on this request", hint="retry later; the server's log says why")


def _pieces(batch: list[Item]) -> list[list[Item]]:
    """The batch sorted by text length and cut where long texts are much longer than their piece's shortest."""
    ordered = sorted(batch, key=lambda item: len(item[0].examples[item[1]]))
    pieces: list[list[Item]] = []
    for item in ordered:
        length = len(item[0].examples[item[1]])
        shortest = len(pieces[-1][0][0].examples[pieces[-1][0][1]]) if pieces else 0
        if pieces and (length <= SPLIT_FLOOR or length <= SPLIT_RATIO * shortest):
            pieces[-1].append(item)
        else:
            pieces.append([item])
    return pieces
