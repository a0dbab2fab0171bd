"""What the server serves: compiled model versions, and the routes that send traffic to them.

A worker thread owns the store (SQLite connections stay on the thread that made them)
and polls it: the `production` and `candidate` aliases, the canary share and the API
keys. A version that should serve and is not loaded yet is decrypted into memory,
compiled, warmed up and given a smoke inference on that thread; only then does the
event loop swap the route to it, in one assignment, so a request is answered by the
old version or the new one and never by neither. The old version's batcher drains
before it is dropped. A version that fails to load leaves the previous one serving.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from appliance import inference, pixels, registry, store
from appliance.access import auth
from appliance.core.config import Settings
from appliance.core.errors import ApplianceError, BadRequest, ModelNotFound, Overloaded, PayloadTooLarge, ServeError
from appliance.core.text import surrogate_at
from appliance.registry import feedback, usage
from appliance.serve import access, drift
from appliance.serve.batching import Batch, Batcher
from appliance.serve.metrics import Metrics
from appliance.serve.web import status_of
from appliance.store import alerts, audit, blobs, events

log = logging.getLogger(__name__)
T = TypeVar("T")
PURGE_EVERY_S = 3600.0  # predictions past their keeping time are deleted this often
QUALITY_EVERY_S = 10.0  # live accuracy on feedback is read from the store this often
ACTOR = "service:serve"  # who the server's own audit records name


@dataclass(eq=False)  # identity: a route compares the very versions it holds
class Loaded:
    """One model version compiled and warm, with its batcher and its live drift window (when it has a reference)."""

    model: str
    version: int
    variant: str
    servable: inference.Servable
    batcher: Batcher
    window: drift.Window | None  # None: no reference to compare with
    drift_scores: dict[str, float] = field(default_factory=dict)  # PSI per feature of the last full window
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def labels(self) -> list[str]:
        return self.servable.labels

    @property
    def pictures(self) -> pixels.Pictures | None:
        """What it takes when it classifies images; None for a text model."""
        reader = self.servable.reader
        return reader if isinstance(reader, pixels.Pictures) else None


@dataclass(frozen=True)
class Answer:
    """What the server answers a request with: the version that answered and, per example, every label's
    probability, the prediction id feedback names it by (empty when predictions are not kept) and whether the
    model's window cut it short."""

    loaded: Loaded
    probabilities: np.ndarray
    prediction_ids: list[str]
    truncated: list[bool]

    @property
    def labels(self) -> list[str]:
        """The most likely label of each example."""
        return [self.loaded.labels[i] for i in self.probabilities.argmax(axis=1)]


@dataclass(frozen=True)
class Route:
    """Where a model's traffic goes: production, and a share of it to a candidate."""

    production: Loaded
    candidate: Loaded | None = None
    canary_percent: float = 0.0

    def pick(self) -> Loaded:
        if self.candidate is not None and random.random() * 100 < self.canary_percent:
            return self.candidate
        return self.production

    def versions(self) -> list[Loaded]:
        return [self.production] + ([self.candidate] if self.candidate else [])

    def role(self, loaded: Loaded) -> str:
        return "candidate" if loaded is self.candidate else "production"


