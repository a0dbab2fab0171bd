"""Prometheus metrics of the inference server, labelled by model and version.

One registry per server (not the process-wide default), so two servers in one
process, as in tests, do not share counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def quantile_s(before: list[float], after: list[float], q: float) -> tuple[float, int]:
    """The bucket bound under which a share q of the requests between two latency_counts() fell, and their number.

    Requests slower than the last bound count as twice that bound: enough to say "too slow".
    """
    total = after[-1] - before[-1]
    for bound, old, new in zip(LATENCY_BUCKETS, before, after, strict=False):
        if new - old >= q * total:
            return bound, int(total)
    return 2 * LATENCY_BUCKETS[-1], int(total)


class Metrics:
    """The server's counters, histograms and gauges, and their text exposition."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("appliance_requests_total", "Requests answered, by model, version and status.",
                                ["model", "version", "status"], registry=self.registry)
        self.latency = Histogram("appliance_request_seconds", "Time to answer an inference request.",
                                 ["model", "version"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("appliance_batch_size", "Texts per inference.", ["model", "version"],
                                    buckets=BATCH_BUCKETS, registry=self.registry)
        self.batch_seconds = Histogram("appliance_batch_seconds", "Time of one inference on the device.",
                                       ["model", "version"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.queue_depth = Gauge("appliance_queue_depth", "Texts accepted and not yet answered.",
                                 ["model", "version"], registry=self.registry)
        self.drift_psi = Gauge("appliance_drift_psi", "Population stability index of the last full window.",
                               ["model", "version", "feature"], registry=self.registry)
        self.traffic = Gauge("appliance_traffic_share", "Share of a model's traffic each version gets (0-1).",
                             ["model", "version"], registry=self.registry)

    def request(self, model: str, version: int | None, status: int, seconds: float | None = None) -> None:
        labels = (model, str(version) if version is not None else "", str(status))
        self.requests.labels(*labels).inc()
        if seconds is not None and version is not None:
            self.latency.labels(model, str(version)).observe(seconds)

    def batch(self, model: str, version: int, texts: int, seconds: float) -> None:
        self.batch_size.labels(model, str(version)).observe(texts)
        self.batch_seconds.labels(model, str(version)).observe(seconds)

    def drift(self, model: str, version: int, scores: dict[str, float]) -> None:
        for feature, value in scores.items():
            self.drift_psi.labels(model, str(version), feature).set(value)

    def forget(self, model: str, version: int) -> None:
        """A version left service: its gauges go, its counters stay (they only ever grow)."""
        for gauge in (self.queue_depth, self.traffic):
            try:
                gauge.remove(model, str(version))
            except KeyError:
                pass

    def latency_counts(self) -> list[float]:
        """Requests so far at or under each latency bound, all models together (cumulative); the last is all."""
        counts = [0.0] * (len(LATENCY_BUCKETS) + 1)
        for metric in self.latency.collect():
            for sample in metric.samples:
                if sample.name.endswith("_bucket"):
                    bound = float(sample.labels["le"])
                    counts[LATENCY_BUCKETS.index(bound) if bound in LATENCY_BUCKETS else -1] += sample.value
        return counts

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