class Runtime:
    """Loads what the registry says should serve, keeps it current, and routes requests."""

    def __init__(self, settings: Settings, metrics: Metrics, passphrase: str | None = None) -> None:
        self.settings, self.metrics = settings, metrics
        self.routes: dict[str, Route] = {}
        self.keys: list[auth.ApiKey] = []
        self.started = False  # the store opened and what should serve was read (and loaded) once
        self.diverged: str | None = None  # how the audit log left its anchor, while it does: nothing is served
        self._passphrase = passphrase
        self._worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        self._store: store.Store | None = None
        self._failed: set[tuple[str, int]] = set()  # versions that would not load: not retried until moved
        self._wanted: dict[str, registry.Deployment] = {}
        self._poller: asyncio.Task[None] | None = None
        self._verifier: auth.Verifier | None = None
        self.predictions = feedback.PredictionLog() if settings.serve.keep_predictions_days > 0 else None
        self._waiting: dict[str, int] | None = None  # sealed bytes of predictions waiting for a label, per model
        self._purged_at = 0.0
        self._quality_at = 0.0
        self.usage = usage.Meter()  # requests per model and caller, written at each poll

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store and load what should serve; the server is ready when this returns."""
        self._store = await self._on_worker(store.open, self.settings, self._passphrase)
        await self.sync()
        self.started = True  # not sooner: with nothing read yet, "every wanted model serves" holds vacuously
        self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> None:
        if self._poller:
            self._poller.cancel()
        for route in list(self.routes.values()):
            for loaded in route.versions():
                await loaded.batcher.close()
        if self._store is not None:
            try:
                await self._on_worker(self._flush)  # every id handed out can still get its label
            finally:
                await self._on_worker(self._store.close)
        self._worker.shutdown(wait=True)

    @property
    def ready(self) -> bool:
        """Started, and every model that should serve is serving its wanted versions."""
        return self.started and self.diverged is None and all(self.model_ready(model) for model in self._wanted)

    def model_ready(self, model: str, version: int | None = None) -> bool:
        """Whether the model serves its wanted versions; or, given a version, whether that version serves now."""
        if version is not None:
            return model in self.routes and any(loaded.version == version for loaded in self.routes[model].versions())
        route, wanted = self.routes.get(model), self._wanted.get(model)
        if route is None or wanted is None:
            return False
        return route.production.version == wanted.production or (model, wanted.production) in self._failed

    # -- requests ----------------------------------------------------------------------------

    async def predict(self, model: str, examples: list[str] | list[bytes | np.ndarray], caller: str = "-",
                      allowed: Callable[[str], bool] | None = None, version: int | None = None,
                      inline: bool = False, keep: bool = True) -> Answer:
        """The answer to examples (texts, or images for an image model) from the version the model's route picks
        (or from `version`, when it serves), counted in the metrics and usage, and kept for feedback (unless `keep`
        is false: a prediction tried from the console).

        Each request is checked on its own before it joins a batch, so one bad example fails its request alone;
        `allowed` says which models a 404's hint may name; `inline` is the batcher's (an HTTP request, or a gRPC call
        alone).
        """
        loaded = self.route(model, allowed).pick() if version is None else self.serving(model, version, allowed)
        serve = self.settings.serve
        if loaded.pictures is not None:
            check_images(examples, loaded.pictures, serve.max_instances)
        else:
            check_texts(examples, serve.max_instances, serve.max_text_chars)
        access.note(model=f"{model}:{loaded.version}")
        started = time.perf_counter()
        try:
            inferred = await loaded.batcher.infer(examples, inline)
        except ServeError as exc:
            status = status_of(type(exc))
            if status >= 500 and not isinstance(exc, Overloaded):  # the version failed: counted against it
                self.metrics.request(model, loaded.version, status)
                exc.counted = True  # type: ignore[attr-defined]
            raise
        elapsed = time.perf_counter() - started
        self.metrics.request(model, loaded.version, 200, elapsed)
        self.usage.count(model, caller, elapsed)
        ids = ([""] * len(examples) if self.predictions is None or not keep
               else self.predictions.add(model, loaded.version, loaded.labels, inferred.probabilities, examples))
        return Answer(loaded, inferred.probabilities, ids, inferred.truncated)

    async def record_feedback(self, items: list[tuple[str, str]], actor: str,
                              allowed: Callable[[str], bool] | None = None, source: str = "api") -> dict[str, Any]:
        """True labels for predictions (of the models `allowed` admits); what waits in memory is written first."""
        def work() -> dict[str, Any]:
            self._flush_predictions()
            return feedback.record(self._store, items, actor=actor, source=source, allowed=allowed)

        return await self._on_worker(work)

    def describe(self) -> list[dict[str, Any]]:
        """What serves now, model by model: readiness, what it takes (texts or images), the canary share, and each
        loaded version."""
        described = []
        for model in sorted(set(self._wanted) | set(self.routes)):
            route = self.routes.get(model)
            versions = []
            for loaded in route.versions() if route else []:
                candidate = loaded is route.candidate
                share = route.canary_percent / 100 if candidate else 1 - route.canary_percent / 100
                versions.append({"version": loaded.version, "role": route.role(loaded),
                                 "variant": loaded.variant, "traffic_share": share,
                                 "queue_depth": loaded.batcher.depth, "drift_psi": dict(loaded.drift_scores)})
            takes = "images" if route and route.production.pictures is not None else "texts"
            described.append({"model": model, "ready": self.model_ready(model), "takes": takes,
                              "canary_percent": route.canary_percent if route else 0.0, "versions": versions})
        return described

    def expects(self, model: str) -> bool:
        """Whether the model serves, or the registry says it should (it may still be loading)."""
        return model in self.routes or model in self._wanted

    def route(self, model: str, allowed: Callable[[str], bool] | None = None) -> Route:
        """The model's route, or not_found()."""
        route = self.routes.get(model)
        if route is None:
            raise self.not_found(model, allowed)
        return route

    def takes_images(self, model: str) -> bool:
        """Whether the model serves an image model, whose requests hold photos: a larger body limit of their own."""
        route = self.routes.get(model)
        return route is not None and route.production.pictures is not None

    def require(self, model: str, version: int | None, allowed: Callable[[str], bool] | None = None
                ) -> pixels.Pictures | None:
        """A 404 unless the model serves (and, given a version, that version of it): before any body work. What an
        image model takes (its production's, or the version's), to read the body by; None for a text model."""
        loaded = self.route(model, allowed).production if version is None else self.serving(model, version, allowed)
        return loaded.pictures

    def serving(self, model: str, version: int, allowed: Callable[[str], bool] | None = None) -> Loaded:
        """A version of the model that serves now (production or candidate), or a 404 naming those that do."""
        route = self.route(model, allowed)
        for loaded in route.versions():
            if loaded.version == version:
                return loaded
        serving = ", ".join(f"{loaded.version} ({route.role(loaded)})" for loaded in route.versions())
        raise ModelNotFound(f"version {version} of {model!r} is not being served",
                            hint=f"versions serving now: {serving}; 'appliance deploy' serves another")

    def not_found(self, model: str, allowed: Callable[[str], bool] | None = None) -> ModelNotFound:
        """The 404 for a model that does not serve, naming the served models `allowed` admits (all when None)."""
        served = ", ".join(name for name in sorted(self.routes) if allowed is None or allowed(name)) or "none"
        return ModelNotFound(f"no model named {model!r} is being served",
                             hint=f"served models{' this key may call' if allowed else ''}: {served}")

    def authorize(self, token: str | None, model: str | None) -> auth.ApiKey:
        """The API key of a request, checked against the keys read at the last poll."""
        if self.diverged is not None:  # the keys it holds may be ones the rewind brought back: trust none
            raise ServeError(f"serving stopped: {self.diverged}", hint=audit.REWIND_HINT)
        if self._verifier is None:
            raise auth.Unauthenticated("the server has not read its API keys yet")
        key = self._verifier.verify(token, model)
        access.note(key=key.id)
        return key

    # -- keeping up with the registry ----------------------------------------------------------

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.settings.serve.poll_s)
            try:
                await self.sync()
                await self._on_worker(self._keep_records)
            except Exception:
                log.exception("reading the registry failed; serving goes on with what is loaded")

    async def sync(self) -> None:
        """Read the wanted state; load and swap in what changed; drain what left.

        A store whose audit log no longer reaches its anchor (cut, or an older copy put back) is read no further:
        the server answers nothing but 503 until the rewind is accepted or a verified backup restored.
        """
        diverged = await self._on_worker(audit.divergence, self._store)
        if diverged != self.diverged:
            (log.error if diverged else log.warning)("serving %s: %s", "stops" if diverged else "resumes",
                                                     diverged or "the audit log agrees with its anchor again")
        self.diverged = diverged
        if diverged:
            return
        wanted, verifier = await self._on_worker(self._read_wanted, self._verifier)
        self._verifier, self._wanted = verifier, wanted
        for model, want in wanted.items():
            current = self.routes.get(model)
            production = await self._get(model, want.production, current)
            if production is None:
                continue
            candidate = None
            if want.candidate is not None and want.candidate != want.production and want.canary_percent > 0:
                candidate = await self._get(model, want.candidate, current)
            route = Route(production, candidate, want.canary_percent if candidate else 0.0)
            if route != current:
                self.routes[model] = route  # the swap: one assignment on the event loop
                await self._retire(current, route)
        for model in set(self.routes) - set(wanted):  # no production alias any more
            await self._retire(self.routes.pop(model), None)

    async def _get(self, model: str, version: int, current: Route | None) -> Loaded | None:
        """The loaded version: already serving, or loaded now; None if it will not load."""
        for loaded in current.versions() if current else []:
            if loaded.version == version:
                return loaded
        if (model, version) in self._failed:
            return current.production if current else None
        try:
            servable, reference = await self._on_worker(self._load, model, version)
        except ApplianceError as exc:
            self._failed.add((model, version))
            still = f"{model}:{current.production.version} keeps serving" if current else f"nothing serves {model}"
            log.error("model %s:%s did not load, so %s: %s", model, version, still, exc.message)
            await self._on_worker(self._audit, "serve.load_failed", f"{model}:{version}", {"error": exc.message})
            return current.production if current else None
        window = drift.Window(reference, self.settings.serve.drift_window) if reference else None
        loaded = Loaded(model, version, servable.manifest["variant"], servable,
                        Batcher.serving(servable, self.settings.serve), window)
        loaded.batcher.on_batch = lambda batch: self._observe(loaded, batch)
        loaded.batcher.start()
        log.info("model %s:%s (%s) is loaded and warm", model, version, loaded.variant)
        return loaded

    async def _retire(self, old: Route | None, new: Route | None) -> None:
        """Drain and drop the versions of old that new no longer uses."""
        keep = {id(loaded) for loaded in new.versions()} if new else set()
        for loaded in old.versions() if old else []:
            if id(loaded) not in keep:
                await loaded.batcher.close()
                self.metrics.forget(loaded.model, loaded.version)

    # -- on the store thread ---------------------------------------------------------------

    async def _on_worker(self, work: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._worker, work, *args)

    def _read_wanted(self, previous: auth.Verifier | None) -> tuple[dict[str, registry.Deployment], auth.Verifier]:
        """Which versions should serve, and the API keys; notes when the previous keys were last used."""
        if previous is not None:
            auth.record_use(self._store, previous)
        return registry.deployments(self._store), auth.verifier(self._store)

    def _load(self, model: str, version: int) -> tuple[inference.Servable, drift.Histograms | None]:
        """Decrypt the chosen variant into memory, compile, warm up and check one inference."""
        entry = registry.get(self._store, f"{model}:{version}")
        servable = inference.load_ir(blobs.read(self._store, entry.serving_variant().blob_id), throughput=True)
        logits = inference.predict(servable.compiled, servable.reader, warm_up(servable.reader))
        if logits.shape != (2, len(servable.labels)) or not np.isfinite(logits).all():
            raise ModelNotFound(f"{entry.ref} failed its smoke inference (logits {logits.shape})")
        stored = servable.manifest.get("reference")
        return servable, drift.Histograms.from_json(stored) if stored else None

    def _keep_records(self) -> None:
        """Write what was counted and answered since the last poll; now and then, forget old predictions and
        update the live accuracy in the metrics."""
        self._flush()
        now = time.monotonic()
        if self.predictions is not None and now - self._purged_at > PURGE_EVERY_S:
            self._purged_at = now
            gone = feedback.purge(self._store, self.settings.serve.keep_predictions_days)
            if gone:
                log.info("%d predictions older than %g days without feedback deleted", gone,
                         self.settings.serve.keep_predictions_days)
            self._waiting = feedback.waiting_bytes(self._store)  # labels and erasures since the last count
        if now - self._quality_at > QUALITY_EVERY_S:
            self._quality_at = now
            self.metrics.quality(feedback.quality(self._store))

    def _flush(self) -> None:
        """Write the two in-memory buffers: the predictions answered and the usage counted."""
        self._flush_predictions()
        self.usage.flush(self._store)

    def _flush_predictions(self) -> None:
        """Write the answered predictions, then keep each model's waiting ones under serve.keep_predictions_mb.

        The size is a running count (read once, then added to at each write), so no write scans the table; labels
        and erasures only make it high until the hourly recount, which at worst trims a little early.
        """
        if self.predictions is None:
            return
        if self._waiting is None:
            self._waiting = feedback.waiting_bytes(self._store)
        limit = int(self.settings.serve.keep_predictions_mb * 2**20)
        for model, written in self.predictions.flush(self._store).items():
            self._waiting[model] = self._waiting.get(model, 0) + written
            if self._waiting[model] > limit:
                self._waiting[model] -= feedback.trim(self._store, model, self._waiting[model] - limit,
                                                      actor=ACTOR, limit_bytes=limit)
        self.metrics.predictions_dropped.set(self.predictions.dropped)

    def _audit(self, action: str, obj: str, details: dict[str, Any]) -> None:
        audit.record(self._store, action, obj, actor=ACTOR, **details)

    def _alert_drift(self, loaded: Loaded, details: dict[str, Any]) -> None:
        """On the record, to whoever watches the events, and as an alert until an operator has seen it."""
        version = f"{loaded.model}:{loaded.version}"
        self._audit("serve.drift_alert", version, details)
        events.emit(self._store, "drift", loaded.model, "alert", {"version": version, **details})
        alerts.raise_alert(self._store, "drift", loaded.model, "warning",
                           f"{version}: what it is sent has drifted from what it learnt ({details['feature']} PSI "
                           f"{details['psi']:.2f}, above {details['threshold']:g}); check the inputs, or retrain "
                           "on recent labelled data")

    # -- monitoring (on the event loop, once a batch's answers have gone) ------------------------

    def _observe(self, loaded: Loaded, batch: Batch) -> None:
        self.metrics.batch(loaded.model, loaded.version, batch.size, batch.seconds)
        if loaded.window is None:
            return
        with loaded.lock:
            scores = loaded.window.add(batch.inputs, batch.probabilities)
        if scores is None:
            return
        loaded.drift_scores = scores
        self.metrics.drift(loaded.model, loaded.version, scores)
        worst = max(scores, key=scores.get)
        if scores[worst] > self.settings.serve.drift_threshold:
            details = {"feature": worst, "psi": round(scores[worst], 4), "threshold": self.settings.serve.drift_threshold}
            self._worker.submit(self._alert_drift, loaded, details)


def warm_up(reader: inference.Reader) -> list[str] | list[bytes]:
    """Two examples a model is warmed up and smoke-tested on before it serves: texts, or a grey and a striped
    image."""
    if not isinstance(reader, pixels.Pictures):
        return ["warm up", "a second, longer warm-up text"]
    grey = np.full((reader.size, reader.size, 3), 128, dtype=np.uint8)
    striped = np.zeros((reader.size * 2, reader.size, 3), dtype=np.uint8)
    striped[::8] = 255
    return [pixels.encoded(grey), pixels.encoded(striped)]


def check_images(images: list[bytes | np.ndarray], reader: pixels.Pictures, max_instances: int) -> None:
    """Refuse a request whose images could not all be answered (too many, too large, not an image, a prepared
    input of the wrong shape), naming the first bad one by index. Decoding is the batch's: one that fails there
    fails its request alone."""
    _check_count(len(images), "images", max_instances)
    for index, image in enumerate(images):
        if isinstance(image, str):
            raise BadRequest(f"instance {index} is text, and this model classifies images",
                             hint="send the image's file bytes (base64 in JSON)")
        if isinstance(image, np.ndarray):
            reader.check_prepared(image, f"instance {index}")
        else:
            pixels.admitted(image, f"instance {index}")


def check_texts(texts: list[str], max_instances: int, max_chars: int) -> None:
    """Refuse a request whose texts could not all be answered, naming the first bad one by index, never its text."""
    _check_count(len(texts), "texts", max_instances)
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise BadRequest(f"instance {index} is not text, and this model classifies texts",
                             hint="send the texts as strings")
        if not text.strip():
            raise BadRequest(f"instance {index} is empty or only whitespace", hint="send text to classify, or leave it out")
        if len(text) > max_chars:
            raise PayloadTooLarge(f"instance {index} holds {len(text)} characters; at most {max_chars} are allowed",
                                  hint="send a shorter text: the model reads only the beginning of one")
        if (at := surrogate_at(text)) is not None:
            raise BadRequest(f"instance {index} is not valid Unicode text (a lone surrogate at character {at})",
                             hint="send UTF-8 text; a \\uD800-\\uDFFF escape in JSON must be one of a pair")


def _check_count(count: int, kind: str, max_instances: int) -> None:
    if not count:
        raise BadRequest(f"the request holds no {kind}", hint=f"send at least one of the {kind} to classify")
    if count > max_instances:
        raise BadRequest(f"the request holds {count} {kind}; at most {max_instances} are allowed",
                         hint="split it into several requests")
